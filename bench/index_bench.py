"""The index stage on realistic passages: the index ``auto`` picks against exact search, one index against shards.

Why: the index must answer top-10 queries much faster than exact search while
finding what exact search finds, at the search setting tuned when the shard
was built (``build_tuned_shard``); sharding must cost neither query speed nor
build memory, and searching shards must not oversubscribe the cores.

Corpora (rows): the recombined corpus of ``bench/make_corpus.py`` (default
200,000 distinct 100-word passages of real Wikipedia sentences) and the real
sample's own 4,391 passages. Vectors: the packaged all-MiniLM-L6-v2 at
``choose_precision("auto")``, cached in ``bench/.cache/``. Questions: of the
23,203 in ../shared/data/qa (NQ-open, EfficientQA, WebQuestions, CuratedTREC,
FEVER claims), the ``--queries`` closest to the corpus ("topical": a corpus of
98 articles' topics leaves most questions without a relevant passage, full
Wikipedia does not), and the first NQ-open dev questions as they come
("NQ-open", mostly off-topic here: a stress case). Recall@10 against exact
search (ann-benchmarks' definition: a found passage counts when its exact
inner product is at least the exact 10th best).

One run measures, on the same vectors, queries and cores:

* builds, each in a fresh process that reads only its rows: the whole index
  and each of ``--shards`` contiguous shards, ``IndexConfig()`` (auto) sized
  for the whole; seconds, bytes, peak-RSS rise, the setting tuning stored;
* searches, ``--repeats`` rounds, every contender timed once per round, so
  ratios are per round (min / median / max): exact (``IndexFlatIP``), one
  index and the shards (``ShardedIndex``) at their stored settings and at the
  cheapest common setting reaching recall 0.95 on the questions (equal
  recall), in three thread layouts, whole batches and one query per call;
* above 10,000 passages, IVF shards trained together: ``--together-factory``
  (default: ``fast_scan_factory``, auto's for a sharded version) trained once
  (``train_index``) on a sample of all vectors, one index and ``--shards``
  shards filling copies of it (one coarse quantizer), at the cheapest common
  nprobe reaching recall 0.95 on the questions, loaded as ``ShardedIndex.load``
  holds a version (lists merged into one index) and searched shard by shard,
  against the one index above at its own equal-recall setting; and ``DaskShardedIndex``
  over those shards on 1 against 2 one-thread LocalCluster workers (``--no-dask``
  skips it);
* on the recombined corpus also: the setting tuning picks at several query
  cosines against the settings the questions need, HNSW32's efConstruction on
  one shard, and Flat against HNSW32 on prefixes of growing size.

    python bench/make_corpus.py --passages 20000        # once: the --quick corpus (a few minutes)
    python bench/index_bench.py --quick                 # 20,000 passages, 500 questions, smoke test
    python bench/index_bench.py --markdown /tmp/index.md    # 200,000 passages (after make_corpus.py)
    python bench/index_bench.py --part main --rows 30000 --skip-sample   # the first 30,000, while make_corpus.py
                                                                          # is still encoding the rest
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]
import faiss  # noqa: E402
import pyarrow as pa  # noqa: E402
from report import RunInfo, reset_peak_rss, spread, status_bytes  # noqa: E402

from rag_core.index.embedding_files import shard_bounds  # noqa: E402
from rag_core.index.faiss_index import (  # noqa: E402
    FAST_SCAN_LISTS_PER_SQRT,
    FLAT_MAX_VECTORS,
    IndexConfig,
    build_tuned_shard,
    deserialize_index,
    fast_scan_factory,
    ivf_lists,
    serialize_index,
    train_index,
)
from rag_core.index.search import ShardedIndex, available_cores  # noqa: E402
from rag_core.index.tuning import (  # noqa: E402
    EF_SEARCH_LADDER,
    apply_search_setting,
    search_ladder,
    set_search_params,
    tune_search,
    tuning_queries,
)

K = 10
TARGET = 0.95  # recall@10 on the questions
SINGLE = 200  # questions searched one per call
GOAL_SPEEDUP = 5.0  # auto's QPS over exact search, at recall >= TARGET
GOAL_SHARDED = 0.9  # the shards' QPS over one index's, at equal recall
GOAL_SHARD_MEMORY = 0.3  # the largest shard's build-memory rise over the whole index's


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# -- inputs (encoded in a child process: torch never loads where FAISS is timed) -------------------


def _prefix_vectors(corpus: int, rows: int) -> Path | None:
    """The first ``rows`` vectors of the corpus, from its whole file or the chunks make_corpus.py wrote so far."""
    import make_corpus

    folder, fid = make_corpus.corpus_dir(corpus), make_corpus._encoder().fingerprint_id
    out = folder / f"prefix-{rows}-{fid}.npy"
    whole = make_corpus.corpus_vectors(corpus)
    if not out.exists() and whole is not None:
        np.save(out, np.load(whole, mmap_mode="r")[:rows])
    elif not out.exists():
        chunks = [folder / f"vectors-{fid}-{s:07d}.npy" for s in range(0, rows, make_corpus.CHUNK)]
        if not all(c.exists() for c in chunks):
            return None
        np.save(out, np.concatenate([np.load(c) for c in chunks])[:rows])
    return out


def _prepare(corpus: int, argv: list[str], rows: int | None = None,
             skip_sample: bool = False) -> tuple[RunInfo, dict[str, str], str, list[str]]:
    import make_corpus

    info = RunInfo.start(argv)
    paths = {}
    recombined = make_corpus.corpus_vectors(corpus) if rows is None else _prefix_vectors(corpus, rows)
    if recombined is None:
        log(f"no vectors of a {corpus:,}-passage corpus in {make_corpus.corpus_dir(corpus)}: run "
            f"`python bench/make_corpus.py --passages {corpus}` first; measuring the sample only")
    else:
        paths["recombined"] = str(recombined)
    if not skip_sample:
        paths["sample"] = str(make_corpus.sample_vectors())
    pool, sets = make_corpus.question_vectors()
    return info, paths, str(pool), sets


def question_sets(xb: np.ndarray, pool: np.ndarray, sets: np.ndarray, n: int) -> tuple[dict[str, np.ndarray], dict]:
    """``topical``: the ``n`` pool questions closest to any passage of ``xb`` (in pool order); ``NQ-open``: the
    first ``n`` NQ-open dev questions, most of them about topics the corpus lacks. And what was picked."""
    best, _ = faiss.knn(pool, xb, 1, metric=faiss.METRIC_INNER_PRODUCT)
    topical = np.sort(np.argsort(-best[:, 0], kind="stable")[:n])
    nq = np.flatnonzero(sets == "nq")[:n]
    picked = {name: int((sets[topical] == name).sum()) for name in dict.fromkeys(sets)}
    return ({"topical": pool[topical], "NQ-open": pool[nq]},
            {"pool": len(pool), "threshold": float(best[topical, 0].min()), "picked": picked})


# -- builds: a fresh process per index or shard ------------------------------------------------------


def _build_in_child(npy: str, start: int, stop: int, config: dict, total: int, shard: int, out: str) -> dict:
    """Read rows [start, stop), build and tune, serialise to ``out``; seconds, peak-RSS rise, the report."""
    reset_peak_rss()  # the peak the imports left is not the build's
    base = status_bytes("VmRSS")
    header = np.load(npy, mmap_mode="r")  # shape and data offset only
    d = header.shape[1]
    x = np.fromfile(npy, np.float32, (stop - start) * d, offset=header.offset + start * d * 4).reshape(-1, d)
    t0 = time.perf_counter()
    index, report = build_tuned_shard(x, IndexConfig(**config), total_vectors=total, shard_id=shard)
    seconds = time.perf_counter() - t0
    data = serialize_index(index)
    Path(out).write_bytes(data)
    return {"seconds": seconds, "rise": status_bytes("VmHWM") - base, "bytes": len(data), "report": report}


def build(npy: Path, start: int, stop: int, config: IndexConfig, total: int, shard: int,
          work: Path) -> tuple[faiss.Index, dict]:
    out = work / f"{start}-{stop}.faiss"
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        info = pool.submit(_build_in_child, str(npy), start, stop, config.model_dump(), total, shard,
                           str(out)).result()
    index = deserialize_index(out.read_bytes())
    out.unlink()
    apply_search_setting(index, info["report"])  # as load_shard does with the manifest's meta
    info["report"].setdefault("search", {})  # Flat: exact and untuned, its report names the factory alone
    info["report"].setdefault("recall_at_10", 1.0)
    log(f"  built rows {start:,}-{stop:,}: {info['report']['factory']} in {info['seconds']:.1f} s, "
        f"{info['report']['search']} (held-out recall {info['report']['recall_at_10']:.3f})")
    return index, info


# -- recall and timing ---------------------------------------------------------------------------------


@dataclass
class Truth:
    xb: np.ndarray  # [n, d]
    xq: np.ndarray  # [q, d]
    kth: np.ndarray  # [q] exact 10th-best inner product

    @classmethod
    def exact(cls, xb: np.ndarray, xq: np.ndarray) -> Truth:
        scores, _ = faiss.knn(xq, xb, K, metric=faiss.METRIC_INNER_PRODUCT)
        return cls(xb, xq, scores[:, -1].astype(np.float64))

    def recall(self, found: np.ndarray) -> float:
        """Share of found rows ``[q, K]`` whose exact score reaches the exact 10th best (-1: missing)."""
        ok = found >= 0
        exact = np.einsum("qd,qkd->qk", self.xq, self.xb[np.where(ok, found, 0)], dtype=np.float64)
        return float((ok & (exact >= self.kth[:, None] - 1e-5)).sum() / found.size)


class Searcher:
    """One contender: a search function over query batches returning global rows ``[q, K]``."""

    def __init__(self, label: str, search, set_param=None) -> None:
        self.label, self.search, self.set_param = label, search, set_param

    def qps(self, xq: np.ndarray) -> float:
        t0 = time.perf_counter()
        self.search(xq)
        return len(xq) / (time.perf_counter() - t0)

    def qps_single(self, xq: np.ndarray) -> float:
        t0 = time.perf_counter()
        for q in xq[:SINGLE]:
            self.search(q[None])
        return min(SINGLE, len(xq)) / (time.perf_counter() - t0)


def one_index(label: str, index: faiss.Index) -> Searcher:
    """One index searched as a one-shard ``ShardedIndex``: the library's thread rules, as a user gets them."""
    return sharded(label, [index], np.array([0]))


