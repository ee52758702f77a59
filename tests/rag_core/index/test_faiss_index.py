"""Building shard indexes (the auto rule, training, recall against exact search) and publishing versions."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import re
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rag_core.index.faiss_index import (
    AUTO_MAX_DEPTH,
    FAST_SCAN_LISTS_PER_SQRT,
    IndexBuildError,
    IndexConfig,
    build_shard_index,
    build_tuned_shard,
    choose_factory,
    coarse_fingerprint,
    deserialize_index,
    fast_scan_bytes,
    fast_scan_factory,
    fast_scan_falls_short,
    ivf_lists,
    needs_training,
    serialize_index,
    TrainedIndex,
    train_version_index,
    sha256_hex,
    train_index,
)
from rag_core.index.retention import delete_version
from rag_core.index.version_names import IndexVersionError, new_version_id
from rag_core.index.versions import (
    ShardPayload,
    latest_version,
    list_versions,
    publish_version,
    read_manifest,
    write_shard,
)
from rag_core.storage import Store
from tests.helpers.vectors import clustered_vectors, exact_topk, recall_at

FIELDS = {"dim": 64, "metric": "ip", "factory": "Flat", "encoder": {"name": "test"}, "gates": {"recall": 1.0}}


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """20k base vectors and 200 held-out queries from the same clusters (64-d), with the exact top-10."""
    x = clustered_vectors(20_200, 64, seed=1)
    base, queries = x[:20_000], x[20_000:]
    return base, queries, exact_topk(base, queries, 10)


# -- the auto rule -------------------------------------------------------------


def test_choose_factory_across_sizes_and_budgets() -> None:
    assert choose_factory(5_000, 384) == "Flat"  # small: exact is as fast
    assert choose_factory(200_000, 384) == "HNSW32"  # no budget: the paper's index
    assert choose_factory(2_000_000, 384, recall_target=0.999) == "Flat"  # exactness asked for
    n, d = 1_000_000, 384
    assert choose_factory(n, d, n * (4 * d + 300)) == "HNSW32"
    assert choose_factory(n, d, n * (4 * d + 100)) == "HNSW32_SQ8"  # Flat would fit, but n is large
    assert choose_factory(n, d, n * 700) == "HNSW32_SQ8"
    assert choose_factory(n, d, n * 450) == "IVF4096,SQ8"  # 4*sqrt(1M) = 4000 -> 4096 lists
    assert choose_factory(n, d, n * 70) == "OPQ48,IVF4096,PQ48"
    assert choose_factory(n, d, n * 25) == "OPQ8,IVF4096,PQ8"
    assert choose_factory(n, 100, n * 40) == "OPQ24_120,IVF4096,PQ24"  # OPQ maps d=100 to a multiple of m
    with pytest.raises(IndexBuildError, match="raise memory_budget_bytes"):
        choose_factory(n, d, n * 8)
    # the family follows the whole index; the IVF lists follow one shard and its training set
    assert choose_factory(4_000_000, d, 4_000_000 * 450, shard_vectors=250_000) == "IVF2048,SQ8"
    assert choose_factory(4_000_000, d, 4_000_000 * 450, shard_vectors=250_000, train_vectors=20_000) == "IVF512,SQ8"


def test_auto_for_a_sharded_version_sizes_ivf_lists_for_the_whole() -> None:
    n, d = 200_000, 384
    config = IndexConfig()
    # no budget: fast-scan lists for the whole, which shards loaded together search as one index
    assert config.resolve_factory(50_000, d, total_vectors=n, shards=4) == "IVF512,PQ192x4fs,RFlat"  # sqrt(200k) lists
    assert config.resolve_factory(n, d) == "HNSW32"  # one shard: the paper's graph
    assert config.resolve_factory(2_000, d, total_vectors=8_000, shards=4) == "Flat"  # small: exact
    fits_no_graph = IndexConfig(memory_budget_bytes=n * (4 * d + 200))  # raw vectors and codes, not HNSW32's links
    assert fits_no_graph.resolve_factory(50_000, d, total_vectors=n, shards=4) == "IVF512,PQ192x4fs,RFlat"
    assert fits_no_graph.resolve_factory(n, d) == "HNSW32_SQ8"
    few = IndexConfig(train_sample=900)  # too few rows to train 4-bit codes: the graph
    assert few.resolve_factory(50_000, d, total_vectors=n, shards=4) == "HNSW32"
    assert fast_scan_factory(ivf_lists(n, per_sqrt=FAST_SCAN_LISTS_PER_SQRT), d) == "IVF512,PQ192x4fs,RFlat"
    assert fast_scan_bytes(d) == 192 / 2 + 4 * d + 8 and fast_scan_factory(64, 33) == "IVF64,PQ33x4fs,RFlat"
    tight = IndexConfig(memory_budget_bytes=n * 500)
    assert tight.resolve_factory(50_000, d, total_vectors=n, shards=4) == "IVF2048,SQ8"  # together: 4*sqrt(200k)
    assert tight.resolve_factory(50_000, d, total_vectors=n) == "IVF1024,SQ8"  # trained apart: 4*sqrt(50k)
    assert ivf_lists(30_000, 30_000, per_sqrt=16, min_train=8) == 2048 and ivf_lists(30_000, 30_000) == 512


def test_shards_filling_one_trained_index_share_its_coarse_quantizer(data) -> None:
    base, queries, truth = data
    config = IndexConfig(factory="IVF64_HNSW32,Flat", tune_queries=100, train_sample=5_000)
    assert needs_training(config.factory, 64) and not needs_training("HNSW32", 64) and not needs_training("Flat", 64)
    trained = train_index(base, config)
    again = train_index(base, config)  # a seeded sample: the same centroids on every run
    assert coarse_fingerprint(again.index) == coarse_fingerprint(trained.index) is not None
    built = [build_tuned_shard(base[a:a + 5_000], config, shard_id=s, trained=trained)
             for s, a in enumerate(range(0, 20_000, 5_000))]
    assert trained.index.ntotal == 0  # each shard filled a copy
    assert {r["coarse_sha256"] for _, r in built} == {coarse_fingerprint(trained.index)}
    # the version's nprobe, tuned once on the sample (the one index's lists), not per shard
    nprobe = faiss.downcast_index(trained.index).nprobe
    assert {r["search"]["nprobe"] for _, r in built} == {nprobe} and nprobe > 1
    alone = faiss.clone_index(trained.index)
    alone.add(base)
    assert recall_at(alone.search(queries, 10)[1], truth) >= 0.9  # the whole at that nprobe
    assert [i.ntotal for i, _ in built] == [5_000] * 4
    apart = build_tuned_shard(base[:5_000], config)[1]  # trained on its own rows: other centroids, not named
    assert "coarse_sha256" not in apart and coarse_fingerprint(built[0][0]) != coarse_fingerprint(
        build_shard_index(base[:5_000], config))
    assert coarse_fingerprint(build_shard_index(base[:100], IndexConfig(factory="HNSW32"))) is None
    with pytest.raises(IndexBuildError, match="trained 'IVF64_HNSW32,Flat' index holds 0 vectors of dimension 64"):
        build_tuned_shard(base[:100, :32], config.model_copy(update={"factory": "IVF64_HNSW32,Flat"}),
                          trained=trained)
    filled = faiss.clone_index(trained.index)
    filled.add(base[:10])
    with pytest.raises(IndexBuildError, match="holds 10 vectors"):
        build_tuned_shard(base[:100], config, trained=type(trained)(trained.factory, filled))
    with pytest.raises(IndexBuildError, match="factory string 'NoSuchIndex'"):
        needs_training("NoSuchIndex", 64)


def test_ivf_lists_are_powers_of_two_with_enough_training_points() -> None:
    assert ivf_lists(1_000_000) == 4096
    assert ivf_lists(20_000) == 512
    assert ivf_lists(20_000, 5_000) == 128  # at most 5000 / 39 lists
    assert ivf_lists(10) == 1


def test_resolve_factory_keeps_explicit_strings() -> None:
    assert IndexConfig(factory="IVF64,Flat").resolve_factory(10**6, 64) == "IVF64,Flat"
    assert IndexConfig().resolve_factory(20_000, 64) == "HNSW32"
    assert IndexConfig().resolve_factory(5_000, 64, total_vectors=400_000) == "HNSW32"


# -- building ------------------------------------------------------------------


def test_flat_shard_is_exact(data) -> None:
    base, queries, truth = data
    index = build_shard_index(base[:5000], IndexConfig(factory="Flat"))
    assert index.ntotal == 5000 and index.metric_type == faiss.METRIC_INNER_PRODUCT
    assert np.array_equal(index.search(queries, 10)[1], exact_topk(base[:5000], queries, 10))
    l2 = build_shard_index(base[:5000], IndexConfig(factory="Flat", metric="l2"))
    assert l2.metric_type == faiss.METRIC_L2
    assert np.array_equal(l2.search(queries, 10)[1], exact_topk(base[:5000], queries, 10, "l2"))


def test_hnsw_and_auto_reach_the_recall_target(data) -> None:
    base, queries, truth = data
    config = IndexConfig()  # auto, no budget: HNSW32 at 20k vectors
    assert config.resolve_factory(len(base), base.shape[1]) == "HNSW32"
    index, report = build_tuned_shard(base, config)
    assert index.ntotal == len(base)
    assert faiss.downcast_index(index).hnsw.efSearch == report["search"]["efSearch"]
    assert recall_at(index.search(queries, 10)[1], truth) >= 0.95
    # a budget below HNSW32's 4d + 272 bytes/vector: the graph over 8-bit codes
    squeezed = IndexConfig(memory_budget_bytes=len(base) * 400)
    assert squeezed.resolve_factory(len(base), 64) == "HNSW32_SQ8"
    assert recall_at(build_shard_index(base, squeezed).search(queries, 10)[1], truth) >= 0.95


def test_ivf_training_uses_a_seeded_sample_and_sets_nprobe(data) -> None:
    base, queries, truth = data
    config = IndexConfig(memory_budget_bytes=len(base) * 100, train_sample=5_000, seed=3)
    factory = config.resolve_factory(len(base), 64)
    assert factory == "IVF128,SQ8"  # lists capped by 5000 training vectors / 39
    index, report = build_tuned_shard(base, config)
    assert faiss.extract_index_ivf(index).nprobe == report["search"]["nprobe"]
    assert recall_at(index.search(queries, 10)[1], truth) >= 0.9
    again = build_shard_index(base, config)
    assert serialize_index(again) == serialize_index(index)  # same sample, same centroids, same tuning
    wide = build_shard_index(base, config.model_copy(update={"nprobe": 64}))
    assert faiss.extract_index_ivf(wide).nprobe == 64
    assert recall_at(wide.search(queries, 10)[1], truth) >= 0.95


def test_separate_training_vectors(data) -> None:
    base, queries, _ = data
    index = build_shard_index(base[:1000], IndexConfig(factory="IVF16,Flat"), train_vectors=base[1000:4000])
    assert index.ntotal == 1000 and index.is_trained


def test_bad_inputs_are_clear_errors(data) -> None:
    base, _, _ = data
    with pytest.raises(IndexBuildError, match="factory string 'NoSuchIndex'"):
        build_shard_index(base[:100], IndexConfig(factory="NoSuchIndex"))
    with pytest.raises(IndexBuildError, match=r"\[n, d\] array"):
        build_shard_index(base[0], IndexConfig())
    with pytest.raises(IndexBuildError, match="training 'IVF256,Flat' on 100 vectors failed"):
        build_shard_index(base[:100], IndexConfig(factory="IVF256,Flat"))
    with pytest.raises(IndexBuildError, match="dimension 32, vectors 64"):
        build_shard_index(base[:100], IndexConfig(factory="IVF4,Flat"), train_vectors=base[:100, :32])


def test_empty_shard_and_serialization_round_trip(data) -> None:
    base, queries, _ = data
    empty = build_shard_index(np.zeros((0, 64), np.float32), IndexConfig(factory="HNSW32"))
    assert empty.ntotal == 0 and empty.d == 64
    index = build_shard_index(base[:3000], IndexConfig(factory="HNSW32", ef_search=77))
    data_bytes = serialize_index(index)
    back = deserialize_index(data_bytes)
    assert faiss.downcast_index(back).hnsw.efSearch == 77  # search params travel with the index
    assert np.array_equal(back.search(queries, 5)[1], index.search(queries, 5)[1])
    assert sha256_hex(data_bytes) == sha256_hex(serialize_index(back))


# -- efConstruction --------------------------------------------------------------


def test_ef_construction_is_set_before_add(overlapping) -> None:
    base, queries, truth = overlapping
    recalls = {}
    for ef in (8, 128):
        config = IndexConfig(factory="HNSW8", ef_construction=ef, ef_search=16, tune_queries=100)
        index, report = build_tuned_shard(base, config)
        assert faiss.downcast_index(index).hnsw.efConstruction == ef == report["ef_construction"]
        back = deserialize_index(serialize_index(index))
        assert faiss.downcast_index(back).hnsw.efConstruction == ef
        recalls[ef] = recall_at(index.search(queries, 10)[1], truth)
    assert recalls[128] > recalls[8] + 0.05  # a better graph at the same efSearch: it was used while adding
    assert IndexConfig().ef_construction > 40  # above FAISS's default


# -- versions ------------------------------------------------------------------


def _shards(base: np.ndarray, sizes: list[int]) -> list[ShardPayload]:
    out, start = [], 0
    for size in sizes:
        index = build_shard_index(base[start:start + size], IndexConfig(factory="Flat"))
        ids = [f"p{i}" for i in range(start, start + size)]
        table = pa.table({"passage_id": ids, "title": [f"T{i}" for i in range(start, start + size)],
                          "text": [f"text {i}" for i in range(start, start + size)]})
        out.append(ShardPayload(serialize_index(index), table, {"factory": "Flat"}))
        start += size
    return out


def test_version_ids_sort_by_time() -> None:
    early = new_version_id(dt.datetime(2026, 11, 30, 11, 45, 1, 5_000, tzinfo=dt.timezone.utc))
    later = new_version_id(dt.datetime(2026, 11, 30, 11, 45, 1, 17_000, tzinfo=dt.timezone.utc))
    late = new_version_id(dt.datetime(2026, 12, 2, 0, 0, 0, tzinfo=dt.timezone.utc))
    assert re.fullmatch(r"20261130T114501\.005Z-[0-9a-f]{8}", early) and early < later < late


def test_publish_writes_files_manifest_and_latest(tmp_path: Path, data) -> None:
    base, _, _ = data
    store = Store(str(tmp_path / "store"))
    assert list_versions(store) == [] and latest_version(store) is None
    shards = _shards(base, [300, 200])
    v1 = publish_version(store, shards, FIELDS)
    assert list_versions(store) == [v1] and latest_version(store) == v1
    manifest = read_manifest(store)
    assert manifest["version"] == v1 and manifest["count"] == 500 and manifest["encoder"] == {"name": "test"}
    assert manifest["dim"] == 64 and manifest["metric"] == "ip" and manifest["gates"] == {"recall": 1.0}
    entry = manifest["shards"][1]
    assert entry["url"] == "shard-00001.faiss" and entry["count"] == 200 and entry["meta"] == {"factory": "Flat"}
    root = store.child("indexes", v1)
    assert entry["sha256"] == sha256_hex(root.read_bytes(entry["url"])) == sha256_hex(shards[1].index_bytes)
    ids = pq.read_table(io.BytesIO(root.read_bytes(entry["ids_url"])))
    assert ids.column_names == ["passage_id", "title", "text"] and ids.column("passage_id")[0].as_py() == "p300"
    # a second version moves LATEST; the first stays readable
    v2 = publish_version(store, [(shards[0].index_bytes, [f"p{i}" for i in range(300)])], FIELDS)
    assert list_versions(store) == [v1, v2] and latest_version(store) == v2
    assert read_manifest(store, v1)["count"] == 500 and read_manifest(store)["shards"][0]["columns"] == ["passage_id"]


def test_a_version_is_invisible_until_its_manifest_is_written(tmp_path: Path, data) -> None:
    base, _, _ = data
    store = Store(str(tmp_path))
    v1 = publish_version(store, _shards(base, [100]), FIELDS)
    half = new_version_id()
    write_shard(store, half, 0, _shards(base, [50])[0])  # a publisher that died before its manifest
    assert list_versions(store) == [v1] and latest_version(store) == v1
    with pytest.raises(IndexVersionError, match=f"version {half} not found; available: {v1}"):
        read_manifest(store, half)
    delete_version(store, half)  # leftovers are removable
    assert store.child("indexes").list() == [v1, "LATEST"]


def test_publish_refuses_bad_manifests(tmp_path: Path, data) -> None:
    base, _, _ = data
    store = Store(str(tmp_path))
    shards = _shards(base, [10])
    with pytest.raises(IndexVersionError, match="need dim"):
        publish_version(store, shards, {"dim": 64, "metric": "cosine", "factory": "Flat"})
    with pytest.raises(IndexVersionError, match="may not set"):
        publish_version(store, shards, {**FIELDS, "shards": []})
    with pytest.raises(IndexVersionError, match="not an index version name"):
        write_shard(store, "../escape", 0, shards[0])
    assert latest_version(store) is None and list_versions(store) == []


def test_delete_version(tmp_path: Path, data) -> None:
    base, _, _ = data
    store = Store(str(tmp_path))
    v1 = publish_version(store, _shards(base, [10]), FIELDS)
    v2 = publish_version(store, _shards(base, [20]), FIELDS)
    with pytest.raises(IndexVersionError, match="LATEST points at it"):
        delete_version(store, v2)
    delete_version(store, v1)
    assert list_versions(store) == [v2] and not store.exists("indexes", v1)
    with pytest.raises(IndexVersionError, match=f"not found; available: {v2}"):
        delete_version(store, v1)
    v3 = publish_version(store, _shards(base, [30]), FIELDS)
    delete_version(store, v3, force=True)  # LATEST falls back to the newest other version
    assert latest_version(store) == v2
    delete_version(store, v2, force=True)
    assert latest_version(store) is None and list_versions(store) == []


def test_auto_keeps_fast_scan_for_a_sharded_version_whose_vectors_allow_it() -> None:
    clustered = clustered_vectors(12_000, 32, seed=3, clusters=60)  # like real embeddings: codes separate them
    trained = train_version_index(clustered, IndexConfig(tune_queries=300), total_vectors=12_000, shards=4)
    assert trained.factory == "IVF128,PQ16x4fs,RFlat" and not fast_scan_falls_short(trained, 0.95)
    assert trained.report["recall_at_10"] >= 0.95 and 4 <= trained.report["search"]["k_factor_rf"] <= AUTO_MAX_DEPTH
    alike = (np.random.default_rng(0).normal(size=32) + 0.1 * np.random.default_rng(1).normal(size=(12_000, 32)))
    alike = (alike / np.linalg.norm(alike, axis=1, keepdims=True)).astype(np.float32)  # a random encoder's
    assert train_version_index(alike, IndexConfig(tune_queries=300), total_vectors=12_000, shards=4).factory == "HNSW32"
    asked = IndexConfig(factory="IVF128,PQ16x4fs,RFlat", tune_queries=300)  # a factory asked for is kept
    assert train_version_index(alike, asked, total_vectors=12_000, shards=4).factory == asked.factory
    # the rule: some depth up to AUTO_MAX_DEPTH reaches the target (tuning may keep a deeper one, for headroom)
    def tuned(depth: int, tried: dict[int, float], recall: float = 0.97) -> TrainedIndex:
        report = {**trained.report, "recall_at_10": recall, "search": {"nprobe": 7, "k_factor_rf": depth},
                  "tried_depth": {str(d): r for d, r in tried.items()}}
        return dataclasses.replace(trained, report=report)
    assert not fast_scan_falls_short(tuned(128, {32: 0.96, 64: 0.97, 128: 0.98}), 0.95)
    assert fast_scan_falls_short(tuned(128, {32: 0.90, 64: 0.94, 128: 0.98}), 0.95)
    assert fast_scan_falls_short(tuned(16, {8: 0.96, 16: 0.98}, recall=0.93), 0.95)  # nprobe never got there
