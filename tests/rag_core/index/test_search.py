"""Sharded search: the merge against exact search, loading versions from local and S3 stores, bad input."""

from __future__ import annotations

import uuid
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pytest

import rag_core.index.versions as index_versions
from rag_core.index.faiss_index import (
    IndexConfig,
    build_shard_index,
    build_tuned_shard,
    coarse_fingerprint,
    serialize_index,
    set_search_params,
    train_index,
)
from rag_core.index.retention import delete_version
from rag_core.index.search import (
    QUERIES_PER_THREAD,
    Hit,
    QueryError,
    ShardedIndex,
    batch_threads,
    check_dim,
    merge_topk,
    search_shard,
    single_ranked,
    thread_plan,
)
from rag_core.index.version_names import IndexVersionError
from rag_core.index.versions import (
    CorruptShardError,
    ShardPayload,
    latest_version,
    list_versions,
    publish_version,
    read_index_manifest,
    verify_version,
)
from rag_core.storage import Store
from tests.conftest import S3Server
from tests.helpers.vectors import clustered_vectors, exact_topk, recall_at

DIM = 64
SIZES = [700, 1300, 1000, 1000]  # four shards of unequal size


@pytest.fixture(scope="module")
def corpus() -> tuple[np.ndarray, np.ndarray, pa.Table]:
    x = clustered_vectors(4_000 + 50, DIM, seed=7, clusters=40)
    ids = [f"passage-{i}" for i in range(4_000)]
    table = pa.table({"passage_id": ids, "title": [f"Title {i}" for i in range(4_000)],
                      "text": [f"Text of passage {i}." for i in range(4_000)]})
    return x[:4_000], x[4_000:], table


def _split(base: np.ndarray, table: pa.Table, config: IndexConfig) -> tuple[list[faiss.Index], list[pa.Table]]:
    bounds = np.cumsum([0, *SIZES])
    indexes = [build_shard_index(base[a:b], config) for a, b in zip(bounds[:-1], bounds[1:])]
    return indexes, [table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]


def _publish(store: Store, base: np.ndarray, table: pa.Table, metric: str = "ip") -> str:
    indexes, tables = _split(base, table, IndexConfig(factory="Flat", metric=metric))
    shards = [ShardPayload(serialize_index(i), t) for i, t in zip(indexes, tables)]
    return publish_version(store, shards, {"dim": DIM, "metric": metric, "factory": "Flat", "encoder": {"n": "t"}})


# -- the merge -----------------------------------------------------------------


def test_merge_topk_orders_ties_and_pads() -> None:
    scores = [np.array([[0.9, 0.5]]), np.array([[0.9, 0.7]]), np.array([[0.8, -3e38]])]
    rows = [np.array([[4, 1]]), np.array([[2, 0]]), np.array([[3, -1]])]  # shard 2 had one result
    top, shards, got = merge_topk(scores, rows, 4)
    assert shards.tolist() == [[0, 1, 2, 1]] and got.tolist() == [[4, 2, 3, 0]]
    assert np.allclose(top, [[0.9, 0.9, 0.8, 0.7]])
    top, shards, got = merge_topk(scores, rows, 7)  # more than the five real results
    assert got.tolist() == [[4, 2, 3, 0, 1, -1, -1]] and shards[0, 5:].tolist() == [-1, -1]
    assert np.isneginf(top[0, 5:]).all()
    dist, shards, got = merge_topk([np.array([[1.0, 2.0]]), np.array([[1.0, 1.5]])],
                                   [np.array([[5, 6]]), np.array([[7, 8]])], 3, larger_is_better=False)
    assert got.tolist() == [[5, 7, 8]] and shards.tolist() == [[0, 1, 1]] and dist.tolist() == [[1.0, 1.0, 1.5]]
    with pytest.raises(QueryError, match="k must be at least 1"):
        merge_topk(scores, rows, 0)


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_flat_shards_merged_equal_one_flat_index(corpus, metric: str) -> None:
    base, queries, table = corpus
    sharded = ShardedIndex(*_split(base, table, IndexConfig(factory="Flat", metric=metric)), metric=metric)
    single = faiss.IndexFlatIP(DIM) if metric == "ip" else faiss.IndexFlatL2(DIM)
    single.add(base)
    want_scores, want_rows = single.search(queries, 10)
    scores, shards, rows = sharded.search_rows(queries, 10)
    offsets = np.cumsum([0, *SIZES])[:-1]
    assert np.array_equal(offsets[shards] + rows, want_rows)  # the same passages, in the same order
    assert np.allclose(scores, want_scores if metric == "ip" else -want_scores, atol=1e-5)
    hits = sharded.search(queries, 10)
    assert [h.passage_id for h in hits[0]] == [f"passage-{i}" for i in want_rows[0]]
    assert all(a.score >= b.score for q in hits for a, b in zip(q, q[1:]))  # higher is better for both metrics