def sharded(label: str, shards: list[faiss.Index], offsets: np.ndarray, **layout) -> Searcher:
    tables = [pa.table({"passage_id": pa.array(np.arange(i.ntotal).astype(str))}) for i in shards]
    index = ShardedIndex(shards, tables, **layout)
    name = search_ladder(shards[0])[0] or "efSearch"

    def search(xq: np.ndarray) -> np.ndarray:
        _, shard, row = index.search_rows(xq, K)
        return np.where(row >= 0, offsets[shard] + row, -1)

    def set_param(value: int) -> None:
        for shard in shards:
            set_search_params(shard, **{name: value})

    searcher = Searcher(label, search, set_param)
    searcher.layout = f"{index.workers} x {index.threads_per_search}"
    return searcher


def cheapest(searcher: Searcher, truth: Truth, ladder=EF_SEARCH_LADDER) -> tuple[int | None, float]:
    """The cheapest value of the ladder reaching TARGET on the questions (the best one when none does)."""
    tried = {}
    for value in ladder:
        searcher.set_param(value)
        tried[value] = truth.recall(searcher.search(truth.xq))
        if tried[value] >= TARGET:
            return value, tried[value]
    best = max(tried, key=tried.get)
    searcher.set_param(best)
    return best, tried[best]


def rounds(searchers: list[Searcher], xq: np.ndarray, repeats: int, single: bool = True) -> dict[str, dict]:
    """QPS per round for each searcher, interleaved (batch, then one query per call)."""
    for s in searchers:
        s.search(xq[:50])  # warm-up: thread pools, caches
    out = {s.label: {"batch": [], "single": []} for s in searchers}
    for _ in range(repeats):
        for s in searchers:
            out[s.label]["batch"].append(s.qps(xq))
            if single:
                out[s.label]["single"].append(s.qps_single(xq))
    return out


def ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b)]


# -- one corpus ------------------------------------------------------------------------------------------


@dataclass
class CorpusResult:
    name: str
    n: int
    stats: dict
    factory: str = ""
    whole: dict = field(default_factory=dict)  # build info of the whole index
    shards: list[dict] = field(default_factory=list)
    recall: dict = field(default_factory=dict)  # label -> recall@10 on the questions
    setting: dict = field(default_factory=dict)  # label -> efSearch used (None: exhaustive)
    qps: dict = field(default_factory=dict)  # label -> {"batch": [...], "single": [...]}
    layouts: dict = field(default_factory=dict)  # label -> "workers x threads"
    questions: dict = field(default_factory=dict)  # set name -> [q, d]
    offtopic: dict = field(default_factory=dict)  # the NQ-open set against the same one index
    together: dict = field(default_factory=dict)  # IVF shards trained together: factory, settings, builds
    dask: list = field(default_factory=list)  # Dask workers against QPS, the shards trained together


