"""Shards held by the workers of a real local Dask cluster, searched against in-process search of the same version."""

from __future__ import annotations

import os
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pytest
from distributed import Client, LocalCluster

from rag_core.index.faiss_index import IndexConfig, build_shard_index, build_tuned_shard, serialize_index
from rag_core.index.search import QUERIES_PER_THREAD, QueryError, ShardedIndex, available_cores
from rag_core.index.version_names import IndexVersionError
from rag_core.index.versions import CorruptShardError, ShardPayload, publish_version
from rag_core.storage import Store
from tasks.adapters.dask_retriever import DaskShardedIndex, place_shards, search_threads
from tests.helpers.vectors import clustered_vectors
from tests.tasks.conftest import held_after_release

DIM = 32
SIZES = [300, 900, 800, 1000]  # four shards of unequal size; k=400 is more than shard 0 holds


@pytest.fixture(scope="module")
def corpus() -> tuple[np.ndarray, np.ndarray, pa.Table]:
    n = sum(SIZES)
    x = clustered_vectors(n + 40, DIM, seed=3, clusters=30)
    table = pa.table({"passage_id": [f"p{i}" for i in range(n)], "title": [f"Title {i}" for i in range(n)],
                      "text": [f"Text {i}." for i in range(n)]})
    return x[:n], x[n:], table


def _publish(store: Store, corpus, factory: str = "Flat", metric: str = "ip", titles: bool = True) -> str:
    base, _, table = corpus
    bounds = np.cumsum([0, *SIZES])
    shards = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        index = build_shard_index(base[a:b], IndexConfig(factory=factory, metric=metric))
        passages = table.slice(a, b - a) if titles else table.slice(a, b - a).select(["passage_id"])
        shards.append(ShardPayload(serialize_index(index), passages))
    return publish_version(store, shards, {"dim": DIM, "metric": metric, "factory": factory})


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, corpus) -> tuple[Store, dict[str, str]]:
    store = Store(str(tmp_path_factory.mktemp("store")))
    versions = {"flat-ip": _publish(store, corpus), "hnsw": _publish(store, corpus, factory="HNSW32"),
                "flat-l2-ids-only": _publish(store, corpus, metric="l2", titles=False)}
    return store, versions


@pytest.mark.parametrize("name", ["flat-ip", "flat-l2-ids-only", "hnsw"])
def test_same_results_as_in_process_search(client: Client, published, corpus, name: str) -> None:
    store, versions = published
    _, queries, _ = corpus
    local = ShardedIndex.load(store, versions[name])
    with DaskShardedIndex.load(client, store, versions[name]) as remote:
        assert (remote.version, remote.ntotal, remote.dim) == (versions[name], sum(SIZES), DIM)
        for k in (1, 10, 400):  # 400: more than shard 0 holds
            want, got = local.search_rows(queries, k), remote.search_rows(queries, k)
            assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2])  # shards, rows
            assert np.allclose(got[0], want[0], atol=1e-5)
            want_hits, got_hits = local.search(queries, k), remote.search(queries, k)
            assert [[(h.passage_id, h.title, h.text, h.shard) for h in q] for q in got_hits] == \
                   [[(h.passage_id, h.title, h.text, h.shard) for h in q] for q in want_hits]
            for got_q, want_q in zip(got_hits, want_hits):  # an HNSW shard may return fewer than k
                assert np.allclose([h.score for h in got_q], [h.score for h in want_q], atol=1e-5)
        one = [[h.passage_id for h in index.search(queries[0], 3)[0]] for index in (remote, local)]  # a 1-D query
        assert one[0] == one[1] and len(one[0]) == 3
        assert remote.faiss_threads == [1] * 4  # one thread per worker, two shards each: one FAISS thread
        if name == "hnsw":  # search parameters reach the workers
            local.set_search_params(ef_search=16)
            remote.set_search_params(ef_search=16)
            assert np.array_equal(remote.search_rows(queries, 10)[2], local.search_rows(queries, 10)[2])
        if name == "flat-ip":  # a passage finds itself, with its title and text
            hit = remote.search(corpus[0][1234], 1)[0][0]
            assert (hit.passage_id, hit.title, hit.text, hit.shard) == ("p1234", "Title 1234", "Text 1234.", 2)
            assert hit.score == pytest.approx(1.0, abs=1e-5)


def test_shards_are_spread_over_both_workers_and_stay_there(client: Client, published, corpus) -> None:
    store, versions = published
    with DaskShardedIndex.load(client, store, versions["flat-ip"]) as remote:
        holders = remote.holders()
        who_has = client.who_has(remote.shards)
        assert all(len(who_has[f.key]) == 1 for f in remote.shards)  # each shard lives on one worker
        assert set(holders) == set(client.scheduler_info()["workers"]) and len(set(holders)) == 2
        for k in (5, 400):
            remote.search(corpus[1], k)
        assert remote.holders() == holders  # searching never copied or moved a shard
        assert all(len(w) == 1 for w in client.who_has(remote.shards).values())
        keys = {f.key for f in remote.shards}
    assert not keys & held_after_release(client)  # closing frees the workers' memory (asynchronously)
    with pytest.raises(QueryError, match="was closed; load it again"):
        remote.search(corpus[1], 5)