@pytest.fixture(scope="module")
def hnsw_split(corpus) -> tuple[list[faiss.Index], list[pa.Table]]:
    base, _, table = corpus
    return _split(base, table, IndexConfig(factory="HNSW32", tune_queries=200))


def test_sharded_hnsw_recall_and_ties(corpus, hnsw_split) -> None:
    base, queries, table = corpus
    sharded = ShardedIndex(*hnsw_split, max_workers=4)
    truth = exact_topk(base, queries, 10)
    _, shards, rows = sharded.search_rows(queries, 10)
    assert recall_at(np.cumsum([0, *SIZES])[:-1][shards] + rows, truth) >= 0.95
    sharded.set_search_params(ef_search=24)
    assert {faiss.downcast_index(index).hnsw.efSearch for index in sharded.shards} == {24}
    # the same vector in two shards: equal scores, the lower shard first, on every run
    twin = ShardedIndex(*_split(np.concatenate([base[:700]] * 2 + [base[:2600]]), table, IndexConfig(factory="Flat")))
    first = twin.search(base[:3], 2)
    assert [[h.shard for h in q] for q in first] == [[0, 1]] * 3 and first == twin.search(base[:3], 2)


def test_query_dimension_and_k_are_checked(corpus) -> None:
    base, queries, table = corpus
    sharded = ShardedIndex(*_split(base, table, IndexConfig(factory="Flat")))
    with pytest.raises(QueryError, match="dimension 32 but the index has dimension 64"):
        sharded.search(queries[:, :32], 5)
    with pytest.raises(QueryError, match="positive integer"):
        sharded.search(queries, 0)
    assert check_dim(queries[0], DIM).shape == (1, DIM)  # one vector is one query
    assert len(sharded.search(queries[0], 3)[0]) == 3


# -- IVF shards sharing one coarse quantizer ---------------------------------------

IVF = IndexConfig(factory="IVF32,Flat", tune_queries=100)


