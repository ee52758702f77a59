"""A shard's search setting (HNSW efSearch, IVF nprobe, re-rank depth), tuned against exact search when built.

The promise an index makes is recall@10 on *questions*, which lie far from
the passages they retrieve (an encoded question is much less like its best
passage than a passage is like its nearest neighbour). Held-out passages
searched as they are find their neighbourhood at once, through the graph
links or the inverted list they sit in, and ask for a far cheaper setting
than questions do. So tuning queries are held-out passages *moved away* from
themselves: the passage at row ``r``, turned in a random direction until its
cosine to itself is ``cosine`` (1.0 leaves it as it is), searched with row
``r`` left out of both the exact and the approximate results. At the cosine
that :class:`~rag_core.index.faiss_index.IndexConfig` uses by default, these
queries asked for the same setting as real questions did
(docs/benchmarks.md). The tuned setting is the cheapest value of a ladder
whose recall@10 reaches the target; it, the recall and the QPS measured are
stored in the shard's manifest entry and applied by search on load
(:func:`apply_search_setting`).

A refined index (``...,RFlat``: coarse codes re-ranked on the raw vectors)
has a second knob, its re-rank depth (FAISS's ``k_factor``: candidates
re-ranked per result). How coarse the codes are depends on the encoder (a
4-bit code of 2 dimensions loses little of a MiniLM vector and much of a
32-d random one), so the depth is tuned too: the cheapest depth whose
recall, with every list scanned, leaves headroom above the target, then the
cheapest nprobe at that depth (:func:`tune_depth`).
"""

from __future__ import annotations

import time
from typing import Any

import faiss
import numpy as np

RECALL_K = 10  # recall@k that tuning and the gate measure
# The values tried, cheapest first, ~1.2x apart (a query's cost grows with each; a step is a few ms of tuning)
EF_SEARCH_LADDER = (10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384,
                    448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048)
NPROBE_LADDER = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192,
                 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096,
                 5120, 6144, 7168, 8192, 10240, 12288, 14336, 16384)
K_FACTOR_LADDER = (2, 4, 8, 16, 32, 64, 128, 256, 512)  # a refined index's candidates per result (FAISS reads <= 1000)
# The depth must leave nprobe room to trade: at a depth whose ceiling just reaches the target, nprobe
# climbs to every list; half the gap between the target and 1 is left to it.
DEPTH_HEADROOM = 0.5


def _faiss_metric(metric: str) -> int:
    return faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2


def set_search_params(index: faiss.Index, **params: int | None) -> None:
    """Set FAISS search parameters (nprobe, efSearch, ...) where the index has them; others are ignored."""
    space = faiss.ParameterSpace()
    for name, value in params.items():
        if value is None:
            continue
        try:
            space.set_index_parameter(index, name, float(value))
        except RuntimeError as exc:
            if "could not set parameter" not in str(exc):
                raise


# What a stored setting may ask: a manifest is read from the store, and each value sizes every search's buffers
SEARCH_LIMITS = {"efSearch": 1 << 16, "nprobe": 1 << 16, "k_factor_rf": 1000}  # k_factor: FAISS's own read bound


def apply_search_setting(index: faiss.Index, meta: dict[str, Any] | None) -> None:
    """Apply the setting tuning stored in a shard's manifest ``meta`` (``{"search": {"efSearch": 96}}``), if any;
    ValueError for a name or value outside SEARCH_LIMITS."""
    setting = (meta or {}).get("search") or {}
    for name, value in setting.items():
        if name not in SEARCH_LIMITS or isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 1 <= value <= SEARCH_LIMITS[name]:
            raise ValueError(f"search setting {name}={value!r} is outside what tuning stores "
                             f"({', '.join(f'{n} 1..{v}' for n, v in SEARCH_LIMITS.items())})")
    set_search_params(index, **{name: int(value) for name, value in setting.items()})


def hnsw_of(index: faiss.Index) -> Any:
    """The HNSW graph of an HNSW index (also behind a pre-transform), or None."""
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexPreTransform):
        inner = faiss.downcast_index(inner.index)
    return inner.hnsw if isinstance(inner, faiss.IndexHNSW) else None


def refine_of(index: faiss.Index) -> Any:
    """The IndexRefine of a refined index (``...,RFlat``), or None."""
    inner = faiss.downcast_index(index)
    return inner if isinstance(inner, faiss.IndexRefine) else None