def distribution(xb: np.ndarray, questions: dict[str, np.ndarray], rng: np.random.Generator) -> dict:
    """How close passages lie to each other and to each question set (what makes ANN search hard or easy)."""
    rows = rng.choice(len(xb), min(2000, len(xb)), replace=False)
    nn, _ = faiss.knn(xb[rows], xb, 2, metric=faiss.METRIC_INNER_PRODUCT)  # [:, 0] is the passage itself
    out = {"nn": np.percentile(nn[:, 1], [10, 50, 90]), "dup": float((nn[:, 1] >= 0.95).mean())}
    for name, xq in questions.items():
        top, _ = faiss.knn(xq, xb, K, metric=faiss.METRIC_INNER_PRODUCT)
        out[name] = (float(np.median(top[:, 0])), float(np.median(top[:, -1])))
    return out


def measure_corpus(name: str, npy: Path, pool: np.ndarray, sets: np.ndarray, args, work: Path) -> CorpusResult:
    xb = np.load(npy)
    n = len(xb)
    questions, picked = question_sets(xb, pool, sets, args.queries)
    xq = questions["topical"]
    log(f"{name}: {n:,} vectors, {len(xq):,} questions")
    truth = Truth.exact(xb, xq)
    result = CorpusResult(name, n, distribution(xb, questions, np.random.default_rng(0)), questions=questions)
    result.stats["questions"] = picked
    config = IndexConfig()
    index, result.whole = build(npy, 0, n, config, n, 0, work)
    result.factory = result.whole["report"]["factory"]
    bounds = [shard_bounds(n, s, args.shards) for s in range(args.shards)]
    built = [build(npy, a, b, config, n, s, work) for s, (a, b) in enumerate(bounds)]
    shards, result.shards = [i for i, _ in built], [info for _, info in built]
    offsets = np.array([a for a, _ in bounds])
    exact = faiss.IndexFlatIP(xb.shape[1])
    exact.add(xb)
    contenders = {"exact": one_index("exact", exact), "one index, stored": one_index("one index, stored", index),
                  "shards, stored": sharded("shards, stored", shards, offsets)}
    for label, s in contenders.items():
        result.recall[label] = truth.recall(s.search(xq))
    result.setting["one index, stored"] = result.whole["report"]["search"].get("efSearch")
    result.setting["shards, stored"] = [i["report"]["search"].get("efSearch") for i in result.shards]
    hnsw = isinstance(faiss.downcast_index(index), faiss.IndexHNSW)
    timed = [contenders["exact"], contenders["one index, stored"], contenders["shards, stored"]]
    result.qps = rounds(timed, xq, args.repeats)
    if hnsw:  # equal recall: the cheapest common efSearch reaching TARGET on the questions, per layout
        one = one_index("one index, equal recall", deserialize_index(serialize_index(index)))
        layouts = [sharded("shards, equal recall", [deserialize_index(serialize_index(s)) for s in shards],
                           offsets),
                   sharded("shards, sequential", [deserialize_index(serialize_index(s)) for s in shards],
                           offsets, max_workers=1),
                   sharded("shards, oversubscribed", [deserialize_index(serialize_index(s)) for s in shards],
                           offsets, max_workers=args.shards, threads=args.shards * available_cores())]
        ef_one, result.recall[one.label] = cheapest(one, truth)
        best = one
        ef_shards, recall_shards = cheapest(layouts[0], truth)
        result.setting[one.label] = ef_one
        for s in layouts:
            s.set_param(ef_shards)
            result.recall[s.label], result.setting[s.label] = recall_shards, ef_shards
            result.layouts[s.label] = s.layout
        result.qps |= rounds([contenders["exact"], one, *layouts], xq, args.repeats)
    else:  # exhaustive shards: recall is 1 everywhere; only the thread layouts differ
        best = contenders["one index, stored"]
        layouts = [sharded("shards, sequential", shards, offsets, max_workers=1),
                   sharded("shards, oversubscribed", shards, offsets, max_workers=args.shards,
                           threads=args.shards * available_cores())]
        for s in layouts:
            result.recall[s.label], result.layouts[s.label] = truth.recall(s.search(xq)), s.layout
        result.qps |= rounds(layouts, xq, args.repeats)
    result.layouts["shards, stored"] = contenders["shards, stored"].layout
    if "shards, equal recall" not in result.layouts:
        result.layouts["shards, equal recall"] = result.layouts["shards, stored"]
    if hnsw:  # the same index and exact search, asked off-topic questions
        nq = Truth.exact(xb, questions["NQ-open"])
        one = one_index("off-topic, stored", index)
        apply_search_setting(index, result.whole["report"])
        stored = nq.recall(one.search(nq.xq))
        qps = rounds([contenders["exact"], one], nq.xq, args.repeats, single=False)
        again = one_index("off-topic, equal recall", deserialize_index(serialize_index(index)))
        ef, recall = cheapest(again, nq)
        qps |= rounds([again], nq.xq, args.repeats, single=False)
        result.offtopic = {"recall": stored, "setting": ef, "recall_needed": recall, "qps": qps}
    if n > FLAT_MAX_VECTORS:
        measure_together(result, xb, truth, offsets, best, args)
        if args.dask:
            result.dask = measure_dask(result.together.pop("indexes"), offsets, xb.shape[1], xq, args, work)
    return result