def _ivf_split(base: np.ndarray, *, together: bool) -> tuple[list[faiss.Index], list[dict], faiss.Index | None]:
    """The four shards of SIZES as IVF indexes, trained once on all rows (``together``) or each on its own;
    with ``together`` also one index over all rows filled from the same trained index."""
    bounds = np.cumsum([0, *SIZES])
    trained = train_index(base, IVF) if together else None
    built = [build_tuned_shard(base[a:b], IVF, shard_id=s, trained=trained)
             for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    whole = None
    if trained is not None:
        whole = faiss.clone_index(trained.index)
        whole.add(base)
    return [i for i, _ in built], [r for _, r in built], whole


def _each_shard_searched(shards: list[faiss.Index], queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The merge of every shard searched on its own, as a search without a shared quantizer does it."""
    found = [search_shard(index, queries, k) for index in shards]
    scores, shard, rows = merge_topk([d for d, _ in found], [r for _, r in found], k)
    return scores, np.cumsum([0, *SIZES])[:-1][shard] + rows


@pytest.mark.parametrize("nprobe", [1, 3, 8])
def test_shards_trained_together_return_one_index_top_k(corpus, nprobe: int) -> None:
    base, queries, table = corpus
    shards, reports, whole = _ivf_split(base, together=True)
    assert len({r["coarse_sha256"] for r in reports}) == 1 == len(set(map(coarse_fingerprint, [*shards, whole])))
    sharded = ShardedIndex(shards, [table.slice(a, n) for a, n in zip(np.cumsum([0, *SIZES]), SIZES)])
    assert sharded.coarse is not None
    sharded.set_search_params(nprobe=nprobe)
    set_search_params(whole, nprobe=nprobe)
    want_scores, want_rows = whole.search(queries, 10)
    scores, shard, rows = sharded.search_rows(queries, 10)
    # the shards' lists partition the one index's: at the same nprobe, its passages in its order
    assert np.array_equal(np.cumsum([0, *SIZES])[:-1][shard] + rows, want_rows)
    assert np.allclose(scores, want_scores, atol=1e-5)
    # and the one coarse search gives what each shard's own search gives
    own_scores, own_rows = _each_shard_searched(shards, queries, 10)
    assert np.array_equal(own_rows, want_rows) and np.allclose(own_scores, scores, atol=1e-5)


def test_each_shard_scans_its_own_nprobe_after_the_shared_coarse_search(corpus) -> None:
    base, queries, table = corpus
    shards, _, _ = _ivf_split(base, together=True)
    for s, index in enumerate(shards):  # settings tuned apart differ: one coarse search ranks for the widest
        set_search_params(index, nprobe=[2, 6, 1, 4][s])
    sharded = ShardedIndex(shards, [table.slice(a, n) for a, n in zip(np.cumsum([0, *SIZES]), SIZES)])
    scores, shard, rows = sharded.search_rows(queries, 10)
    own_scores, own_rows = _each_shard_searched(shards, queries, 10)
    assert np.array_equal(np.cumsum([0, *SIZES])[:-1][shard] + rows, own_rows)
    assert np.allclose(scores, own_scores, atol=1e-5)


def test_shards_trained_apart_are_each_searched_whole(corpus) -> None:
    base, queries, table = corpus
    shards, reports, _ = _ivf_split(base, together=False)
    assert all("coarse_sha256" not in r for r in reports) and len(set(map(coarse_fingerprint, shards))) == 4
    sharded = ShardedIndex(shards, [table.slice(a, n) for a, n in zip(np.cumsum([0, *SIZES]), SIZES)])
    assert sharded.coarse is None  # their list numbers name different cells: no coarse search can serve them all
    scores, shard, rows = sharded.search_rows(queries, 10)
    own_scores, own_rows = _each_shard_searched(shards, queries, 10)
    assert np.array_equal(np.cumsum([0, *SIZES])[:-1][shard] + rows, own_rows)


def test_a_version_of_shards_trained_together_round_trips(tmp_path: Path, corpus) -> None:
    base, queries, table = corpus
    store = Store(str(tmp_path))
    shards, reports, whole = _ivf_split(base, together=True)
    bounds = np.cumsum([0, *SIZES])
    payloads = [ShardPayload(serialize_index(i), table.slice(a, n), r) for i, r, a, n in zip(shards, reports, bounds,
                                                                                              SIZES)]
    version = publish_version(store, payloads, {"dim": DIM, "metric": "ip", "factory": reports[0]["factory"]})
    verify_version(store, version)  # every file's sha256, as for any version
    manifest = read_index_manifest(store, version)
    assert {e.meta["coarse_sha256"] for e in manifest.shards} == {coarse_fingerprint(whole)}
    loaded = ShardedIndex.load(store, version)
    assert loaded.merged and len(loaded.shards) == 1 and loaded.num_shards == len(SIZES) == len(manifest.shards)
    assert loaded.ntotal == sum(SIZES)
    assert {faiss.extract_index_ivf(loaded.shards[0]).nprobe} == {r["search"]["nprobe"] for r in reports}
    in_memory = ShardedIndex(shards, [table.slice(a, n) for a, n in zip(bounds, SIZES)])
    assert in_memory.coarse is not None and not in_memory.merged  # handed in, not owned: searched shard by shard
    assert loaded.search(queries, 10) == in_memory.search(queries, 10)


def test_fast_scan_shards_trained_together_search_as_their_one_index(corpus) -> None:
    """auto's factory for a sharded version: 4-bit PQ lists re-ranked on the raw vectors, trained once."""
    base, queries, table = corpus
    config = IndexConfig(factory="IVF32,PQ32x4fs,RFlat", tune_queries=100)
    trained = train_index(base[:4_000], config)
    depth = faiss.downcast_index(trained.index).k_factor  # tuned on the sample, saved with it
    bounds = np.cumsum([0, *SIZES])
    built = [build_tuned_shard(base[a:b], config, shard_id=s, trained=trained)
             for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    shards = [index for index, _ in built]
    whole = faiss.clone_index(trained.index)
    whole.add(base[:4_000])
    want_scores, want = whole.search(queries, 10)
    tables = [table.slice(a, n) for a, n in zip(bounds, SIZES)]

    apart = ShardedIndex(shards, tables)  # shard by shard: each re-ranks its own best depth x 10
    scores, shard, rows = apart.search_rows(queries, 10)
    assert apart.coarse is not None
    # each shard's candidates include its share of the one index's: never a worse top-10
    assert (scores >= want_scores - 1e-5).all()
    exact = np.sort(base[:4_000] @ queries.T, axis=0)[::-1][:10].T
    assert (scores <= exact + 1e-5).all()  # re-ranked on the raw vectors: true inner products

    deeper = [faiss.clone_index(i) for i in shards]
    faiss.downcast_index(deeper[2]).k_factor = depth + 1  # a shard republished deeper: the merged index keeps it
    assert faiss.downcast_index(ShardedIndex(deeper, tables, merge=True).shards[0]).k_factor == depth + 1
    merged = ShardedIndex([faiss.clone_index(i) for i in shards], tables, merge=True)
    scores, shard, rows = merged.search_rows(queries, 10)
    assert merged.merged and merged.num_shards == 4 and merged.ntotal == 4_000
    assert faiss.downcast_index(merged.shards[0]).k_factor == depth
    assert np.array_equal(np.where(rows >= 0, bounds[:-1][shard] + rows, -1), want)  # the one index's rows
    assert np.allclose(scores, want_scores, atol=1e-5)
    hit = merged.search(queries[:1], 10)[0][0]  # rows map back to their shard's passages
    assert hit.passage_id == f"passage-{want[0, 0]}" and hit.shard == int(np.searchsorted(bounds, want[0, 0], "right") - 1)


def test_one_index_ranking_is_kept_only_where_the_merge_would_return_it(corpus) -> None:
    base, queries, _ = corpus
    for metric, faiss_metric in (("ip", faiss.METRIC_INNER_PRODUCT), ("l2", faiss.METRIC_L2)):
        index = faiss.IndexFlat(DIM, faiss_metric)
        index.add(base[:2_000])
        distances, rows = index.search(queries, 10)
        kept = single_ranked(distances, rows, 10)
        merged, shards, merged_rows = merge_topk([distances], [rows], 10, larger_is_better=metric == "ip")
        assert kept is not None and np.array_equal(kept[1], merged_rows) and np.array_equal(kept[0], merged)
        assert (shards == 0).all()
    tied = np.array([[0.9, 0.8, 0.8]], np.float32), np.array([[5, 9, 2]])  # the merge puts row 2 before row 9
    assert single_ranked(*tied, 3) is None and merge_topk([tied[0]], [tied[1]], 3)[2].tolist() == [[5, 2, 9]]
    assert single_ranked(np.array([[0.9, -3e38]], np.float32), np.array([[5, -1]]), 2) is None  # one missing
    assert single_ranked(np.array([[0.9, 0.8]], np.float32), np.array([[5, 6]]), 3) is None  # fewer than k


# -- threads --------------------------------------------------------------------


def test_thread_plan_never_oversubscribes_the_cores() -> None:
    assert thread_plan(4, 2) == (2, 1)  # shards >= cores: one FAISS thread per shard search
    assert thread_plan(2, 16) == (2, 8)  # few shards, many cores: the cores shared out
    assert thread_plan(1, 8) == (1, 8)
    assert thread_plan(4, 2, max_workers=1) == (1, 2)  # one shard after another, every core each
    assert thread_plan(4, 2, max_workers=4) == (4, 1)  # asked for more searches than cores: one thread each
    for shards in range(1, 9):
        for cores in range(1, 17):
            workers, threads = thread_plan(shards, cores)
            assert workers * threads <= cores and workers <= shards


def test_batch_threads_follow_the_batch_size() -> None:
    assert batch_threads(1, 8) == 1  # one query: FAISS's threads would only wait for each other
    assert batch_threads(QUERIES_PER_THREAD - 1, 8) == 1
    assert batch_threads(3 * QUERIES_PER_THREAD, 8) == 3
    assert batch_threads(10**6, 8) == 8


def test_search_threads_hold_inside_the_workers(corpus, hnsw_split) -> None:
    _, few, _ = corpus
    queries = np.tile(few, (4, 1))  # 200 queries: enough for 3 FAISS threads
    indexes, tables = hnsw_split
    before = faiss.omp_get_max_threads()
    layouts = {(None, 2): [1] * 4, (1, 2): [2] * 4, (None, 8): [2] * 4, (2, 6): [3] * 4}
    results = []
    for (max_workers, threads), want in layouts.items():
        sharded = ShardedIndex(indexes, tables, max_workers=max_workers, threads=threads)
        results.append(sharded.search_rows(queries, 10))
        assert sharded.faiss_threads == want  # read by faiss.omp_get_max_threads() in the searching thread
        sharded.search_rows(queries[:1], 10)
        assert sharded.faiss_threads == [1] * 4  # a single query runs on one thread
        sharded.close()
    assert faiss.omp_get_max_threads() == before  # the caller's own setting is left alone
    for got in results[1:]:  # the same results in every layout
        assert all(np.array_equal(a, b) for a, b in zip(got[1:], results[0][1:]))


# -- published versions ---------------------------------------------------------


def _round_trip(store: Store, corpus) -> None:
    base, queries, table = corpus
    version = _publish(store, base, table)
    loaded = ShardedIndex.load(store)
    assert loaded.version == version and loaded.ntotal == 4_000 and loaded.dim == DIM
    assert loaded.manifest["encoder"] == {"n": "t"}
    in_memory = ShardedIndex(*_split(base, table, IndexConfig(factory="Flat")))
    assert loaded.search(queries, 5) == in_memory.search(queries, 5)
    hit = loaded.search(base[1234], 1)[0][0]
    assert hit == Hit("passage-1234", "Title 1234", "Text of passage 1234.", hit.score, 1)
    assert hit.score == pytest.approx(1.0, abs=1e-5)
    assert ShardedIndex.load(store, version).version == version
    newer = _publish(store, base[::-1].copy(), table)
    delete_version(store, version)
    assert list_versions(store) == [newer] and latest_version(store) == newer


def test_publish_and_load_on_a_local_store(tmp_path: Path, corpus) -> None:
    _round_trip(Store(str(tmp_path / "store")), corpus)


def test_the_setting_tuned_at_build_is_applied_on_load(tmp_path: Path, corpus) -> None:
    base, queries, table = corpus
    store = Store(str(tmp_path))
    bounds = np.cumsum([0, *SIZES])
    payloads, reports = [], []
    for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        index, report = build_tuned_shard(base[a:b], IndexConfig(factory="HNSW32", tune_queries=100), shard_id=s)
        reports.append(report)
        set_search_params(index, efSearch=10)  # the file says 10; the manifest's meta must win
        meta = {**report, "search": {"efSearch": 40 + s}} if s < 3 else {"factory": "HNSW32"}  # shard 3: none
        payloads.append(ShardPayload(serialize_index(index), table.slice(a, b - a), meta))
    version = publish_version(store, payloads, {"dim": DIM, "metric": "ip", "factory": "HNSW32"})
    loaded = ShardedIndex.load(store, version)
    assert [faiss.downcast_index(i).hnsw.efSearch for i in loaded.shards] == [40, 41, 42, 10]
    assert loaded.manifest["shards"][0]["meta"]["recall_at_10"] == reports[0]["recall_at_10"]


def test_publish_and_load_on_s3(s3_server: S3Server, corpus) -> None:
    _round_trip(Store(f"s3://{s3_server.bucket}/search-{uuid.uuid4().hex[:8]}", s3_server.options()), corpus)


def test_ids_only_versions_have_no_titles(tmp_path: Path, corpus) -> None:
    base, queries, _ = corpus
    store = Store(str(tmp_path))
    index = build_shard_index(base[:100], IndexConfig(factory="Flat", metric="l2"))
    publish_version(store, [(serialize_index(index), [f"id{i}" for i in range(100)])],
                    {"dim": DIM, "metric": "l2", "factory": "Flat"})
    hit = ShardedIndex.load(store).search(base[7], 1)[0][0]
    assert (hit.passage_id, hit.title, hit.text) == ("id7", None, None) and hit.score == pytest.approx(0.0, abs=1e-5)


def test_a_failed_publish_leaves_the_previous_version_latest(tmp_path: Path, corpus, monkeypatch) -> None:
    base, queries, table = corpus
    store = Store(str(tmp_path))
    v1 = _publish(store, base, table)
    real_write_shard = index_versions.write_shard

    def dies_on_shard_2(store, version, shard, payload):
        if shard == 2:
            raise OSError("disk full")
        return real_write_shard(store, version, shard, payload)

    monkeypatch.setattr(index_versions, "write_shard", dies_on_shard_2)
    with pytest.raises(OSError, match="disk full"):
        _publish(store, base, table)
    assert latest_version(store) == v1 and list_versions(store) == [v1]
    assert ShardedIndex.load(store).version == v1  # a reader during (or after) the failed rebuild sees v1
    monkeypatch.setattr(index_versions, "write_shard", real_write_shard)
    monkeypatch.setattr(index_versions, "move_latest", lambda *a: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError, match="crash"):  # manifest written, LATEST not yet moved
        _publish(store, base, table)
    assert latest_version(store) == v1 and ShardedIndex.load(store).version == v1
    assert len(list_versions(store)) == 2  # the new version is complete and loadable by name, just not LATEST


def test_a_corrupt_shard_is_refused(tmp_path: Path, corpus) -> None:
    base, _, table = corpus
    store = Store(str(tmp_path))
    version = _publish(store, base, table)
    path = tmp_path / "indexes" / version / "shard-00002.faiss"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match=r"shard-00002\.faiss: corrupt shard: sha256"):
        ShardedIndex.load(store)
    path.unlink()
    with pytest.raises(CorruptShardError, match="corrupt shard: the file is missing"):
        ShardedIndex.load(store, version)


def test_missing_versions_are_clear_errors(tmp_path: Path, corpus) -> None:
    base, _, table = corpus
    store = Store(str(tmp_path))
    with pytest.raises(IndexVersionError, match="no index has been published here"):
        ShardedIndex.load(store)
    v1 = _publish(store, base, table)
    v2 = _publish(store, base, table)
    absent = "20200101T000000.000Z-deadbeef"
    with pytest.raises(IndexVersionError, match=f"version {absent} not found; available: {v1}, {v2}"):
        ShardedIndex.load(store, absent)
    delete_version(store, v1)
    with pytest.raises(IndexVersionError, match=f"not found; available: {v2}$"):
        ShardedIndex.load(store, v1)
    assert ShardedIndex.load(store).version == v2