def search_ladder(index: faiss.Index, *, ef_search: int | None = None,
                  nprobe: int | None = None) -> tuple[str | None, list[int]]:
    """The parameter tuning sweeps and its values, cheapest first (one value when the caller fixes it)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        if nprobe:
            return "nprobe", [min(nprobe, ivf.nlist)]
        return "nprobe", [p for p in NPROBE_LADDER if p < ivf.nlist] + [ivf.nlist]
    if hnsw_of(index) is not None:
        return "efSearch", [ef_search] if ef_search else list(EF_SEARCH_LADDER)
    return None, []  # Flat and other exhaustive indexes have nothing to tune


def tuning_queries(vectors: np.ndarray, n_queries: int, cosine: float,
                   seed: int | list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, queries)``: ``n_queries`` seeded rows of ``vectors`` (sorted), each moved to ``cosine`` of itself.

    A query keeps its passage's norm and is turned towards a random direction
    orthogonal to it: ``cos(query, passage) == cosine`` (float32 ``[q, d]``).
    """
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(vectors), min(n_queries, len(vectors)), replace=False))
    x = vectors[rows].astype(np.float64)  # [q, d]
    if cosine >= 1.0:
        return rows, x.astype(np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)  # [q, 1]
    unit = x / np.maximum(norms, 1e-12)
    away = rng.normal(size=x.shape)
    away -= (away * unit).sum(1, keepdims=True) * unit  # orthogonal to the passage
    away /= np.maximum(np.linalg.norm(away, axis=1, keepdims=True), 1e-12)
    moved = cosine * unit + np.sqrt(1.0 - cosine**2) * away  # unit vectors at `cosine` of the passage
    return rows, (moved * norms).astype(np.float32)


def exact_kth(vectors: np.ndarray, query_rows: np.ndarray, k: int = RECALL_K, metric: str = "ip",
              queries: np.ndarray | None = None) -> np.ndarray:
    """Each query's exact k-th best score, its own row left out (float64 ``[q]``; larger is better).

    ``queries`` default to the vectors at ``query_rows`` themselves.
    """
    rows = np.asarray(query_rows, dtype=np.int64)
    k = min(k, len(vectors) - 1)
    if k < 1 or not len(rows):
        return np.full(len(rows), -np.inf)
    q = vectors[rows] if queries is None else queries
    scores, found = faiss.knn(q, vectors, k + 1, metric=_faiss_metric(metric))  # [q, k+1]; no copy of vectors
    scores = scores.astype(np.float64) * (1.0 if metric == "ip" else -1.0)
    others = found != rows[:, None]  # [q, k+1]: False where the query found its own row
    keep = others & (np.cumsum(others, axis=1) <= k)  # the best k other rows
    return np.where(keep, scores, np.inf).min(axis=1)


def heldout_recall(index: faiss.Index, vectors: np.ndarray, query_rows: np.ndarray, k: int = RECALL_K,
                   metric: str = "ip", *, kth: np.ndarray | None = None,
                   queries: np.ndarray | None = None) -> np.ndarray:
    """recall@k of ``index`` against exact search, one value per query row (float64 ``[len(query_rows)]``).

    ``queries`` (default: the vectors at ``query_rows`` of the shard itself)
    are searched with their row held out: row ``query_rows[i]`` is dropped
    from both the exact and the approximate results of query ``i``, so a
    passage finding itself earns nothing. A returned row counts when its exact
    score is at least the exact k-th best (ties at the boundary are as good as
    the row they tie with). ``kth`` (from :func:`exact_kth`) saves the exact
    search when called repeatedly.
    """
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    rows = np.asarray(query_rows, dtype=np.int64)
    k = min(k, len(x) - 1)
    if k < 1 or not len(rows):
        return np.ones(len(rows))
    q = x[rows] if queries is None else np.ascontiguousarray(queries, dtype=np.float32)  # [q, d]
    if kth is None:
        kth = exact_kth(x, rows, k, metric, q)
    _, found = index.search(q, k + 1)  # [q, k+1]
    valid = (found >= 0) & (found != rows[:, None])
    valid &= np.cumsum(valid, axis=1) <= k  # the first k others returned
    got = x[np.where(valid, found, 0)]  # [q, k+1, d]
    if metric == "ip":
        scores = np.einsum("qd,qjd->qj", q, got, dtype=np.float64)
    else:
        scores = -np.square(got.astype(np.float64) - q[:, None, :]).sum(-1)
    tolerance = 1e-6 * np.maximum(1.0, np.abs(kth))
    return (valid & (scores >= (kth - tolerance)[:, None])).sum(axis=1) / k


