"""Build-time tuning of efSearch / nprobe: held-out recall against exact search, the cheapest setting, its report."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from rag_core.index.faiss_index import (
    IndexConfig,
    build_shard_index,
    build_tuned_shard,
    deserialize_index,
    serialize_index,
    shard_tuning_queries,
)
from rag_core.index.tuning import (
    DEPTH_HEADROOM,
    K_FACTOR_LADDER,
    apply_search_setting,
    heldout_recall,
    search_ladder,
    set_search_params,
    tuning_queries,
)
from tests.helpers.vectors import clustered_vectors, recall_at


@pytest.mark.parametrize("factory, name", [("HNSW8", "efSearch"), ("IVF64,Flat", "nprobe")])
def test_tuning_picks_the_cheapest_setting_that_reaches_the_target(overlapping, factory: str, name: str) -> None:
    base, queries, truth = overlapping
    config = IndexConfig(factory=factory, ef_construction=16, tune_queries=400, seed=2)
    index, report = build_tuned_shard(base, config, shard_id=3)
    chosen = report["search"][name]
    assert report["factory"] == factory
    # an exhaustive sweep over the same ladder and tuning queries, every value measured
    rows, moved = shard_tuning_queries(base, config, shard_id=3)
    ladder = search_ladder(index)[1]
    sweep = {}
    for value in ladder:
        set_search_params(index, **{name: value})
        sweep[value] = heldout_recall(index, base, rows, queries=moved).mean()
    reaching = [v for v in ladder if sweep[v] >= config.recall_target]
    assert chosen == reaching[0]
    assert ladder.index(chosen) >= 2  # a real choice: the cheaper settings miss the target here
    assert report["recall_at_10"] == pytest.approx(sweep[chosen], abs=1e-4)
    assert sweep[chosen] >= config.recall_target
    assert set(report["tried"]) == {str(v) for v in ladder[:ladder.index(chosen) + 1]}  # stopped at the first
    assert report["queries"] == 400 and report["qps"] > 0 and report["threads"] >= 1
    # the setting holds on fresh queries from the same data, and travels with the index
    set_search_params(index, **{name: chosen})
    assert recall_at(index.search(queries, 10)[1], truth) >= config.recall_target
    if name == "nprobe":  # IVF is deterministic: a rebuild tunes to the same value, saved in the file
        again = deserialize_index(serialize_index(build_shard_index(base, config, shard_id=3)))
        assert faiss.extract_index_ivf(again).nprobe == chosen


def test_a_refined_index_tunes_its_rerank_depth_to_how_coarse_its_codes_are(overlapping) -> None:
    """4-bit codes of 2 dimensions lose much of a 32-d vector: re-ranking 4 candidates per result, every list
    scanned, misses the target, so tuning goes deeper, then finds the cheapest nprobe at that depth."""
    base, queries, truth = overlapping
    config = IndexConfig(factory="IVF64,PQ16x4fs,RFlat", tune_queries=400, seed=2)
    index, report = build_tuned_shard(base, config, shard_id=3)
    refine, ivf = faiss.downcast_index(index), faiss.extract_index_ivf(index)
    depth, nprobe = report["search"]["k_factor_rf"], report["search"]["nprobe"]
    assert refine.k_factor == depth and ivf.nprobe == nprobe
    tried = {int(d): r for d, r in report["tried_depth"].items()}
    goal = config.recall_target + DEPTH_HEADROOM * (1 - config.recall_target)
    assert list(tried) == list(K_FACTOR_LADDER[:len(tried)]) and depth == list(tried)[-1]  # shallowest first
    assert tried[depth] >= goal > max(r for d, r in tried.items() if d < depth)  # the first leaving headroom
    assert tried[4] < config.recall_target and depth > 4  # a fixed depth of 4 could not reach it at all
    assert nprobe < ivf.nlist and report["recall_at_10"] >= config.recall_target  # nprobe traded the headroom
    assert recall_at(index.search(queries, 10)[1], truth) >= config.recall_target  # holds on fresh queries
    again = deserialize_index(serialize_index(index))  # the depth travels with the index ...
    assert faiss.downcast_index(again).k_factor == depth
    apply_search_setting(again, {"search": {"nprobe": 3, "k_factor_rf": 2}})  # ... and a manifest's setting wins
    assert faiss.downcast_index(again).k_factor == 2 and faiss.extract_index_ivf(again).nprobe == 3
    for tampered in ({"k_factor_rf": 10**6}, {"nprobe": 0}, {"efSearch": "96"}, {"max_codes": 5}):
        with pytest.raises(ValueError, match="outside what tuning stores"):  # it would size every search's buffers
            apply_search_setting(again, {"search": tampered})
    assert faiss.downcast_index(again).k_factor == 2
    # a depth and an nprobe the caller fixes are measured, not tuned
    _, fixed = build_tuned_shard(base, IndexConfig(factory="IVF64,PQ16x4fs,RFlat", nprobe=24, tune_queries=400,
                                                   seed=2), shard_id=3)
    assert fixed["search"]["nprobe"] == 24 and list(fixed["tried"]) == ["24"]
    fixed_tried = {int(d): r for d, r in fixed["tried_depth"].items()}
    reaching = [d for d, r in fixed_tried.items() if r >= config.recall_target]
    assert reaching and fixed["search"]["k_factor_rf"] == reaching[0] == list(fixed_tried)[-1]  # no headroom asked


def test_queries_moved_away_from_their_passages_ask_for_a_wider_search(overlapping) -> None:
    base, _, _ = overlapping
    settings = {}
    for cosine in (1.0, 0.3):
        config = IndexConfig(factory="IVF64,Flat", tune_queries=400, tune_query_cosine=cosine)
        settings[cosine] = build_tuned_shard(base, config)[1]["search"]["nprobe"]
    assert settings[0.3] > settings[1.0]  # a passage as it is finds its own inverted list at once


def test_tuning_queries_are_seeded_and_at_the_cosine_asked() -> None:
    x = clustered_vectors(1_000, 16, seed=4) * np.linspace(0.5, 2.0, 1_000, dtype=np.float32)[:, None]
    rows, queries = tuning_queries(x, 50, 0.3, [0, 0, 1])
    assert len(rows) == 50 and np.array_equal(rows, np.sort(rows))
    cos = (queries * x[rows]).sum(1) / np.linalg.norm(queries, axis=1) / np.linalg.norm(x[rows], axis=1)
    assert np.allclose(cos, 0.3, atol=1e-5)
    assert np.allclose(np.linalg.norm(queries, axis=1), np.linalg.norm(x[rows], axis=1), rtol=1e-5)  # norm kept
    again = tuning_queries(x, 50, 0.3, [0, 0, 1])
    assert np.array_equal(again[0], rows) and np.array_equal(again[1], queries)
    assert not np.array_equal(tuning_queries(x, 50, 0.3, [0, 1, 1])[0], rows)  # another shard, other rows
    same_rows, unmoved = tuning_queries(x, 50, 1.0, [0, 0, 1])
    assert np.array_equal(same_rows, rows) and np.array_equal(unmoved, x[rows])
    assert np.array_equal(tuning_queries(x[:30], 50, 0.3, 0)[0], np.arange(30))  # a small shard: every row
    config = IndexConfig(tune_queries=50, tune_query_cosine=0.3)
    assert np.array_equal(shard_tuning_queries(x, config, 0)[0], rows)
    assert not np.array_equal(shard_tuning_queries(x, IndexConfig(tune_queries=50, seed=1), 0)[0], rows)


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_heldout_recall_against_a_plain_reference(overlapping, metric: str) -> None:
    base, _, _ = overlapping
    x = base[:2_000]
    index = build_shard_index(x, IndexConfig(factory="HNSW8", metric=metric, ef_construction=8, ef_search=10,
                                             tune_queries=20))
    rows, queries = tuning_queries(x, 100, 0.5, 7)
    got = heldout_recall(index, x, rows, 10, metric, queries=queries)

    def score(q: np.ndarray, r: int) -> float:
        return float(q @ x[r]) if metric == "ip" else -float(((q - x[r]) ** 2).sum())

    found = index.search(queries, 11)[1]
    for i, (row, q) in enumerate(zip(rows, queries)):
        exact = sorted((score(q, r) for r in range(len(x)) if r != row), reverse=True)
        returned = [r for r in found[i] if r >= 0 and r != row][:10]
        want = sum(score(q, r) >= exact[9] - 1e-5 for r in returned) / 10
        assert got[i] == pytest.approx(want)
    assert 0.2 < got.mean() < 1.0  # efSearch 10 on a sparse graph: misses happen and are counted


def test_a_fixed_or_unreachable_setting_is_measured_and_reported(overlapping) -> None:
    base, _, _ = overlapping
    fixed = IndexConfig(factory="HNSW8", ef_construction=16, ef_search=10, tune_queries=300)
    index, report = build_tuned_shard(base, fixed)
    assert report["search"] == {"efSearch": 10} and list(report["tried"]) == ["10"]
    assert report["recall_at_10"] < fixed.recall_target  # too narrow here; a recall gate would refuse it
    assert faiss.downcast_index(index).hnsw.efSearch == 10
    _, flat = build_tuned_shard(base, IndexConfig(factory="Flat", tune_queries=300))
    assert flat == {"factory": "Flat"}  # exact: nothing to tune, nothing for search to apply


def test_apply_search_setting_sets_what_the_manifest_stores(overlapping) -> None:
    base, _, _ = overlapping
    index = build_shard_index(base[:2_000], IndexConfig(factory="IVF16,Flat", nprobe=2, tune_queries=50))
    apply_search_setting(index, {"factory": "IVF16,Flat", "search": {"nprobe": 5}})
    assert faiss.extract_index_ivf(index).nprobe == 5
    apply_search_setting(index, None)  # a shard published without tuning keeps its own setting
    apply_search_setting(index, {"factory": "IVF16,Flat"})
    assert faiss.extract_index_ivf(index).nprobe == 5