def measure_together(result: CorpusResult, xb: np.ndarray, truth: Truth, offsets: np.ndarray, best: Searcher,
                     args) -> None:
    """IVF shards trained together (``train_index`` once; ``--together-factory``, default
    ``fast_scan_factory`` with sqrt(n) lists) against one index filled from the same trained index, and
    against ``best`` (auto's one index at equal recall): equal-recall QPS. Layouts: loaded (the shards' lists
    merged into one index, as ``ShardedIndex.load`` holds a version), shard by shard (one coarse search, each
    shard scanning its part: shards handed in, or held by Dask workers), and the same one shard at a time."""
    config, n = IndexConfig(), len(xb)
    factory = args.together_factory or fast_scan_factory(ivf_lists(n, per_sqrt=FAST_SCAN_LISTS_PER_SQRT), xb.shape[1])
    t0 = time.perf_counter()
    trained = train_index(xb, config, factory, total_vectors=n, shards=args.shards)
    train_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    whole, whole_report = build_tuned_shard(xb, config, trained=trained)
    whole_s = time.perf_counter() - t0
    built = []
    for s, (a, b) in enumerate(zip(offsets, [*offsets[1:], n])):
        t0 = time.perf_counter()
        built.append((*build_tuned_shard(xb[a:b], config, trained=trained, shard_id=s), time.perf_counter() - t0))
    shards = [i for i, _, _ in built]
    log(f"  trained together: {trained.factory}; training {train_s:.1f} s, whole {whole_s:.1f} s, shards "
        f"{', '.join(f'{t:.1f}' for *_, t in built)} s; stored setting {whole_report['search']} / "
        f"{[r['search'] for _, r, _ in built]}")
    one = one_index("IVF, one index", whole)
    layouts = [sharded("IVF shards, loaded", [faiss.clone_index(i) for i in shards], offsets, merge=True),
               sharded("IVF shards", shards, offsets),
               sharded("IVF shards, sequential", shards, offsets, max_workers=1)]
    ladder = search_ladder(whole)[1]
    nprobe, recall_one = cheapest(one, truth, ladder)
    for s in layouts:
        s.set_param(nprobe)
    recalls = {s.label: truth.recall(s.search(truth.xq)) for s in [one, *layouts]}
    qps = rounds([best, one, *layouts], truth.xq, args.repeats)
    auto = trained.factory == config.resolve_factory(n, xb.shape[1], total_vectors=n, shards=args.shards)
    depth = whole_report["search"].get("k_factor_rf")  # the version's, kept by every shard
    result.together = {"factory": trained.factory, "auto": auto, "nprobe": nprobe, "depth": depth,
                       "recall": recalls, "qps": qps,
                       "best": best.label, "layouts": {s.label: s.layout for s in layouts},
                       "stored": [whole_report["search"].get("nprobe"), *[r["search"].get("nprobe") for _, r, _ in
                                                                          built]],
                       "seconds": {"train": train_s, "whole": whole_s, "shards": [t for *_, t in built]},
                       "indexes": shards}
    for label in ("IVF shards, loaded", "IVF shards"):
        log(f"  nprobe {nprobe}: recall {recalls}; {label} / one IVF "
            f"{np.median(ratios(qps[label]['batch'], qps[one.label]['batch'])):.2f}, / {best.label} "
            f"{np.median(ratios(qps[label]['batch'], qps[best.label]['batch'])):.2f}")


def measure_dask(shards: list[faiss.Index], offsets: np.ndarray, dim: int, xq: np.ndarray, args,
                 work: Path) -> list[dict]:
    """QPS of ``DaskShardedIndex`` over the shards (published to a local store) on 1 and on 2 one-thread
    workers of a LocalCluster, per round the two clusters in turn."""
    from distributed import Client, LocalCluster

    try:
        from tasks.adapters.dask_retriever import DaskShardedIndex
    except ImportError:  # before the adapters' move
        from tasks.adapters.dask_retriever import DaskShardedIndex
    from rag_core.index.versions import ShardPayload, publish_version
    from rag_core.storage import Store

    store = Store(str(work / "dask-store"))
    payloads = [ShardPayload(serialize_index(i), pa.table({"passage_id": pa.array(
        (offsets[s] + np.arange(i.ntotal)).astype(str))})) for s, i in enumerate(shards)]
    version = publish_version(store, payloads, {"dim": dim, "metric": "ip", "factory": "bench"})
    with contextlib.ExitStack() as stack:
        indexes = {}
        for workers in (1, 2):
            cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                       host="127.0.0.1", dashboard_address=None))
            client = stack.enter_context(Client(cluster, set_as_default=False))
            indexes[workers] = stack.enter_context(DaskShardedIndex.load(client, store, version))
            indexes[workers].search_rows(xq[:50], K)  # warm-up: workers' imports, thread pools
        qps = {workers: [] for workers in indexes}
        for _ in range(args.repeats):
            for workers, index in indexes.items():
                t0 = time.perf_counter()
                index.search_rows(xq, K)
                qps[workers].append(len(xq) / (time.perf_counter() - t0))
    for workers, values in qps.items():
        log(f"  Dask, {workers} one-thread worker(s): {np.median(values):,.0f} QPS")
    return [{"workers": workers, "qps": values} for workers, values in qps.items()]


# -- efConstruction and the Flat / HNSW threshold (recombined corpus) -----------------------------------


def measure_ef_construction(npy: Path, xq: np.ndarray, args) -> list[dict]:
    """HNSW32 over the first shard's rows for each efConstruction: build, tuning, recall, QPS vs exact."""
    xb_all = np.load(npy, mmap_mode="r")
    a, b = shard_bounds(len(xb_all), 0, args.shards)
    xb = np.ascontiguousarray(xb_all[a:b])
    truth = Truth.exact(xb, xq)
    exact = faiss.IndexFlatIP(xb.shape[1])
    exact.add(xb)
    rows = []
    for ef in args.ef_constructions:
        t0 = time.perf_counter()
        index, report = build_tuned_shard(xb, IndexConfig(factory="HNSW32", ef_construction=ef))
        seconds = time.perf_counter() - t0
        stored = report["search"]["efSearch"]
        recall_stored = truth.recall(index.search(xq, K)[1])
        searcher = one_index(f"efC {ef}", index)
        needed, recall = cheapest(searcher, truth)
        qps = rounds([one_index("exact", exact), searcher], xq, args.repeats, single=False)
        rows.append({"ef": ef, "seconds": seconds, "stored": stored, "heldout": report["recall_at_10"],
                     "recall_stored": recall_stored, "needed": needed, "recall": recall,
                     "qps": qps[searcher.label]["batch"], "exact": qps["exact"]["batch"]})
        log(f"  efConstruction {ef}: {seconds:.0f} s, stored efSearch {stored} -> recall {recall_stored:.3f}; "
            f"needs {needed} for {recall:.3f}")
    return rows


