"""Search a published index version: every shard at once, merged to the global top-k.

Scores are "higher is better" for both metrics, so that ranking, merging and
``doc_scores`` downstream never depend on the metric: for ``ip`` a hit's score
is the inner product; for ``l2`` it is minus the squared L2 distance that FAISS
returns. Equal scores are ordered by shard, then by row: results are the same
on every run and for any number of threads.

Threads: FAISS runs OpenMP threads inside each search, so shards searched in
parallel, each with FAISS's default of one thread per core, would run
shards x cores threads on the cores. :func:`thread_plan` splits the cores
instead: parallel shard searches x FAISS threads in each <= the cores
(OpenMP's thread count is per calling thread, so each search thread sets its
own). The measured choice between its layouts is in docs/benchmarks.md.

IVF shards trained together share one coarse quantizer
(:func:`~rag_core.index.faiss_index.train_index`): their lists partition the
lists of one index over all passages. :func:`shared_coarse` finds that
quantizer; a search then ranks the centroids once and each shard scans only
its part of the chosen lists (FAISS's ``search_preassigned``), so 4 shards do
the work of one index instead of four coarse searches, with its top-k.
A version loaded whole (:meth:`ShardedIndex.load`) goes further: its shards'
lists move into one index (:func:`merge_trained_together`), so a process that
holds 4 such shards searches at one index's speed, not 4 scans' overheads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import pyarrow as pa

from rag_core.errors import WikiragError
from rag_core.index.faiss_index import METRICS, coarse_fingerprint, coarse_quantizer, deserialize_index, sha256_hex
from rag_core.index.tuning import apply_search_setting, refine_of, set_search_params
from rag_core.index.version_names import INDEXES_DIR
from rag_core.index.versions import CorruptShardError, read_manifest
from rag_core.parquet_bytes import parquet_to_table
from rag_core.storage import Store

RERANK_CHUNK = 128  # queries re-ranked at once: 128 x 40 candidates x 384 floats is 8 MB
QUERIES_PER_THREAD = 64  # a FAISS thread pays off from this many queries of a batch on (docs/benchmarks.md)


class QueryError(WikiragError):
    """Query vectors that cannot be searched against this index."""


@dataclass(frozen=True)
class Hit:
    passage_id: str
    title: str | None  # None when the index was published without titles
    text: str | None
    score: float  # higher is better: inner product, or minus the squared L2 distance
    shard: int


def check_dim(query_vectors: Any, dim: int) -> np.ndarray:
    """Queries as C-contiguous float32 ``[q, dim]`` (one 1-D vector becomes ``[1, dim]``), or a clear error."""
    x = np.asarray(query_vectors)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.number):
        raise QueryError(f"query vectors must be a numeric [q, {dim}] array, got shape {x.shape} and dtype {x.dtype}")
    if x.shape[1] != dim:
        raise QueryError(f"query vectors have dimension {x.shape[1]} but the index has dimension {dim}; "
                         "encode the questions with the encoder the index was built for")
    return np.ascontiguousarray(x, dtype=np.float32)


def check_k(k: Any) -> int:
    """k as an int, or a clear error."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise QueryError(f"k must be a positive integer, got {k!r}")
    return int(k)