def tune_depth(index: faiss.Index, measure: Any, name: str | None, ladder: list[int], *,
               recall_target: float, k_factor: int | None = None) -> dict[int, float]:
    """Set a refined index's re-rank depth (``k_factor``); return ``{depth: recall}`` as tried ({} when fixed).

    With the search parameter at its most accurate value (every list), the
    depths of K_FACTOR_LADDER are tried from the shallowest up; the first whose
    recall (``measure()``: :func:`tune_search` takes the worse of the tuning
    queries' and of the same passages searched as they are, because coarse
    codes can blur close neighbours that a far query does not need) reaches the target plus DEPTH_HEADROOM of the gap to
    1 wins, so that nprobe, tuned next, finds the target well before every
    list. A parameter the caller fixed (or an index without one) has no room
    to trade: there the first depth reaching the target wins. Failing both, the
    first reaching the target, else the one with the best recall. The ladder stops where the candidates cover every
    vector: deeper re-ranks nothing more.
    """
    refine = refine_of(index)
    if refine is None:
        return {}
    if k_factor:
        refine.k_factor = k_factor
        return {}
    if name and ladder:
        set_search_params(index, **{name: ladder[-1]})
    fixed = len(ladder) <= 1
    goal = recall_target if fixed else min(1.0, recall_target + DEPTH_HEADROOM * (1.0 - recall_target))
    tried: dict[int, float] = {}
    for depth in K_FACTOR_LADDER:
        refine.k_factor = depth
        tried[depth] = measure()
        if tried[depth] >= goal or (RECALL_K + 1) * depth >= index.ntotal:
            break
    refine.k_factor = next((d for d in tried if tried[d] >= goal), None) or \
        next((d for d in tried if tried[d] >= recall_target), None) or max(tried, key=tried.get)
    return tried


def tune_search(index: faiss.Index, vectors: np.ndarray, rows: np.ndarray, queries: np.ndarray, *,
                recall_target: float, metric: str = "ip", ef_search: int | None = None,
                nprobe: int | None = None, k_factor: int | None = None) -> dict[str, Any]:
    """Set the cheapest efSearch / nprobe whose recall@10 on ``queries`` reaches ``recall_target``; report it.

    ``vectors`` are the ones ``index`` holds; ``rows``/``queries`` come from
    :func:`tuning_queries`. The ladder (:func:`search_ladder`) is walked from
    the cheapest value up and stops at the first that reaches the target; when
    none does, the most accurate value is kept and the report's recall says by
    how much it falls short (a recall gate then refuses the shard). A refined
    index first gets its re-rank depth (:func:`tune_depth`). A value the
    caller fixes is measured, not tuned. Returns ``{"search": {name: value,
    "k_factor_rf": depth}, "recall_at_10", "recall_target", "qps", "queries",
    "threads", "tried": {value: recall}}`` (and ``"tried_depth"`` when the
    depth was tuned); ``qps`` is one batch of the queries at that setting
    with the calling thread's FAISS threads: a figure of the build machine.
    """
    kth = exact_kth(vectors, rows, RECALL_K, metric, queries)
    name, ladder = search_ladder(index, ef_search=ef_search, nprobe=nprobe)

    def measure() -> float:
        return float(heldout_recall(index, vectors, rows, RECALL_K, metric, kth=kth, queries=queries).mean())

    def measure_both() -> float:  # the depth must also serve the passages themselves, which a recall gate asks
        own = heldout_recall(index, vectors, rows, RECALL_K, metric, kth=own_kth).mean()
        return min(measure(), float(own))

    own_kth = exact_kth(vectors, rows, RECALL_K, metric) if refine_of(index) is not None and not k_factor else None
    depths = tune_depth(index, measure_both, name, ladder, recall_target=recall_target, k_factor=k_factor)
    tried: dict[int, float] = {}
    for value in ladder:
        set_search_params(index, **{name: value})
        tried[value] = measure()
        if tried[value] >= recall_target:
            break
    chosen = None
    if tried:
        chosen = next((v for v in tried if tried[v] >= recall_target), max(tried, key=tried.get))
        set_search_params(index, **{name: chosen})
        recall = tried[chosen]
    else:
        recall = measure()
    started = time.perf_counter()
    index.search(queries, RECALL_K + 1)
    seconds = time.perf_counter() - started
    search = {name: int(chosen)} if name else {}
    refine = refine_of(index)
    if refine is not None:
        search["k_factor_rf"] = int(refine.k_factor)  # FAISS's ParameterSpace name for IndexRefine's depth
    return {
        "search": search,
        "recall_at_10": round(recall, 4),
        "recall_target": recall_target,
        "qps": round(len(rows) / max(seconds, 1e-9), 1),
        "queries": len(rows),
        "threads": faiss.omp_get_max_threads(),
        "tried": {str(v): round(r, 4) for v, r in tried.items()},
        **({"tried_depth": {str(d): round(r, 4) for d, r in depths.items()}} if depths else {}),
    }