def measure_tuning_queries(npy: Path, questions: dict[str, np.ndarray], args) -> list[dict]:
    """On the first shard's rows: the setting tuning picks at each query cosine, against what questions need."""
    xb_all = np.load(npy, mmap_mode="r")
    a, b = shard_bounds(len(xb_all), 0, args.shards)
    xb = np.ascontiguousarray(xb_all[a:b])
    truths = {name: Truth.exact(xb, xq) for name, xq in questions.items()}
    rows = []
    for factory in ("HNSW32", f"IVF{ivf_lists(len(xb))},SQ8"):
        index, _ = build_tuned_shard(xb, IndexConfig(factory=factory, tune_queries=10))
        name, ladder = search_ladder(index)
        searcher = one_index(factory, index)
        needs = {q: cheapest(searcher, truth, ladder) for q, truth in truths.items()}
        for cosine in args.cosines:
            held, moved = tuning_queries(xb, 1000, cosine, [0, 0, 1])
            report = tune_search(index, xb, held, moved, recall_target=TARGET)
            value = report["search"][name]
            at = {q: truth.recall(searcher.search(truth.xq)) for q, truth in truths.items()}  # tune_search set it
            rows.append({"factory": factory, "param": name, "cosine": cosine, "tuned": value,
                         "tuning_recall": report["recall_at_10"], "at": at, "needs": needs})
            log(f"  {factory} cosine {cosine}: tuned {name} {value}; questions need "
                f"{ {q: v for q, (v, _) in needs.items()} }, recall at tuned {at}")
    return rows


def measure_batch_threads(npy: Path, xq: np.ndarray, args) -> list[dict]:
    """Raw FAISS on the first shard's rows: QPS with one thread against every core, by batch size."""
    xb_all = np.load(npy, mmap_mode="r")
    a, b = shard_bounds(len(xb_all), 0, args.shards)
    xb = np.ascontiguousarray(xb_all[a:b])
    flat = faiss.IndexFlatIP(xb.shape[1])
    flat.add(xb)
    hnsw, _ = build_tuned_shard(xb, IndexConfig(factory="HNSW32"))
    cores, rows = available_cores(), []
    for name, index in (("Flat", flat), ("HNSW32, stored setting", hnsw)):
        for nq in args.batches:
            calls = max(1, 512 // nq)
            qps = {1: [], cores: []}
            for _ in range(args.repeats):
                for threads in qps:
                    faiss.omp_set_num_threads(threads)
                    t0 = time.perf_counter()
                    for c in range(calls):
                        start = c * nq % max(1, len(xq) - nq)
                        index.search(xq[start:start + nq], K)
                    qps[threads].append(calls * nq / (time.perf_counter() - t0))
            faiss.omp_set_num_threads(cores)
            rows.append({"index": name, "nq": nq, "one": qps[1], "all": qps[cores]})
            log(f"  {name}, batches of {nq}: {np.median(ratios(qps[cores], qps[1])):.2f}x with {cores} threads")
    return rows


def measure_sizes(npy: Path, xq: np.ndarray, args) -> list[dict]:
    """Flat against HNSW32 (default efConstruction, efSearch reaching TARGET) on growing prefixes."""
    xb_all = np.load(npy, mmap_mode="r")
    rows = []
    for size in args.sizes:
        xb = np.ascontiguousarray(xb_all[:size])
        truth = Truth.exact(xb, xq)
        flat = faiss.IndexFlatIP(xb.shape[1])
        flat.add(xb)
        index, report = build_tuned_shard(xb, IndexConfig(factory="HNSW32"))
        searcher = one_index(f"HNSW32 {size}", index)
        needed, recall = cheapest(searcher, truth)
        qps = rounds([one_index("Flat", flat), searcher], xq, args.repeats)
        rows.append({"n": size, "needed": needed, "recall": recall, "stored": report["search"]["efSearch"],
                     "flat": qps["Flat"], "hnsw": qps[searcher.label]})
        log(f"  {size:,}: HNSW32 efSearch {needed} ({recall:.3f}), "
            f"{np.median(ratios(qps[searcher.label]['batch'], qps['Flat']['batch'])):.2f}x Flat")
    return rows


# -- report ----------------------------------------------------------------------------------------------


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.0f}"


def qps_cells(r: CorpusResult, label: str, ref: str, mode: str = "batch") -> str:
    """Two cells: the QPS min/median/max and its ratio to ``ref``, per round."""
    mine, base = r.qps[label][mode], r.qps[ref][mode]
    return f"{spread(mine, '{:,.0f}')} | {spread(ratios(mine, base), '{:.2f}')}"


def setting(value) -> str:
    if value is None:
        return "exhaustive"
    if isinstance(value, list):
        values = sorted(set(v for v in value if v is not None))
        return "efSearch " + "/".join(map(str, values)) if values else "exhaustive"
    return f"efSearch {value}"


def tables(results: list[CorpusResult], efc: list[dict], sizes: list[dict], args) -> list[str]:
    return (corpus_tables(results, args) if results else []) + sweep_tables(efc, sizes)