def search_shard(index: faiss.Index, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """One shard's ``(distances, rows)``, each ``[q, min(k, ntotal)]`` (``[q, 0]`` for an empty shard)."""
    if index.ntotal == 0:
        return np.empty((len(x), 0), np.float32), np.empty((len(x), 0), np.int64)
    return index.search(x, min(k, index.ntotal))


def shared_coarse(shards: Sequence[faiss.Index]) -> faiss.Index | None:
    """The coarse quantizer that two or more IVF shards share (equal centroids, same metric), or None."""
    if len(shards) < 2 or any(coarse_quantizer(index) is None or index.ntotal == 0 for index in shards):
        return None
    if len({index.metric_type for index in shards}) != 1 or len(set(map(coarse_fingerprint, shards))) != 1:
        return None
    return coarse_quantizer(shards[0])


def merge_trained_together(shards: Sequence[faiss.Index]) -> faiss.Index | None:
    """One index holding every shard's vectors, row ``offset_s + i`` for row ``i`` of shard ``s``, when the
    shards were trained together (:func:`shared_coarse`); else None and the shards untouched.

    The shards' lists move into the first shard's (FAISS's ``merge_from``: nothing is copied, and every shard
    but the first is left empty), so the result searches exactly as one index over all passages trained once:
    the same candidates, the same top-k, at one index's speed.
    """
    if shared_coarse(shards) is None:
        return None
    # Shards share the version's setting; should a republished one differ, the deepest search keeps every recall
    nprobe = max(faiss.extract_index_ivf(shard).nprobe for shard in shards)
    depths = [refine_of(shard).k_factor for shard in shards if refine_of(shard) is not None]
    merged, offset = shards[0], shards[0].ntotal
    for shard in shards[1:]:
        count = shard.ntotal
        into, other = faiss.downcast_index(merged), faiss.downcast_index(shard)
        if isinstance(into, faiss.IndexRefine):  # FAISS merges the coded and the raw parts, not the pair
            faiss.downcast_index(into.base_index).merge_from(faiss.downcast_index(other.base_index), offset)
            faiss.downcast_index(into.refine_index).merge_from(faiss.downcast_index(other.refine_index), 0)
            into.ntotal, other.ntotal = into.base_index.ntotal, 0
        else:
            into.merge_from(other, offset)
        offset += count
    set_search_params(merged, nprobe=nprobe, k_factor_rf=max(depths) if depths else None)
    return merged


def search_preassigned(index: faiss.Index, x: np.ndarray, k: int, centroid_scores: np.ndarray,
                       lists: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One IVF shard's ``(distances, rows)`` over the lists ranked by a shared coarse search (``[q, >= nprobe]``,
    best first); the shard scans its own ``nprobe`` first ones, as its own search would."""
    if index.ntotal == 0:
        return np.empty((len(x), 0), np.float32), np.empty((len(x), 0), np.int64)
    ivf, refine = faiss.downcast_index(index), None
    if isinstance(ivf, faiss.IndexRefine):
        refine, ivf = ivf, faiss.downcast_index(ivf.base_index)
    nprobe = min(ivf.nprobe, ivf.nlist)
    k = min(k, index.ntotal)
    candidates = k if refine is None else min(int(k * refine.k_factor), index.ntotal)
    found = ivf.search_preassigned(x, candidates, np.ascontiguousarray(lists[:, :nprobe]),
                                   np.ascontiguousarray(centroid_scores[:, :nprobe]))
    return found if refine is None else rerank(refine, x, found[1], k)


def rerank(refine: faiss.Index, x: np.ndarray, candidates: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of each query's candidate rows by exact score on a refine index's raw vectors, as FAISS's
    own refine step ranks them: ``(distances, rows)``, FAISS's convention (-1 rows at the end)."""
    flat = faiss.downcast_index(refine.refine_index)
    vectors = faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)
    ip = refine.metric_type == faiss.METRIC_INNER_PRODUCT
    distances = np.empty((len(x), k), np.float32)
    rows = np.empty((len(x), k), np.int64)
    for start in range(0, len(x), RERANK_CHUNK):  # the gathered vectors stay a few MB for any batch
        part, xs = candidates[start:start + RERANK_CHUNK], x[start:start + RERANK_CHUNK]
        found = part >= 0
        picked = vectors[np.where(found, part, 0)]  # [q, c, d]
        scores = np.einsum("qd,qcd->qc", xs, picked) if ip else ((picked - xs[:, None, :]) ** 2).sum(-1)
        order = np.argsort(np.where(found, -scores if ip else scores, np.inf), axis=1, kind="stable")[:, :k]
        rows[start:start + RERANK_CHUNK] = np.take_along_axis(np.where(found, part, -1), order, axis=1)
        worst = -np.inf if ip else np.inf
        distances[start:start + RERANK_CHUNK] = np.take_along_axis(np.where(found, scores, worst), order, axis=1)
    return distances, rows