def _ef_search_on_workers(client: Client, remote: DaskShardedIndex) -> list[int]:
    """efSearch of each shard's index as its worker holds it."""
    return [client.submit(lambda shard: faiss.downcast_index(shard.index).hnsw.efSearch, future, pure=False,
                          workers=[holder]).result() for future, holder in zip(remote.shards, remote.holders())]


def test_tuned_setting_applied_on_load_and_thread_limits_held(tmp_path: Path, corpus) -> None:
    base, queries, table = corpus
    store = Store(str(tmp_path))
    bounds = np.cumsum([0, *SIZES])
    payloads = []
    for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        index, report = build_tuned_shard(base[a:b], IndexConfig(factory="HNSW32", ef_search=10, tune_queries=50))
        payloads.append(ShardPayload(serialize_index(index), table.slice(a, b - a),
                                     {**report, "search": {"efSearch": 20 + s}}))  # the file says 10
    version = publish_version(store, payloads, {"dim": DIM, "metric": "ip", "factory": "HNSW32"})
    # two workers, two shards each: a worker's threads are shared by its shards' searches; the count is
    # chosen to differ from FAISS's default (the cores), so that the test sees the limit, not the default
    per_shard = available_cores() + 1
    with LocalCluster(n_workers=2, threads_per_worker=2 * per_shard, processes=False,  # in-process: no ports
                      dashboard_address=None) as cluster, Client(cluster) as wide:
        with DaskShardedIndex.load(wide, store, version) as remote:
            assert _ef_search_on_workers(wide, remote) == [20, 21, 22, 23]
            assert sorted(remote.holders()) == sorted(list(wide.scheduler_info()["workers"]) * 2)
            batch = np.tile(queries, (-(-per_shard * QUERIES_PER_THREAD // len(queries)), 1))  # enough queries
            got = remote.search_rows(batch, 10)
            assert remote.faiss_threads == [per_shard] * 4  # faiss.omp_get_max_threads() inside each task
            want = ShardedIndex.load(store, version).search_rows(batch, 10)
            assert np.array_equal(got[2], want[2]) and np.array_equal(got[1], want[1])
            remote.search_rows(queries[:1], 10)
            assert remote.faiss_threads == [1] * 4  # a single query: one thread


def test_search_threads_share_each_workers_threads() -> None:
    assert search_threads(["a", "a", "b", None], {"a": 4, "b": 3}) == [2, 2, 3, 1]
    assert search_threads(["a", "a", "a"], {"a": 2}) == [1, 1, 1]  # never fewer than one
    assert search_threads(["c"], {}) == [1]  # a worker not seen yet


def test_placement_balances_bytes() -> None:
    entries = [{"shard": s, "bytes": b} for s, b in enumerate([100, 900, 400, 500, 300])]
    assert place_shards(entries, ["a", "b"]) == {1: "a", 3: "b", 2: "b", 4: "a", 0: "b"}


def test_a_corrupt_shard_is_refused_with_the_in_process_message(client: Client, tmp_path: Path, corpus) -> None:
    store = Store(str(tmp_path))
    version = _publish(store, corpus)
    path = tmp_path / "indexes" / version / "shard-00002.faiss"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError) as in_process:
        ShardedIndex.load(store, version)
    with pytest.raises(CorruptShardError, match=r"shard-00002\.faiss: corrupt shard: sha256") as distributed:
        DaskShardedIndex.load(client, store, version)
    assert str(distributed.value) == str(in_process.value) and "\n" not in str(distributed.value)
    assert not any(version in str(key) for key in held_after_release(client))  # the healthy shards were freed too


def test_missing_versions_and_bad_queries_are_clear_errors(client: Client, published, corpus) -> None:
    store, versions = published
    absent = "20200101T000000.000Z-deadbeef"
    with pytest.raises(IndexVersionError, match=f"index version {absent} not found; available: "):
        DaskShardedIndex.load(client, store, absent)
    with DaskShardedIndex.load(client, store, versions["flat-ip"]) as remote:
        with pytest.raises(QueryError, match="dimension 16 but the index has dimension 32"):
            remote.search(corpus[1][:, :16], 5)
        with pytest.raises(QueryError, match="positive integer"):
            remote.search(corpus[1], 0)


def test_a_dead_workers_shards_are_reloaded_elsewhere(client: Client, published, corpus) -> None:
    store, versions = published
    want = ShardedIndex.load(store, versions["flat-ip"]).search_rows(corpus[1], 10)
    with DaskShardedIndex.load(client, store, versions["flat-ip"]) as remote:
        victim = remote.holders()[0]
        os.kill(client.run(os.getpid, workers=[victim])[victim], 9)  # the nanny starts a fresh worker
        got = remote.search_rows(corpus[1], 10)
        assert victim not in remote.holders()
    assert np.array_equal(got[2], want[2]) and np.array_equal(got[1], want[1])
    client.wait_for_workers(2, timeout=60)