def corpus_tables(results: list[CorpusResult], args) -> list[str]:
    out = ["### Corpora and questions", "",
           f"Questions: the {args.queries:,} of the {results[0].stats['questions']['pool']:,} in ../shared/data/qa "
           "(NQ-open dev and EfficientQA, WebQuestions, CuratedTREC, FEVER dev claims) closest to some passage "
           "of the corpus (\"topical\": the corpus covers 98 articles' topics, full Wikipedia nearly every "
           f"question's), and the first {args.queries:,} NQ-open dev questions as they come (\"NQ-open\", mostly "
           "off-topic here). All figures use the topical ones unless a table says otherwise.", "",
           "| corpus | passages | nearest other passage: cosine p10 / p50 / p90 | passages with one >= 0.95 "
           "| topical: best, 10th-best cosine (median) | topical picked (best cosine >=) "
           "| NQ-open: best, 10th-best cosine (median) |", "|---|---:|---|---:|---|---|---|"]
    for r in results:
        picked = r.stats["questions"]
        mix = ", ".join(f"{name} {count:,}" for name, count in picked["picked"].items() if count)
        out.append(f"| {r.name} | {r.n:,} | {' / '.join(f'{v:.3f}' for v in r.stats['nn'])} | {r.stats['dup']:.1%} "
                   f"| {r.stats['topical'][0]:.3f}, {r.stats['topical'][1]:.3f} | {mix} ({picked['threshold']:.3f}) "
                   f"| {r.stats['NQ-open'][0]:.3f}, {r.stats['NQ-open'][1]:.3f} |")
    out += ["", "### The index `auto` picks against exact search", "",
            f"Whole batches of the questions; QPS and ratios are min / median / max over {args.repeats} rounds.", "",
            "| corpus | auto picks | setting stored at build (held-out recall@10) | recall@10, questions "
            "| exact QPS | QPS | x exact |", "|---|---|---|---:|---:|---:|---:|"]
    for r in results:
        rep = r.whole["report"]
        out.append(f"| {r.name} | `{r.factory}` | {setting(rep['search'].get('efSearch'))} ({rep['recall_at_10']:.3f}) "
                   f"| {r.recall['one index, stored']:.3f} | {spread(r.qps['exact']['batch'], '{:,.0f}')} "
                   f"| {qps_cells(r, 'one index, stored', 'exact')} |")
        if "one index, equal recall" in r.qps:
            out.append(f"| {r.name} | `{r.factory}`, cheapest efSearch reaching {TARGET} on the questions "
                       f"| {setting(r.setting['one index, equal recall'])} "
                       f"| {r.recall['one index, equal recall']:.3f} | {spread(r.qps['exact']['batch'], '{:,.0f}')} "
                       f"| {qps_cells(r, 'one index, equal recall', 'exact')} |")
    off = [r for r in results if r.offtopic]
    if off:
        out += ["", "### The same index asked off-topic questions (NQ-open)", "",
                "| corpus | index | recall@10 at the stored setting | x exact | cheapest efSearch reaching "
                f"{TARGET} (recall@10) | x exact |", "|---|---|---:|---:|---|---:|"]
        for r in off:
            q = r.offtopic["qps"]
            out.append(f"| {r.name} | `{r.factory}`, {setting(r.whole['report']['search'].get('efSearch'))} "
                       f"| {r.offtopic['recall']:.3f} "
                       f"| {spread(ratios(q['off-topic, stored']['batch'], q['exact']['batch']), '{:.2f}')} "
                       f"| {setting(r.offtopic['setting'])} ({r.offtopic['recall_needed']:.3f}) "
                       f"| {spread(ratios(q['off-topic, equal recall']['batch'], q['exact']['batch']), '{:.2f}')} |")
    out += ["", f"### {args.shards} shards against one index", "",
            "Shards: contiguous, one `build_tuned_shard` each (auto sized for the whole), searched by "
            "`ShardedIndex`; layout = shards searched at once x FAISS threads in each "
            f"({available_cores()} cores). \"stored\": each index at the setting tuning stored; \"equal recall\": "
            f"one index and the shards each at their cheapest common efSearch reaching recall {TARGET} on the "
            f"questions. One query per call: the first {SINGLE} questions.", "",
            "| corpus | search | layout | setting | recall@10 | QPS, batch | x one index | QPS, 1 query per call "
            "| x one index |", "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        one = "one index, equal recall" if "one index, equal recall" in r.qps else "one index, stored"
        rows = [("one index, stored", "-"), ("shards, stored", r.layouts["shards, stored"])]
        if one != "one index, stored":
            rows += [(one, "-")]
        rows += [(label, r.layouts[label]) for label in ("shards, equal recall", "shards, sequential",
                                                         "shards, oversubscribed") if label in r.qps]
        for label, layout in rows:
            ref = "one index, stored" if label.endswith("stored") else one
            out.append(f"| {r.name} | {label} | {layout} | {setting(r.setting.get(label))} | {r.recall[label]:.3f} "
                       f"| {qps_cells(r, label, ref)} | {qps_cells(r, label, ref, 'single')} |")
    out += together_tables(results, args)
    out += ["", "### Build memory", "",
            "Peak-RSS rise of a fresh process that reads its rows, builds, tunes and serialises "
            "(one build each).", "",
            "| corpus | factory | index MB (bytes/vector) | whole: build s, rise MB "
            "| largest shard: build s, rise MB | shard / whole |", "|---|---|---:|---|---|---:|"]
    for r in results:
        big = max(r.shards, key=lambda i: i["rise"])
        out.append(f"| {r.name} | `{r.factory}` | {mb(r.whole['bytes'])} ({r.whole['bytes'] / r.n:,.0f}) "
                   f"| {r.whole['seconds']:.1f}, {mb(r.whole['rise'])} "
                   f"| {big['seconds']:.1f}, {mb(big['rise'])} | {big['rise'] / r.whole['rise']:.2f} |")
    return out


def together_tables(results: list[CorpusResult], args) -> list[str]:
    done = [r for r in results if r.together]
    if not done:
        return []
    out = ["", f"### {args.shards} IVF shards trained together against one index", "",
           "`train_index` trains the factory once, on a sample of all vectors, and tunes there the "
           "version's nprobe and, for a refined index, its re-rank depth (`k_factor`); the whole index and each "
           "contiguous shard fill a copy of it, so the shards share one coarse quantizer. Loaded: as "
           "`ShardedIndex.load` holds a version, the shards' lists merged into one index. Shard by shard: "
           "`ShardedIndex` ranks the lists once, then each shard scans its part of them. Setting: the cheapest "
           f"nprobe reaching recall {TARGET} on the questions for the one IVF index, the same for the shards, at "
           "the depth stored at build. "
           "x one index: against auto's one index at its own equal-recall setting (the table above) and against "
           "the one IVF index, per round. Build seconds: in this process (training, whole, shards).", "",
           "| corpus | search | layout | setting (stored at build) | recall@10 | QPS, batch | x auto's one index "
           "| x one IVF index | QPS, 1 query per call | x one IVF index |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in done:
        t, q = r.together, r.together["qps"]
        sec = t["seconds"]
        for label in (t["best"], "IVF, one index", *t["layouts"]):
            cells = spread(q[label]["batch"], "{:,.0f}")
            best = spread(ratios(q[label]["batch"], q[t["best"]]["batch"]), "{:.2f}")
            ivf = spread(ratios(q[label]["batch"], q["IVF, one index"]["batch"]), "{:.2f}")
            single = spread(q[label]["single"], "{:,.0f}")
            ivf1 = spread(ratios(q[label]["single"], q["IVF, one index"]["single"]), "{:.2f}")
            if label == t["best"]:
                what, layout, value, rec = f"`{r.factory}`, one index", "-", setting(r.setting.get(label)), \
                    r.recall.get(label, 1.0)
            else:
                what = f"`{t['factory']}`, " + ("one index" if label == "IVF, one index" else label.lower()[4:])
                layout = t["layouts"].get(label, "-")
                stored = t["stored"][:1] if label == "IVF, one index" else sorted(set(t["stored"][1:]))
                depth = f", depth {t['depth']}" if t.get("depth") else ""
                value = f"nprobe {t['nprobe']} ({'/'.join(map(str, stored))}){depth}"
                rec = t["recall"][label]
            out.append(f"| {r.name} | {what} | {layout} | {value} | {rec:.3f} | {cells} | {best} | {ivf} | {single} "
                       f"| {ivf1} |")
        out.append(f"| {r.name} | build s: training {sec['train']:.1f}, whole {sec['whole']:.1f}, shards "
                   f"{'/'.join(f'{v:.1f}' for v in sec['shards'])} | | | | | | | | |")
    dask = [r for r in results if r.dask]
    if dask:
        out += ["", "### Dask workers (the shards trained together)", "",
                "`DaskShardedIndex` over the same shards published to a local store, on LocalClusters of 1 and of "
                "2 worker processes with one thread each, both up at once and searched in turn per round; whole "
                "batches of the questions.", "",
                "| corpus | workers | QPS, batch | x 1 worker |", "|---|---:|---:|---:|"]
        for r in dask:
            base = r.dask[0]["qps"]
            out += [f"| {r.name} | {d['workers']} | {spread(d['qps'], '{:,.0f}')} "
                    f"| {spread(ratios(d['qps'], base), '{:.2f}')} |" for d in r.dask]
    return out


def sweep_tables(efc: list[dict], sizes: list[dict]) -> list[str]:
    out = []
    if efc:
        out += ["", "### HNSW32's efConstruction (one shard of the recombined corpus)", "",
                "| efConstruction | build s | efSearch stored (held-out recall) | recall@10 at it, questions "
                f"| cheapest efSearch reaching {TARGET}, questions | QPS at it | x exact |",
                "|---:|---:|---|---:|---|---:|---:|"]
        out += [f"| {e['ef']} | {e['seconds']:.1f} | {e['stored']} ({e['heldout']:.3f}) | {e['recall_stored']:.3f} "
                f"| {e['needed']} ({e['recall']:.3f}) | {spread(e['qps'], '{:,.0f}')} "
                f"| {spread(ratios(e['qps'], e['exact']), '{:.2f}')} |" for e in efc]
    if sizes:
        out += ["", "### Flat against HNSW32 by size (prefixes of the recombined corpus)", "",
                "| vectors | Flat QPS, batch | HNSW32 efSearch (recall@10) | HNSW32 QPS, batch | x Flat "
                "| x Flat, 1 query per call |", "|---:|---:|---|---:|---:|---:|"]
        out += [f"| {z['n']:,} | {spread(z['flat']['batch'], '{:,.0f}')} | {z['needed']} ({z['recall']:.3f}) "
                f"| {spread(z['hnsw']['batch'], '{:,.0f}')} "
                f"| {spread(ratios(z['hnsw']['batch'], z['flat']['batch']), '{:.2f}')} "
                f"| {spread(ratios(z['hnsw']['single'], z['flat']['single']), '{:.2f}')} |" for z in sizes]
    return out


def batch_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    cores = available_cores()
    out = ["### FAISS threads by batch size (one shard of the recombined corpus)", "",
           f"Raw FAISS searches of batches of the topical questions, one thread against {cores} "
           "(`faiss.omp_set_num_threads`), interleaved per round; `ShardedIndex` gives a search one FAISS thread "
           "per `QUERIES_PER_THREAD` queries.", "",
           f"| index | batch | QPS, 1 thread | QPS, {cores} threads | {cores} threads / 1 |",
           "|---|---:|---:|---:|---:|"]
    out += [f"| {r['index']} | {r['nq']:,} | {spread(r['one'], '{:,.0f}')} | {spread(r['all'], '{:,.0f}')} "
            f"| {spread(ratios(r['all'], r['one']), '{:.2f}')} |" for r in rows]
    return out


def calibration_table(rows: list[dict], args) -> list[str]:
    if not rows:
        return []
    sets = list(rows[0]["needs"])
    out = ["### Tuning queries against questions (one shard of the recombined corpus)", "",
           "Tuning searches held-out passages turned away from themselves to a cosine (1.0: the passage as it "
           f"is) and keeps the cheapest setting reaching recall@10 {TARGET} on them; questions: the cheapest "
           f"setting reaching {TARGET} on {args.queries:,} questions of each set, and the recall of the "
           "setting tuning picked.", "",
           "| index | query cosine | tuned setting (recall on tuning queries) | "
           + " | ".join(f"{q}: needs (recall) | {q}: recall at tuned" for q in sets) + " |",
           "|---|---:|---|" + "---|---:|" * len(sets)]
    for r in rows:
        cells = " | ".join(f"{r['param']} {r['needs'][q][0]} ({r['needs'][q][1]:.3f}) | {r['at'][q]:.3f}" for q in sets)
        out.append(f"| `{r['factory']}` | {r['cosine']:g} | {r['param']} {r['tuned']} ({r['tuning_recall']:.3f}) "
                   f"| {cells} |")
    return out


def goals(results: list[CorpusResult]) -> list[str]:
    """PASS/FAIL for the recombined corpus (the goals are set for it); the same figures for the sample."""
    out = []
    for r in results:
        def mark(ok: bool) -> str:
            return verdict(ok) if r.name.startswith("recombined") else "reference"

        rec, ratio = r.recall["one index, stored"], float(np.median(ratios(r.qps["one index, stored"]["batch"],
                                                                          r.qps["exact"]["batch"])))
        out.append(f"- {mark(r.factory != 'Flat' and rec >= TARGET and ratio >= GOAL_SPEEDUP)}: {r.name}: auto picks "
                   f"`{r.factory}`; at the setting stored at build it reaches recall@10 {rec:.3f} at {ratio:.1f}x "
                   f"exact search's QPS (median); goal >= {TARGET} at >= {GOAL_SPEEDUP:g}x")
        one = "one index, equal recall" if "one index, equal recall" in r.qps else "one index, stored"
        label = "shards, equal recall" if "shards, equal recall" in r.qps else "shards, stored"
        for mode, what in (("batch", "whole batches"), ("single", "one query per call")):
            ratio = float(np.median(ratios(r.qps[label][mode], r.qps[one][mode])))
            equal = r.recall[label] >= min(TARGET, r.recall[one])
            # auto's shards: the goal rows, unless auto's factory for a sharded version is the one trained together
            status = "reference" if r.together.get("auto") else mark(equal and ratio >= GOAL_SHARDED)
            out.append(f"- {status}: {r.name}: {len(r.shards)} `{r.factory}` shards built apart "
                       f"(`ShardedIndex` default layout, {r.layouts[label]}), {what}: {ratio:.2f}x one index's QPS "
                       f"(median) at recall@10 {r.recall[label]:.3f} vs {r.recall[one]:.3f}; goal >= "
                       f"{GOAL_SHARDED:g}x at equal recall")
        if r.together:
            t, q = r.together, r.together["qps"]
            auto = t["auto"]
            for layout, how in (("IVF shards, loaded", "loaded as a version is (merged)"),
                                ("IVF shards", "searched shard by shard")):
                for ref, what in ((t["best"], f"`{r.factory}`, auto's one index"),
                                  ("IVF, one index", f"one `{t['factory']}` index")):
                    for mode, calls in (("batch", "whole batches"), ("single", "one query per call")):
                        ratio = float(np.median(ratios(q[layout][mode], q[ref][mode])))
                        rec = t["recall"].get(ref, r.recall.get(ref, 1.0))
                        equal = t["recall"][layout] >= min(TARGET, rec)
                        status = mark(equal and ratio >= GOAL_SHARDED) if layout.endswith("loaded") \
                            else "reference"
                        out.append(f"- {status}: {r.name}: {len(r.shards)} shards trained together "
                                   f"(`{t['factory']}`{', auto for a sharded version' if auto else ''}), {how} "
                                   f"({t['layouts'][layout]}), {calls}: {ratio:.2f}x {what}'s QPS (median) at "
                                   f"recall@10 {t['recall'][layout]:.3f} vs {rec:.3f}; goal >= {GOAL_SHARDED:g}x "
                                   "at equal recall")
        if r.dask:
            one, two = (d["qps"] for d in r.dask)
            ratio = float(np.median(ratios(two, one)))
            out.append(f"- {mark(ratio > 1.0)}: {r.name}: `DaskShardedIndex` over the shards trained together, "
                       f"2 one-thread workers against 1: {ratio:.2f}x the QPS (median); goal > 1")
        big = max(i["rise"] for i in r.shards) / r.whole["rise"]
        out.append(f"- {mark(big <= GOAL_SHARD_MEMORY)}: {r.name}: the largest shard's build memory is "
                   f"{big:.2f}x the whole index's; goal <= {GOAL_SHARD_MEMORY:g}x")
    return out


def render(info: RunInfo, results: list[CorpusResult], calibration: list[dict], efc: list[dict],
           sizes: list[dict], batches: list[dict], args, took: float) -> str:
    return "\n".join([
        "## Index: auto against exact search, one index against shards, on realistic passages", "",
        *info.markdown_header(),
        f"FAISS {faiss.__version__}, {available_cores()} cores, FAISS threads = cores unless a layout says "
        f"otherwise; {args.queries:,} topical questions (below); recall@10 against exact search (a found passage "
        f"counts when its exact inner product reaches the exact 10th best); the run took {took / 60:.1f} min.", "",
        *(["### Goals", "", *goals(results), ""] if results else []),
        *tables(results, efc, sizes, args), "", *calibration_table(calibration, args), "",
        *batch_table(batches), "",
    ])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20,000-passage corpus, 500 questions, small sweeps")
    p.add_argument("--corpus", type=int, help="passages of the make_corpus.py corpus (default 200,000)")
    p.add_argument("--queries", type=int, help="NQ-open dev questions (default 2,000)")
    p.add_argument("--shards", type=int, default=4, help="shards against one index (default 4)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (default 3, at least 3)")
    p.add_argument("--ef-constructions", help="HNSW32 efConstruction values tried (default 40,80,160,320)")
    p.add_argument("--sizes", help="prefix sizes for Flat against HNSW32 (default 5000,10000,20000,50000)")
    p.add_argument("--cosines", default="1,0.6,0.5,0.45,0.4,0.3", help="tuning query cosines compared with questions")
    p.add_argument("--batches", default="1,4,16,64,256,1024", help="batch sizes for FAISS threads against one")
    p.add_argument("--part", choices=("all", "main", "sweeps"), default="all",
                   help="main: the corpora's goal tables; sweeps: tuning queries, efConstruction, sizes, threads")
    p.add_argument("--rows", type=int, help="only the first ROWS passages of the corpus: its chunks encoded so far "
                   "by make_corpus.py are enough")
    p.add_argument("--together-factory", help="IVF factory of the shards trained together "
                   "(default: IVF{sqrt n},PQ{d/2}x4fs,RFlat, fast_scan_factory)")
    p.add_argument("--skip-sample", action="store_true", help="measure the recombined corpus only")
    p.add_argument("--no-dask", dest="dask", action="store_false",
                   help="skip DaskShardedIndex on 1 against 2 LocalCluster workers")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    args = p.parse_args(argv)
    args.cosines = [float(v) for v in args.cosines.split(",") if v.strip()]
    args.batches = [int(v) for v in args.batches.split(",") if v.strip()]
    args.corpus = args.corpus or (20_000 if args.quick else 200_000)
    args.queries = args.queries or (500 if args.quick else 2_000)
    args.ef_constructions = [int(v) for v in (args.ef_constructions or ("40,80" if args.quick else "40,80,160,320"))
                             .split(",") if v.strip()]
    args.sizes = [int(v) for v in (args.sizes or ("2000,5000" if args.quick else "5000,10000,20000,50000"))
                  .split(",") if v.strip()]
    if args.repeats < 3:
        p.error("--repeats must be at least 3 (min / median / max)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        argv = sys.argv if argv is None else ["bench/index_bench.py", *argv]
        info, paths, pool_npy, sets = pool.submit(_prepare, args.corpus, argv, args.rows, args.skip_sample).result()
    questions, sets = np.load(pool_npy), np.array(sets)
    faiss.omp_set_num_threads(available_cores())
    results, efc, sizes, calibration, batches = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="index-bench-") as tmp:
        for name, npy in paths.items() if args.part != "sweeps" else ():
            label = f"recombined ({args.corpus:,})" if name == "recombined" else "real sample"
            if name == "recombined" and args.rows:
                label = f"recombined ({args.corpus:,}), first {args.rows:,}"
            results.append(measure_corpus(label, Path(npy), questions, sets, args, Path(tmp)))
    if "recombined" in paths and args.part != "main":
        xb = np.load(paths["recombined"], mmap_mode="r")
        asked = question_sets(np.ascontiguousarray(xb), questions, sets, args.queries)[0]
        del xb
        calibration = measure_tuning_queries(Path(paths["recombined"]), asked, args)
        efc = measure_ef_construction(Path(paths["recombined"]), asked["topical"], args)
        sizes = measure_sizes(Path(paths["recombined"]), asked["topical"], args)
        batches = measure_batch_threads(Path(paths["recombined"]), asked["topical"], args)
    info.finish()
    text = render(info, results, calibration, efc, sizes, batches, args, time.perf_counter() - started)
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