@contextmanager
def omp_threads(threads: int) -> Iterator[int]:
    """FAISS's OpenMP threads for searches made by the calling thread, restored on exit; yields the count in force."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield faiss.omp_get_max_threads()
    finally:
        faiss.omp_set_num_threads(before)


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def batch_threads(n_queries: int, threads: int) -> int:
    """FAISS threads worth giving a search of ``n_queries``: at most one per QUERIES_PER_THREAD queries.

    FAISS splits a batch between its threads; for a few queries the threads
    mostly wait for each other, and on a busy machine far longer than the
    search itself takes (measured in docs/benchmarks.md).
    """
    return max(1, min(threads, n_queries // QUERIES_PER_THREAD))


def thread_plan(n_shards: int, cores: int, max_workers: int | None = None) -> tuple[int, int]:
    """``(shards searched at once, FAISS threads in each)`` for ``n_shards`` on ``cores``.

    Default: one shard search per core at most (``min(n_shards, cores)``), the
    cores left over shared among them as FAISS threads; so with shards >= cores
    each search runs on one FAISS thread. ``max_workers=1`` searches the shards
    one after another, each with every core. The product never exceeds the
    cores unless ``max_workers`` asks for more searches than cores.
    """
    workers = max(1, min(n_shards, max_workers or cores))
    return workers, max(1, cores // workers)


def merge_topk(
    per_shard_scores: Sequence[np.ndarray],
    per_shard_rows: Sequence[np.ndarray],
    k: int,
    larger_is_better: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The global top-k of per-shard results: ``(scores, shards, rows)``, each ``[q, k]``.

    Shard ``s`` gives ``scores[s]`` and ``rows[s]``, both ``[q, k_s]``, with row -1
    where it had fewer than ``k_s`` results (as FAISS returns). Ties go to the
    lower shard, then the lower row. Where fewer than ``k`` results exist in all,
    the tail has row -1, shard -1 and the worst score (-inf, or +inf for distances).
    """
    if k < 1:
        raise QueryError(f"k must be at least 1, got {k}")
    if len(per_shard_scores) != len(per_shard_rows) or not per_shard_scores:
        raise QueryError("merge_topk needs one scores array and one rows array per shard, and at least one shard")
    n_queries = per_shard_scores[0].shape[0]
    for s, (d, r) in enumerate(zip(per_shard_scores, per_shard_rows)):
        if d.shape != r.shape or d.ndim != 2 or d.shape[0] != n_queries:
            raise QueryError(f"shard {s}: scores {d.shape} and rows {r.shape} must both be [{n_queries}, k_s]")
    scores = np.concatenate([np.asarray(d, dtype=np.float64) for d in per_shard_scores], axis=1)  # [q, sum k_s]
    rows = np.concatenate([np.asarray(r, dtype=np.int64) for r in per_shard_rows], axis=1)  # [q, sum k_s]
    shards = np.concatenate([np.full(r.shape, s, dtype=np.int64) for s, r in enumerate(per_shard_rows)], axis=1)
    worst = -np.inf if larger_is_better else np.inf
    missing = (rows < 0) | np.isnan(scores)
    key = np.where(missing, np.inf, -scores if larger_is_better else scores)  # smaller key = better
    order = np.lexsort((rows, shards, key), axis=1)[:, :k]  # [q, min(k, sum k_s)]
    top_scores = np.take_along_axis(np.where(missing, worst, scores), order, axis=1)
    top_rows = np.take_along_axis(np.where(missing, -1, rows), order, axis=1)
    top_shards = np.take_along_axis(np.where(missing, -1, shards), order, axis=1)
    if order.shape[1] < k:  # fewer candidates than k in all shards together
        pad = k - order.shape[1]
        top_scores = np.pad(top_scores, ((0, 0), (0, pad)), constant_values=worst)
        top_rows = np.pad(top_rows, ((0, 0), (0, pad)), constant_values=-1)
        top_shards = np.pad(top_shards, ((0, 0), (0, pad)), constant_values=-1)
    return top_scores, top_shards, top_rows


