"""Per-shard FAISS indexes: factory strings, the "auto" choice, building and serialising.

One FAISS index per passage shard. Row ``i`` of a shard's index is the shard's
``i``-th passage: ids are resolved through the shard's ids file, never through
FAISS ids (no ``IndexIDMap``: string passage ids do not fit in int64, and the
row order is already stored beside the index). Publishing shards as versions on
a store is :mod:`rag_core.index.versions`.

IVF shards of one version share one coarse quantizer: :func:`train_index`
trains the factory once on a sample of every shard's vectors, and each shard
adds its rows to a copy of that trained, empty index. Then the shards' lists
partition the lists of one index over all passages: searched at the same
nprobe they scan, together, exactly what that one index scans and return its
top-k (:mod:`rag_core.index.search` runs the coarse search once for all of
them). :func:`coarse_fingerprint` tells whether shards share it.

A shard is built tuned: :func:`build_tuned_shard` sets HNSW's efConstruction
before adding, then keeps the cheapest efSearch / nprobe whose recall@10
against exact search on held-out queries reaches the recall target
(:mod:`rag_core.index.tuning`); that setting, the recall and the QPS go into
the shard's manifest entry, and search applies them when it loads the shard.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Literal

import faiss
import numpy as np
from pydantic import BaseModel, Field

from rag_core.errors import WikiragError
from rag_core.index.tuning import (  # noqa: F401  (set_search_params, heldout_recall: re-exported)
    RECALL_K,
    apply_search_setting,
    heldout_recall,
    hnsw_of,
    refine_of,
    search_ladder,
    set_search_params,
    tune_search,
    tuning_queries,
)

METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}
FLAT_MAX_VECTORS = 10_000  # below this exact search is fast and a graph buys nothing
EXACT_RECALL = 0.999  # a recall target at or above this asks for exact search
HNSW_M = 32  # links per node: the RAG paper's HNSW32
EF_CONSTRUCTION = 160  # HNSW build candidate list (FAISS's default is 40); measured in docs/benchmarks.md
HNSW_EXTRA_BYTES = 16  # per vector: level, offsets and upper-level links (measured: 656 B for HNSW32_SQ8 at d=384)
IVF_ID_BYTES = 8  # an int64 id per vector in an inverted list
MIN_TRAIN_PER_LIST = 39  # FAISS warns below 39 training points per k-means centroid
PQ_SUBQUANTIZERS = (64, 48, 32, 24, 16, 8, 4)  # bytes per vector tried, largest (most accurate) first
TUNE_QUERY_COSINE = 0.45  # a tuning query's cosine to its passage: questions lie far (docs/benchmarks.md)
FAST_SCAN_LISTS_PER_SQRT = 1  # a 4-bit code is cheap to scan, a list dear to visit; index_bench runs 512 at 200k
FAST_SCAN_MIN_TRAIN = 1_000  # 4-bit PQ trains 16 centroids per sub-quantiser; fewer rows give poor codes
# auto keeps fast-scan only where a re-rank this deep reaches the target: MiniLM's codes ask for 8 (index_bench);
# a random encoder's vectors, all alike, need deeper, and a graph serves them better
AUTO_MAX_DEPTH = 64
TUNE_STREAM = 1  # tuning draws its queries from seed [seed, shard, 1]: apart from a gate's [seed, shard]


class IndexBuildError(WikiragError):
    """An index cannot be built from these vectors and settings."""


class IndexConfig(BaseModel):
    """How the index stage builds each shard's FAISS index; also the flow's parameter."""

    factory: str = Field("auto", description="FAISS factory string (Flat, HNSW32, IVF4096,PQ48, ...) or auto")
    metric: Literal["ip", "l2"] = Field("ip", description="inner product (DPR, normalised encoders) or L2")
    memory_budget_bytes: int | None = Field(None, gt=0, description="auto: RAM for the whole index; None = no limit")
    recall_target: float = Field(0.95, gt=0, le=1, description="recall@10 that build-time tuning (and auto) aim at")
    nprobe: int | None = Field(None, ge=1, description="IVF lists visited per query; None = tuned at build")
    ef_search: int | None = Field(None, ge=1, description="HNSW candidate list per query; None = tuned at build")
    ef_construction: int = Field(EF_CONSTRUCTION, ge=1, description="HNSW candidate list while adding vectors "
                                 "(set before add); default measured in docs/benchmarks.md")
    tune_queries: int = Field(1000, ge=1, description="held-out passages per shard that tuning searches (seeded)")
    tune_query_cosine: float = Field(TUNE_QUERY_COSINE, gt=0, le=1, description="cosine of a tuning query to its "
                                     "passage (1 = the passage as is); default measured in docs/benchmarks.md")
    train_sample: int = Field(100_000, ge=1, description="at most this many vectors (seeded sample) train IVF/PQ/SQ")
    seed: int = Field(0, description="seed of the training sample")

    def resolve_factory(self, n_vectors: int, dim: int, *, total_vectors: int | None = None,
                        shards: int = 1, fast_scan: bool = True) -> str:
        """The factory for a shard of ``n_vectors``; ``total_vectors`` is the whole index (default: the shard).

        ``shards`` > 1: the version's shards are trained once together (:func:`train_index`), so IVF lists
        are sized for the whole index and ``auto`` weighs the sharded search (see :func:`choose_factory`).
        ``fast_scan=False``: auto's choice without the fast-scan tier (see :func:`train_version_index`).
        """
        if self.factory != "auto":
            return self.factory
        total = total_vectors or n_vectors
        shard_n = total if shards > 1 else n_vectors
        return choose_factory(
            total, dim, self.memory_budget_bytes, self.recall_target,
            shard_vectors=shard_n, train_vectors=min(shard_n, self.train_sample), shards=shards, fast_scan=fast_scan,
        )


def ivf_lists(shard_vectors: int, train_vectors: int | None = None, *, per_sqrt: int = 4,
              min_train: int = MIN_TRAIN_PER_LIST) -> int:
    """About ``per_sqrt``*sqrt(n) lists, a power of two, with at least ``min_train`` training vectors per list."""
    train = shard_vectors if train_vectors is None else train_vectors
    cap = max(1, min(train // min_train, 1 << 16))
    lists = 1 << max(0, round(math.log2(max(1.0, per_sqrt * math.sqrt(max(shard_vectors, 1))))))
    return lists if lists <= cap else 1 << int(math.log2(cap))


def choose_factory(
    n_vectors: int,
    dim: int,
    memory_budget_bytes: int | None = None,
    recall_target: float = 0.95,
    *,
    shard_vectors: int | None = None,
    train_vectors: int | None = None,
    shards: int = 1,
    fast_scan: bool = True,
) -> str:
    """The ``auto`` rule: the most accurate index family whose memory fits the budget.

    ``n_vectors`` and ``memory_budget_bytes`` describe the whole index (every shard
    is held in RAM by whoever searches); IVF list counts follow one shard's size
    (``shard_vectors``, default the whole) and its training set (``train_vectors``).
    Tried in order, the first that fits wins (bytes per vector, ``d`` = dim):

    1. ``Flat`` (4d) when n <= 10,000 or the recall target is >= 0.999: exact,
       and at that size as fast as any approximate index.
    2. ``HNSW32`` (4d + 8*32 + 16): the RAG paper's index. Costs more than
       Flat, so it is chosen only when memory allows; its recall and speed on
       real embeddings are in docs/benchmarks.md (they depend on the data:
       repeated texts hurt it badly).
    3. ``HNSW32_SQ8`` (d + 8*32 + 16): the same graph over 8-bit scalar codes;
       recall@10 0.989 at 656 B/vector (d=384), a quarter of the vector bytes.
    4. ``IVF{k},SQ8`` (d + 8): drops the graph; k ~ 4*sqrt(shard) lists, a power
       of two (FAISS's guideline, as autofaiss uses), at least 39 training
       vectors per list. Recall depends on nprobe, which the recall target sets.
    5. ``OPQ{m},IVF{k},PQ{m}`` (m + 8) with the largest m in 64..4 that fits:
       product quantisation for budgets below one byte per dimension. OPQ's
       rotation matters (IVF1024,PQ48 gave 0.63 recall@10 here, with OPQ 0.84);
       when d is not a multiple of m, OPQ also maps to the next multiple.
       Its training is slow (minutes per shard). A flat refine lifted it to
       0.998 but stores the raw vectors again (4d), so under a budget this
       tight it cannot fit: when the recall gate fails here, the fix is more
       memory (a higher tier), not a refine.

    A version of ``shards`` > 1 is trained together (:func:`train_index`): its
    IVF tiers size their lists for the whole index (the shards share one coarse
    quantizer and, searched together, cost what one such index costs), and the
    per-shard fixed costs count once per shard. Above Flat's size such a
    version first tries

    0. :func:`fast_scan_factory`, ``IVF{k},PQ{d/2}x4fs,RFlat`` (4d + d/4 + 8):
       4-bit codes of two dimensions scanned with SIMD, the best candidates
       re-ranked on the raw vectors, k ~ sqrt(n) lists (scanning a 4-bit code
       is cheap, visiting a list is not). HNSW32 shards each cost nearly a
       whole graph walk, so 4 of them search at half one HNSW32's QPS; these
       shards, loaded together, are one index (docs/benchmarks.md, "4 IVF
       shards trained together against one index"). How many candidates to
       re-rank depends on the encoder, so tuning sets that depth with nprobe
       (:func:`rag_core.index.tuning.tune_depth`); where no depth up to
       AUTO_MAX_DEPTH reaches the target on the version's own vectors, the
       version takes the next tier instead (:func:`train_version_index`;
       ``fast_scan=False`` skips this one).

    Fixed costs (IVF centroids, OPQ matrix, per shard) count against the budget.
    The recall target is a prior, not a guarantee: the recall gate measures it.
    """
    if n_vectors < 0 or dim < 1:
        raise IndexBuildError(f"cannot size an index for {n_vectors} vectors of dimension {dim}")
    shard_n = max(1, shard_vectors or n_vectors)
    train_n = shard_n if train_vectors is None else train_vectors
    n_shards = max(shards, math.ceil(n_vectors / shard_n))
    budget = math.inf if memory_budget_bytes is None else memory_budget_bytes

    def fits(per_vector: float, per_shard: float = 0.0) -> bool:
        return n_vectors * per_vector + n_shards * per_shard <= budget

    if (n_vectors <= FLAT_MAX_VECTORS or recall_target >= EXACT_RECALL) and fits(4 * dim):
        return "Flat"
    graph = 8 * HNSW_M + HNSW_EXTRA_BYTES
    fast_lists = ivf_lists(shard_n, train_n, per_sqrt=FAST_SCAN_LISTS_PER_SQRT)
    if fast_scan and shards > 1 and train_n >= FAST_SCAN_MIN_TRAIN and fits(fast_scan_bytes(dim), 4 * dim * (fast_lists + 8)):
        return fast_scan_factory(fast_lists, dim)
    if fits(4 * dim + graph):
        return f"HNSW{HNSW_M}"
    if fits(dim + graph, 8 * dim):
        return f"HNSW{HNSW_M}_SQ8"
    lists = ivf_lists(shard_n, train_n)
    if fits(dim + IVF_ID_BYTES, 4 * dim * lists + 8 * dim):
        return f"IVF{lists},SQ8"
    if train_n >= 256:  # 8-bit PQ trains 256 centroids per sub-quantiser
        for m in (m for m in PQ_SUBQUANTIZERS if m < dim):
            d_out = m * math.ceil(dim / m)
            if fits(m + IVF_ID_BYTES, 4 * d_out * (lists + dim + 256)):
                opq = f"OPQ{m}" if d_out == dim else f"OPQ{m}_{d_out}"
                return f"{opq},IVF{lists},PQ{m}"
    smallest = n_vectors * (PQ_SUBQUANTIZERS[-1] + IVF_ID_BYTES)
    raise IndexBuildError(
        f"a memory budget of {memory_budget_bytes} bytes cannot hold {n_vectors} vectors of dimension {dim} "
        f"(the smallest index, PQ4, needs about {smallest} bytes and 256 training vectors); "
        "raise memory_budget_bytes or spread the shards over more machines"
    )


def build_shard_index(
    vectors: np.ndarray,
    config: IndexConfig,
    train_vectors: np.ndarray | None = None,
    *,
    total_vectors: int | None = None,
    shard_id: int = 0,
) -> faiss.Index:
    """:func:`build_tuned_shard` without its report: the index, its search setting tuned and saved with it."""
    return build_tuned_shard(vectors, config, train_vectors, total_vectors=total_vectors, shard_id=shard_id)[0]


def build_tuned_shard(
    vectors: np.ndarray,
    config: IndexConfig,
    train_vectors: np.ndarray | None = None,
    *,
    total_vectors: int | None = None,
    shard_id: int = 0,
    trained: TrainedIndex | None = None,
) -> tuple[faiss.Index, dict[str, Any]]:
    """A FAISS index over one shard's ``vectors`` (float32 ``[n, d]``; row i is vector i), tuned, and its report.

    Trains (when the factory needs it) on a seeded sample of at most
    ``config.train_sample`` rows of ``train_vectors`` (default: ``vectors``),
    sets HNSW's efConstruction before adding, then tunes the search setting
    (:func:`rag_core.index.tuning.tune_search` on :func:`shard_tuning_queries`,
    seeded by ``config.seed`` and ``shard_id``).
    The index keeps the setting; the report (``{"search": {"efSearch": 96},
    "recall_at_10": 0.97, "qps": ..., ...}``) belongs in the shard's manifest
    ``meta``, from which search applies it (:func:`apply_search_setting`).
    ``total_vectors`` (the whole index) lets ``auto`` size the index family for
    the whole and the IVF lists for this shard. ``trained`` (from
    :func:`train_index`, once for all shards of a version) replaces training:
    the shard adds its rows to a copy of it, so IVF shards share one coarse
    quantizer, and the report names it (``coarse_sha256``); an IVF shard then
    keeps the version's nprobe that came with it and measures its recall at it
    (its own top-10, so below the target: the version's recall is the one
    index's). An empty shard gives an empty
    Flat index. A Flat index (or any other without a search parameter) is
    exact: it is not tuned, and its report is ``{"factory": ...}`` alone.
    Training is deterministic; HNSW graphs, built by several threads, may
    differ slightly from run to run.
    """
    x = as_matrix(vectors, "vectors")
    n, dim = x.shape
    metric = METRICS[config.metric]
    if n == 0:
        return faiss.IndexFlat(dim, metric), {"factory": "Flat"}
    train = x if train_vectors is None else as_matrix(train_vectors, "train_vectors")
    if train.shape[1] != dim:
        raise IndexBuildError(
            f"train_vectors have dimension {train.shape[1]}, vectors {dim}; pass vectors of one encoder"
        )
    if trained is not None:
        if trained.index.d != dim or trained.index.metric_type != metric or trained.index.ntotal:
            raise IndexBuildError(
                f"the trained {trained.factory!r} index holds {trained.index.ntotal} vectors of dimension "
                f"{trained.index.d} ({'ip' if trained.index.metric_type == faiss.METRIC_INNER_PRODUCT else 'l2'}); "
                f"this shard needs an empty one of dimension {dim} ({config.metric}): train it on these vectors"
            )
        factory, index = trained.factory, faiss.clone_index(trained.index)
    else:
        factory = config.resolve_factory(n, dim, total_vectors=total_vectors)
        index = train_index(train, config, factory).index
    hnsw = hnsw_of(index)
    if hnsw is not None:
        hnsw.efConstruction = config.ef_construction  # read by add(): too late to change afterwards
    index.add(x)
    if search_ladder(index)[0] is None and refine_of(index) is None:  # Flat and the like: exact, nothing to tune
        return index, {"factory": factory}
    rows, queries = shard_tuning_queries(x, config, shard_id)
    coarse = coarse_fingerprint(index)
    nprobe, k_factor = config.nprobe, None
    if trained is not None and coarse is not None:  # the version's nprobe and depth, measured here, not tuned
        nprobe = nprobe or faiss.extract_index_ivf(trained.index).nprobe
        k_factor = int(refine_of(trained.index).k_factor) if refine_of(trained.index) is not None else None
    shared = {"coarse_sha256": coarse} if trained is not None and coarse else {}
    report = {"factory": factory, **shared, **tune_search(index, x, rows, queries, recall_target=config.recall_target,
                                                          metric=config.metric, ef_search=config.ef_search,
                                                          nprobe=nprobe, k_factor=k_factor)}
    if hnsw is not None:
        report["ef_construction"] = int(hnsw.efConstruction)
    return index, report


@dataclass(frozen=True)
class TrainedIndex:
    """A trained, empty index and its factory: what every shard of a version copies and fills.

    An IVF index carries the version's nprobe (saved with it), tuned on the training sample: see
    :func:`train_index`."""

    factory: str
    index: faiss.Index
    report: dict | None = None  # the tuning report on the training sample, for an index that has a setting


def train_version_index(sample: np.ndarray, config: IndexConfig, *, total_vectors: int, shards: int) -> TrainedIndex:
    """The index every shard of a version copies: ``config``'s factory for the version, trained on ``sample``.

    ``auto`` decides on the vectors themselves where fast-scan is its pick: when
    no re-rank depth up to AUTO_MAX_DEPTH reaches the recall target on the
    training sample (the encoder's vectors are too alike for 4-bit codes), the
    version gets auto's next tier (HNSW32 without a budget), which a stored
    trained index names for every shard (an empty graph, or a trained IVF).
    """
    n, dim = as_matrix(sample, "sample").shape
    trained = train_index(sample, config, total_vectors=total_vectors, shards=shards)
    if config.factory != "auto" or not fast_scan_falls_short(trained, config.recall_target):
        return trained
    fallback = config.resolve_factory(n, dim, total_vectors=total_vectors, shards=shards, fast_scan=False)
    return train_index(sample, config, fallback, total_vectors=total_vectors, shards=shards)


def fast_scan_falls_short(trained: TrainedIndex, recall_target: float) -> bool:
    """A refined index whose tuning on its sample missed the target, or reached it at no re-rank depth up to
    AUTO_MAX_DEPTH (the depth tuning keeps may be deeper: it also leaves nprobe headroom)."""
    report = trained.report
    if refine_of(trained.index) is None or report is None:
        return False
    shallow = [r for d, r in report.get("tried_depth", {}).items() if int(d) <= AUTO_MAX_DEPTH]
    within = report["search"].get("k_factor_rf", 0) <= AUTO_MAX_DEPTH or max(shallow, default=0.0) >= recall_target
    return report["recall_at_10"] < recall_target or not within


def train_index(sample: np.ndarray, config: IndexConfig, factory: str | None = None, *,
                total_vectors: int | None = None, shards: int = 1) -> TrainedIndex:
    """An empty index of ``factory`` (default: ``config``'s, resolved for ``total_vectors`` in ``shards``
    trained together), trained on at most ``config.train_sample`` seeded rows of ``sample``.

    Trained once on a sample of every shard's vectors, it gives the shards one coarse quantizer (and one
    scalar/product quantizer): see the module docstring. Training is deterministic for a given sample.
    An IVF index also gets the version's nprobe (``config.nprobe``, else tuned like a shard's on a copy
    filled with the sample): the shards' lists together are the one index's, so they search at the nprobe
    one index needs. A shard tuned alone would look for its own top-10 among a quarter of the passages, and
    ask for several times more lists.
    """
    x = as_matrix(sample, "sample")
    n, dim = x.shape
    factory = factory or config.resolve_factory(n, dim, total_vectors=total_vectors or n, shards=shards)
    try:
        index = faiss.index_factory(dim, factory, METRICS[config.metric])
    except RuntimeError as exc:
        raise IndexBuildError(
            f"FAISS does not understand the factory string {factory!r} ({_faiss_message(exc)}); "
            "use e.g. Flat, HNSW32, IVF1024,SQ8, OPQ48,IVF1024,PQ48 or auto"
        ) from exc
    if not index.is_trained:
        if n > config.train_sample:
            rows = np.random.default_rng(config.seed).choice(n, config.train_sample, replace=False)
            x = x[np.sort(rows)]
        try:
            index.train(x)
        except RuntimeError as exc:
            raise IndexBuildError(
                f"training {factory!r} on {len(x)} vectors failed ({_faiss_message(exc)}); "
                "give more training vectors or choose fewer IVF lists / PQ centroids"
            ) from exc
    if coarse_quantizer(index) is not None and len(x) > 1:
        sample = faiss.clone_index(index)
        sample.add(x)
        rows, queries = shard_tuning_queries(x, config)
        report = tune_search(sample, x, rows, queries, recall_target=config.recall_target, metric=config.metric,
                             nprobe=config.nprobe)
        set_search_params(index, **report["search"])  # saved with the index: every copy starts from it
        return TrainedIndex(factory, index, report)
    return TrainedIndex(factory, index)


def shard_tuning_queries(vectors: np.ndarray, config: IndexConfig, shard_id: int = 0, *, n: int | None = None,
                         stream: int = TUNE_STREAM) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, queries)``: held-out, question-like queries of shard ``shard_id`` (see
    :func:`rag_core.index.tuning.tuning_queries`): ``config.tune_queries`` of them (or ``n``), seeded by
    ``[config.seed, shard_id, stream]``. Tuning uses ``stream`` TUNE_STREAM; a recall gate measuring the
    tuned index should draw its own with another stream, so that it does not grade tuning on its own queries.
    """
    return tuning_queries(vectors, config.tune_queries if n is None else n, config.tune_query_cosine,
                          [config.seed, shard_id, stream])


def needs_training(factory: str, dim: int) -> bool:
    """Whether ``factory`` must be trained before vectors are added (IVF, SQ, PQ, OPQ)."""
    try:
        return not faiss.index_factory(dim, factory).is_trained
    except RuntimeError as exc:
        raise IndexBuildError(f"FAISS does not understand the factory string {factory!r} ({_faiss_message(exc)}); "
                              "use e.g. Flat, HNSW32, IVF1024,SQ8, OPQ48,IVF1024,PQ48 or auto") from exc


def coarse_quantizer(index: faiss.Index) -> faiss.Index | None:
    """The coarse quantizer of an index that is an IVF index itself, or refines one (not behind a transform)."""
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexRefine):
        inner = faiss.downcast_index(inner.base_index)
    return inner.quantizer if isinstance(inner, faiss.IndexIVF) else None


def fast_scan_factory(lists: int, dim: int) -> str:
    """IVF over 4-bit PQ codes of two dimensions each, scanned with SIMD, re-ranked on the raw vectors."""
    return f"IVF{lists},PQ{_fast_scan_codes(dim)}x4fs,RFlat"


def fast_scan_bytes(dim: int) -> float:
    """Bytes per vector of :func:`fast_scan_factory`: the 4-bit codes, the raw vectors and an id."""
    return _fast_scan_codes(dim) / 2 + 4 * dim + IVF_ID_BYTES


def _fast_scan_codes(dim: int) -> int:
    return dim // 2 if dim % 2 == 0 else dim  # sub-quantisers must divide the dimension


def coarse_fingerprint(index: faiss.Index) -> str | None:
    """sha256 of an IVF index's coarse centroids (None for other indexes).

    Shards with equal fingerprints were trained together (:func:`train_index`): list ``i`` is the same
    cell in each, so one coarse search serves them all.
    """
    quantizer = coarse_quantizer(index)
    if quantizer is None or quantizer.ntotal == 0:
        return None
    centroids = quantizer.reconstruct_n(0, quantizer.ntotal)  # [nlist, d]
    return sha256_hex(np.ascontiguousarray(centroids, dtype=np.float32).tobytes())


def as_matrix(vectors: Any, name: str) -> np.ndarray:
    """A C-contiguous float32 ``[n, d]`` array, or a clear error."""
    x = np.asarray(vectors)
    if x.ndim != 2 or x.shape[1] == 0 or not np.issubdtype(x.dtype, np.number):
        raise IndexBuildError(f"{name} must be a numeric [n, d] array, got shape {x.shape} and dtype {x.dtype}")
    return np.ascontiguousarray(x, dtype=np.float32)


def serialize_index(index: faiss.Index) -> bytes:
    return faiss.serialize_index(index).tobytes()


def deserialize_index(data: bytes) -> faiss.Index:
    return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _faiss_message(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[-1] if text else type(exc).__name__)[:200]
