"""Search an index version whose shards are held in the memory of Dask workers.

For an index that outgrows one machine: each shard is loaded (and checked
against its manifest) by one worker and stays in that worker's memory as a
Dask future; every query batch fans out as one task per shard, run where the
shard lives, and only each shard's top-k (plus the passage ids, titles and
texts of those rows) travels back to be merged here. Results are exactly those
of :class:`rag_core.index.search.ShardedIndex` over the same version: same scores,
same tie order, same :class:`~rag_core.index.search.Hit` objects.

Each shard keeps the search setting tuned at build (its manifest entry's
``meta``). A search task runs FAISS with its worker's threads divided among
the shards that worker holds, so the shards of one worker, searched at once,
never run more FAISS threads than the worker was given.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
from distributed import Client, Future

from rag_core.errors import WikiragError
from rag_core.index.manifest import IndexManifest
from rag_core.index.search import (
    Hit,
    QueryError,
    batch_threads,
    check_dim,
    check_k,
    load_shard,
    merge_topk,
    omp_threads,
    search_shard,
)
from rag_core.index.tuning import set_search_params
from rag_core.index.versions import read_manifest
from rag_core.model.retriever import (
    Retrieved,
    VersionRetriever,
    assemble,
    check_n_docs,
    require_embeddings,
    stored_vectors,
)
from rag_core.storage import Store
# DaskWaitTimeoutError: callers catch it here
from tasks.adapters.dask_waits import DaskWaitTimeoutError, wait_within  # noqa: F401

_COLUMNS = ("passage_id", "title", "text")
# Waits on workers end here, with one line, instead of hanging on a stuck or lost worker: loading reads each
# shard from the store (gigabytes for a large version); a search is one batch of questions on every shard.
LOAD_TIMEOUT_S = 3600.0
SEARCH_TIMEOUT_S = 600.0


@dataclass
class LoadedShard:
    """One shard in a worker's memory; its size is reported to Dask (a bare FAISS index claims 56 bytes).

    ``vectors``: the shard's stored float32 embeddings (what RAG's doc_scores use), when loaded with them."""

    index: faiss.Index
    passages: pa.Table
    nbytes: int
    vectors: np.ndarray | None = None

    def __sizeof__(self) -> int:
        return self.nbytes


def load_shard_on_worker(store: Store, manifest: dict[str, Any], entry: dict[str, Any],
                         with_vectors: bool = False) -> LoadedShard:
    """Runs on a worker: load one shard, checking every file's sha256, with its stored search setting (and,
    ``with_vectors``, its embedding file, read and checked as :class:`~rag_core.model.retriever.IndexRetriever`
    reads it)."""
    index, table = load_shard(store, manifest, entry)
    vectors = None
    if with_vectors:
        vectors = stored_vectors(store, IndexManifest.model_validate(manifest), int(entry["shard"]),
                                 table.column("passage_id").to_pylist())
    return LoadedShard(index, table, int(entry["bytes"]) + table.nbytes + (0 if vectors is None else vectors.nbytes),
                       vectors)


def search_loaded_shard(shard: LoadedShard, x: np.ndarray, k: int, params: dict[str, int],
                        threads: int = 1) -> tuple[Any, Any, dict, dict, int]:
    """Runs on a worker: one shard's top-k ``(distances, rows)``, each ``[q, k_s]``, the found rows' columns,
    their stored vectors (empty when the shard holds none), and the FAISS threads the search ran with (at
    most ``threads``, fewer for a small batch; set for this task's thread only)."""
    if params:
        set_search_params(shard.index, **params)
    with omp_threads(batch_threads(len(x), threads)) as used:
        distances, rows = search_shard(shard.index, x, k)
    found = np.unique(rows[rows >= 0])
    picked = shard.passages.take(pa.array(found))
    columns = {c: picked.column(c).to_pylist() for c in _COLUMNS if c in picked.column_names}
    passages = {int(r): tuple(columns[c][i] if c in columns else None for c in _COLUMNS) for i, r in enumerate(found)}
    vectors = {} if shard.vectors is None else {int(r): shard.vectors[r] for r in found}
    return distances, rows, passages, vectors, used


def search_threads(holders: list[str | None], nthreads: dict[str, int]) -> list[int]:
    """FAISS threads for each shard's search task: its worker's threads shared by the shards it holds (>= 1)."""
    per_worker = Counter(holders)
    return [max(1, nthreads.get(h, 1) // per_worker[h]) if h is not None else 1 for h in holders]


def place_shards(entries: list[dict[str, Any]], workers: list[str]) -> dict[int, str]:
    """Shard number -> worker: largest shard first, each to the worker holding the fewest bytes so far."""
    load = dict.fromkeys(workers, 0)
    placement = {}
    for entry in sorted(entries, key=lambda e: (-int(e["bytes"]), e["shard"])):
        worker = min(workers, key=lambda w: (load[w], workers.index(w)))
        placement[entry["shard"]] = worker
        load[worker] += int(entry["bytes"])
    return placement


class DaskShardedIndex:
    """The shards of one index version, held by Dask workers and searched together.

    Same results as :class:`rag_core.index.search.ShardedIndex`; use it as a context
    manager (or call :meth:`close`) to free the workers' memory. ``faiss_threads``
    records, per shard, the FAISS threads its last search ran with on its worker.
    """

    def __init__(self, client: Client, manifest: dict[str, Any], shards: list[Future],
                 search_timeout_s: float = SEARCH_TIMEOUT_S) -> None:
        self.client = client
        self.search_timeout_s = search_timeout_s  # the longest wait for one search on every shard
        self.manifest = manifest
        self.metric = manifest["metric"]
        self.dim = int(manifest["dim"])
        self.shards = shards
        self.faiss_threads: list[int] = []
        self._params: dict[str, int] = {}
        self._nthreads: dict[str, int] = {}

    @classmethod
    def load(cls, client: Client, store: Store, version: str | None = None, *, with_vectors: bool = False,
             share: str | None = None, load_timeout_s: float = LOAD_TIMEOUT_S,
             search_timeout_s: float = SEARCH_TIMEOUT_S) -> DaskShardedIndex:
        """Load a published version (LATEST's when None) onto the workers, spread by size.

        Each worker reads and checks its shards itself: the store (url and
        options, credentials included) travels to it, the shards never pass
        through here. A corrupt shard raises the same CorruptShardError as
        ``ShardedIndex.load``. ``with_vectors``: each worker also holds its
        shards' stored float32 vectors (:class:`DaskRetriever` needs them).
        ``share``: loads of the same version with the same name, from any
        client, hold one copy (the shard keys are equal and Dask runs a key
        once; the copy lives while one of them holds it); None = a copy of its own.
        Shards not loaded within ``load_timeout_s`` raise :class:`DaskWaitTimeoutError` (and are freed);
        ``search_timeout_s`` bounds each later search the same way.
        """
        manifest = read_manifest(store, version)
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        if not workers:
            raise WikiragError(f"the Dask cluster at {client.scheduler.address} has no workers; start some first")
        placement = place_shards(manifest["shards"], workers)
        tag = f"{share}-{'vectors' if with_vectors else 'index'}" if share else uuid.uuid4().hex[:8]
        shards = [
            client.submit(load_shard_on_worker, store, manifest, entry, with_vectors,
                          workers=[placement[entry["shard"]]],
                          allow_other_workers=True,  # if that worker dies, another reloads the shard
                          key=f"wikirag-shard-{manifest['version']}-{entry['shard']:05d}-{tag}")
            for entry in manifest["shards"]
        ]
        index = cls(client, manifest, shards, search_timeout_s)
        try:
            with client.as_current():  # wait() uses the current client; this one need not be the default
                wait_within(shards, f"loading index version {manifest['version']} onto the Dask workers",
                            load_timeout_s, raise_with="DaskShardedIndex.load(load_timeout_s=...)")
            for future in shards:  # the first failed shard, by number, raises its own error
                if future.status == "error":
                    future.result()
        except BaseException:
            index.close()
            raise
        return index

    @property
    def version(self) -> str | None:
        return self.manifest.get("version")

    @property
    def ntotal(self) -> int:
        return sum(int(entry["count"]) for entry in self.manifest["shards"])

    def holders(self) -> list[str | None]:
        """The worker holding each shard (None while one is being reloaded)."""
        who = self.client.who_has(self._live_shards())
        return [next(iter(sorted(who.get(f.key, ()))), None) for f in self.shards]

    def set_search_params(self, *, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Override the saved nprobe/efSearch on every shard that has them, from the next search on."""
        self._params.update({k: v for k, v in (("nprobe", nprobe), ("efSearch", ef_search)) if v is not None})

    def search_rows(self, query_vectors: Any, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The merged top-k as arrays ``(scores, shards, rows)``, each ``[q, k]``; row -1 where none."""
        return self._search(query_vectors, k)[:3]

    def search(self, query_vectors: Any, k: int) -> list[list[Hit]]:
        """For each query, up to k hits, best first."""
        # At most every passage: a huge k must not allocate [q, k] padding that no hit fills.
        scores, shards, rows, passages, _ = self._search(query_vectors, min(check_k(k), max(self.ntotal, 1)))
        return [
            [Hit(*passages[s][r], score=float(score), shard=int(s))
             for score, s, r in zip(q_scores, q_shards, q_rows) if r >= 0]
            for q_scores, q_shards, q_rows in zip(scores, shards, rows)
        ]

    def _search(self, query_vectors: Any, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict],
                                                          list[dict]]:
        x = check_dim(query_vectors, self.dim)
        k = check_k(k)
        holders = self.holders()
        if any(h is not None and h not in self._nthreads for h in holders):
            self._nthreads = {w: int(info["nthreads"])
                              for w, info in self.client.scheduler_info(n_workers=-1)["workers"].items()}
        # Each task runs where its shard lives; the restriction is loose so that a search still runs
        # (and the shard is reloaded elsewhere) when that worker has just died.
        tasks = [
            self.client.submit(search_loaded_shard, shard, x, k, dict(self._params), threads, pure=False,
                               workers=None if holder is None else [holder], allow_other_workers=True)
            for shard, holder, threads in zip(self.shards, holders, search_threads(holders, self._nthreads))
        ]
        try:
            with self.client.as_current():
                wait_within(tasks, f"searching index version {self.version} on the Dask workers",
                            self.search_timeout_s, raise_with="DaskShardedIndex.search_timeout_s")
            results = self.client.gather(tasks)
        finally:
            self.client.cancel(tasks)
        self.faiss_threads = [t for *_, t in results]
        larger_is_better = self.metric == "ip"
        scores, shards, rows = merge_topk([r[0] for r in results], [r[1] for r in results], k, larger_is_better)
        return (scores if larger_is_better else -scores), shards, rows, [r[2] for r in results], [r[3] for r in results]

    def _live_shards(self) -> list[Future]:
        if not self.shards:
            raise QueryError(f"index version {self.version} was closed; load it again with DaskShardedIndex.load")
        return self.shards

    def close(self) -> None:
        """Free the shards from the workers' memory (shared ones: once no other load holds them)."""
        if self.shards:
            self.client.cancel(self.shards)
            self.shards = []

    def __enter__(self) -> DaskShardedIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DaskRetriever(VersionRetriever):
    """:class:`~rag_core.model.retriever.IndexRetriever`'s interface over shards and vectors held by Dask workers.

    ``retrieve`` gives the same :class:`~rag_core.model.retriever.Retrieved` as IndexRetriever
    on the same version; only each question's top ``n_docs`` (ids, texts, vectors) travel here.
    The ranks of one training job load it with the same ``share`` name and hold one copy.
    """

    def __init__(self, index: DaskShardedIndex) -> None:
        self.index = index

    @classmethod
    def load(cls, client: Client, store: Store, version: str | None = None, *,
             share: str | None = None) -> DaskRetriever:
        """The version (LATEST's when None) with its stored vectors, on the workers (see DaskShardedIndex.load)."""
        manifest = IndexManifest.model_validate(read_manifest(store, version))
        require_embeddings(manifest)
        return cls(DaskShardedIndex.load(client, store, manifest.version, with_vectors=True, share=share))

    def retrieve(self, question_vectors: Any, n_docs: int) -> Retrieved:
        """The top ``n_docs`` passages of each question; fewer passages than ``n_docs`` in all is an error."""
        n_docs = check_n_docs(self.version, self.index.ntotal, n_docs)
        scores, shards, rows, passages, vectors = self.index._search(question_vectors, n_docs)
        return assemble(self.version, scores, shards, rows, self.index.dim, lambda s, r: passages[s][r],
                        lambda s, r: vectors[s][r])

    def close(self) -> None:
        self.index.close()

    def __enter__(self) -> DaskRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