def single_ranked(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """One index's ``(scores as float64, rows)`` as :func:`merge_topk` would return them, when they are its
    ranking unchanged: k results per query, none missing and no two scores of a query equal (ties are where
    the merge's order by row could differ from FAISS's). None otherwise. The merge sorts and gathers, which for one query per
    call is a large share of the call's time."""
    if rows.shape[1] != k or (rows < 0).any() or (scores[:, 1:] == scores[:, :-1]).any() or np.isnan(scores).any():
        return None
    return scores.astype(np.float64), rows.astype(np.int64, copy=False)


class ShardedIndex:
    """The shards of one index version, searched together.

    Row ``i`` of shard ``s`` is row ``i`` of ``passages[s]`` (passage_id, and
    title/text when published). Shards are searched in a thread pool laid out
    by :func:`thread_plan` over ``threads`` cores (default: the cores this
    process may use); FAISS releases the GIL, so shards run in parallel.
    Each search runs FAISS with at most ``threads_per_search`` threads, fewer
    for small batches (:func:`batch_threads`); ``faiss_threads`` records, per
    shard, the FAISS threads its last search ran with.
    """

    def __init__(
        self,
        shards: Sequence[faiss.Index],
        passages: Sequence[pa.Table],
        *,
        metric: str = "ip",
        manifest: dict[str, Any] | None = None,
        max_workers: int | None = None,
        threads: int | None = None,
        merge: bool = False,
    ) -> None:
        if not shards or len(shards) != len(passages):
            raise QueryError(f"need one passages table per shard, got {len(shards)} shards and {len(passages)} tables")
        if metric not in METRICS:
            raise QueryError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
        dims = {index.d for index in shards}
        if len(dims) != 1:
            raise QueryError(f"shards disagree on the dimension: {sorted(dims)}")
        for s, (index, table) in enumerate(zip(shards, passages)):
            if index.ntotal != table.num_rows:
                raise QueryError(f"shard {s}: the index holds {index.ntotal} vectors but {table.num_rows} passages")
        self.num_shards = len(shards)
        self.row_offsets = np.cumsum([0] + [index.ntotal for index in shards])[:-1]  # global row of each shard's 0
        merged = merge_trained_together(shards) if merge else None
        self.merged = merged is not None  # then self.shards is that one index and rows are global
        self.shards = [merged] if merged is not None else list(shards)
        self.metric = metric
        self.manifest = manifest or {}
        self.dim = dims.pop()
        self.workers, self.threads_per_search = thread_plan(len(self.shards), threads or available_cores(),
                                                            max_workers)
        self.faiss_threads: list[int] = []
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.coarse = shared_coarse(self.shards)  # one coarse search serves every shard when set
        self._columns = [
            {c: table.column(c).combine_chunks() for c in ("passage_id", "title", "text") if c in table.column_names}
            for table in passages
        ]

    @classmethod
    def load(cls, store: Store, version: str | None = None, *, max_workers: int | None = None,
             threads: int | None = None) -> ShardedIndex:
        """Load a published version (LATEST's when None), checking every file's sha256.

        Each shard gets the search setting stored in its manifest entry (tuned at build).
        """
        manifest = read_manifest(store, version)
        with ThreadPoolExecutor(max_workers=min(8, len(manifest["shards"]))) as pool:  # I/O and checksums
            loaded = list(pool.map(lambda entry: load_shard(store, manifest, entry), manifest["shards"]))
        return cls([i for i, _ in loaded], [t for _, t in loaded], metric=manifest["metric"], manifest=manifest,
                   max_workers=max_workers, threads=threads, merge=True)

    @property
    def version(self) -> str | None:
        return self.manifest.get("version")

    @property
    def ntotal(self) -> int:
        return sum(index.ntotal for index in self.shards)

    def set_search_params(self, *, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Override the saved nprobe/efSearch on every shard that has them."""
        for index in self.shards:
            set_search_params(index, nprobe=nprobe, efSearch=ef_search)

    def search_rows(self, query_vectors: Any, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The merged top-k as arrays ``(scores, shards, rows)``, each ``[q, k]``; row -1 where none."""
        x = check_dim(query_vectors, self.dim)
        k = check_k(k)

        threads = batch_threads(len(x), self.threads_per_search)
        ranked = self._rank_lists(x)

        def one(index: faiss.Index) -> tuple[np.ndarray, np.ndarray, int]:
            with omp_threads(threads) as threads_in_force:
                if ranked is None:
                    return (*search_shard(index, x, k), threads_in_force)
                return (*search_preassigned(index, x, k, *ranked), threads_in_force)

        if self.workers <= 1:
            results = [one(index) for index in self.shards]
        else:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="shard-search")
                pool = self._pool
            results = list(pool.map(one, self.shards))
        self.faiss_threads = [t for _, _, t in results]
        larger_is_better = self.metric == "ip"
        alone = single_ranked(results[0][0], results[0][1], k) if len(results) == 1 else None
        if alone is not None:  # one index's own ranking already is the merged one: skip the merge's cost
            scores, rows = alone
            shards = np.zeros_like(rows)
        else:
            scores, shards, rows = merge_topk([d for d, _, _ in results], [i for _, i, _ in results], k,
                                              larger_is_better)
        if self.merged:  # global rows back to (shard, row)
            found = rows >= 0
            shards = np.where(found, np.searchsorted(self.row_offsets, rows, side="right") - 1, -1)
            rows = np.where(found, rows - self.row_offsets[np.maximum(shards, 0)], -1)
        return (scores if larger_is_better else -scores), shards, rows

    def _rank_lists(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """``(centroid scores, lists)`` of the shared coarse search, to the largest nprobe of the shards
        (None without a shared quantizer); it runs on every core this index may use."""
        if self.coarse is None:
            return None
        nprobe = max(min(faiss.extract_index_ivf(index).nprobe, self.coarse.ntotal) for index in self.shards)
        with omp_threads(batch_threads(len(x), self.workers * self.threads_per_search)):
            return self.coarse.search(x, nprobe)

    def close(self) -> None:
        """Stop the search threads (the shards stay usable; a later search starts them again)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()

    def search(self, query_vectors: Any, k: int) -> list[list[Hit]]:
        """For each query, up to k hits, best first."""
        # At most every passage: a huge k must not allocate [q, k] padding that no hit fills.
        scores, shards, rows = self.search_rows(query_vectors, min(check_k(k), max(self.ntotal, 1)))
        return [
            [self.hit(int(s), int(r), float(score)) for score, s, r in zip(q_scores, q_shards, q_rows) if r >= 0]
            for q_scores, q_shards, q_rows in zip(scores, shards, rows)
        ]

    def passage_ids(self, shard: int) -> list[str]:
        """Shard ``shard``'s passage ids in FAISS row order."""
        return self._columns[shard]["passage_id"].to_pylist()

    def hit(self, shard: int, row: int, score: float) -> Hit:
        """Row ``row`` of shard ``shard`` as a Hit with ``score``."""
        columns = self._columns[shard]
        title, text = columns.get("title"), columns.get("text")
        return Hit(
            passage_id=columns["passage_id"][row].as_py(),
            title=None if title is None else title[row].as_py(),
            text=None if text is None else text[row].as_py(),
            score=score,
            shard=shard,
        )


def load_shard(store: Store, manifest: dict[str, Any], entry: dict[str, Any]) -> tuple[faiss.Index, pa.Table]:
    """One shard of a published version: its FAISS index and passages, both checked against the manifest.

    The search setting stored in the entry's ``meta`` (tuned at build) is applied to the index.
    """
    root = store.child(INDEXES_DIR, manifest["version"])
    index_bytes = _read_checked(root, entry["url"], entry["sha256"])
    table = parquet_to_table(_read_checked(root, entry["ids_url"], entry["ids_sha256"]))
    try:
        index = deserialize_index(index_bytes)
    except RuntimeError as exc:
        raise CorruptShardError(f"{root.url_of(entry['url'])}: corrupt shard: FAISS cannot read it") from exc
    if index.ntotal != entry["count"] or table.num_rows != entry["count"] or index.d != manifest["dim"]:
        raise CorruptShardError(
            f"{root.url_of(entry['url'])}: corrupt shard: holds {index.ntotal} vectors of dimension {index.d} "
            f"and {table.num_rows} ids, the manifest says {entry['count']} of dimension {manifest['dim']}"
        )
    try:
        apply_search_setting(index, entry.get("meta"))
    except ValueError as exc:
        raise CorruptShardError(f"{root.url_of(entry['url'])}: corrupt shard entry: {exc}; republish the version") \
            from exc
    return index, table


def _read_checked(root: Store, name: str, sha256: str) -> bytes:
    try:
        data = root.read_bytes(name)
    except FileNotFoundError as exc:
        message = f"{root.url_of(name)}: corrupt shard: the file is missing; republish the version"
        raise CorruptShardError(message) from exc
    if sha256_hex(data) != sha256:
        raise CorruptShardError(
            f"{root.url_of(name)}: corrupt shard: sha256 {sha256_hex(data)[:12]}... does not match the manifest's "
            f"{sha256[:12]}...; republish the version or load another one"
        )
    return data
