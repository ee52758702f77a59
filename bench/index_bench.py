"""The index stage side by side: Flat (exact) vs HNSW32 vs IVF-PQ vs ``auto``, one index vs four shards.

Why: the index must answer top-10 queries much faster than exact search while
finding what exact search finds, and sharding (one FAISS index per passage
shard, searched together) must cost neither query speed nor build memory.  On
the same vectors, queries and cores, one run measures each index built by
``build_shard_index`` (build seconds, bytes, peak RSS of a fresh build process
that reads only its rows; recall@10 and QPS over a sweep of efSearch / nprobe,
reporting the cheapest setting that reaches the target), four contiguous shards
searched by ``ShardedIndex`` at the same recall, and HNSW32 over the originals
of the generator's repeated texts.

Vectors: passages of a ``bench/make_dump.py`` dump (the real sample's 106
articles cycled, copy k titled "(copy k)"), encoded by ``Encoder.load()``
(all-MiniLM-L6-v2, bf16, 384-d, normalised, inner product), cached in
``bench/.cache/``.  Queries: NQ-open dev questions.  Copies make near-ties, so
two recalls: **set** = |found & exact top-10| / 10; **threshold**
(ann-benchmarks) counts a found item whose exact inner product is >= the exact
10th-best - ``--eps``.  Goals use the threshold one.

    python bench/index_bench.py --quick                      # 1,000-page dump (~21k vectors), smoke test
    python bench/index_bench.py --markdown /tmp/index.md     # 5,000-page dump (~107k vectors)
"""

from __future__ import annotations

import argparse
import bz2
import dataclasses
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]
import faiss  # noqa: E402
import pyarrow as pa  # noqa: E402

from rag_core.index.embeddings import shard_bounds  # noqa: E402
from rag_core.index.faiss_index import (  # noqa: E402  # noqa: E402
    IndexConfig,
    build_shard_index,
    deserialize_index,
    ivf_lists,
    serialize_index,
    set_search_params,
)
from rag_core.index.search import ShardedIndex  # noqa: E402

CACHE = Path(__file__).resolve().parent / ".cache"
QUESTIONS = REPO.parent / "shared/data/qa/nq_open/NQ-open.dev.jsonl"
K, THREADS, SHARDS = 10, 2, 4
SINGLE = 200  # queries searched one per call, at the tuned setting
TARGET = 0.95  # recall@10 (threshold definition) a tuned setting must reach
GOAL_SPEEDUP = 5.0  # QPS over exact search at the target
GOAL_SHARDED = 0.9  # sharded QPS over one index's, both at the target
GOAL_SHARD_MEMORY = 0.4  # a shard's build memory rise over the whole index's: 1/4 plus slack
EF_SWEEP = (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
NPROBE_SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- inputs: passage vectors and question vectors, cached -------------------------------------------


def passage_vectors(dump: Path, encoder) -> tuple[Path, dict]:
    """(float32 [n, d] .npy, metadata with passage ids); encodes only what no cached file holds.

    A smaller dump is a prefix of a larger one (same seed): the longest common
    prefix of passage ids with any cached file is reused, in either direction.
    """
    from rag_core.wiki.dumps import DumpSource, iter_pages
    from rag_core.wiki.passages import passages_from_pages

    stem = CACHE / f"index-bench-{dump.name.split('-pages-')[0]}-{encoder.fingerprint_id}"
    npy, meta_path = stem.with_suffix(".npy"), stem.with_suffix(".json")
    if npy.exists() and meta_path.exists():
        return npy, json.loads(meta_path.read_text())
    passages = passages_from_pages(iter_pages(DumpSource(str(dump))))[0]
    ids, titles, texts = (passages.column(c).to_pylist() for c in ("passage_id", "title", "text"))
    vectors, reused = np.empty((len(ids), encoder.dim), np.float32), 0
    for other in CACHE.glob(f"index-bench-*-{encoder.fingerprint_id}.json"):
        other_ids = json.loads(other.read_text())["ids"]
        n = next((i for i, (a, b) in enumerate(zip(ids, other_ids)) if a != b), min(len(ids), len(other_ids)))
        if n > reused:
            vectors[:n], reused = np.load(other.with_suffix(".npy"), mmap_mode="r")[:n], n
    log(f"{dump.name}: encoding {len(ids) - reused:,} of {len(ids):,} passages (~80/s on 2 idle cores)")
    t0, done = time.perf_counter(), [0]

    def progress(n: int) -> None:
        done[0] += n
        if done[0] % 5000 < n:
            log(f"  {done[0]:,} in {time.perf_counter() - t0:.0f} s")

    vectors[reused:] = encoder.encode_passages(titles[reused:], texts[reused:], progress)
    meta = {"dump": dump.name, "fingerprint": encoder.fingerprint, "ids": ids, "distinct_texts": len(set(texts))}
    np.save(npy, vectors)
    meta_path.write_text(json.dumps(meta))
    return npy, meta


def original_rows(dump: Path, ids: list[str]) -> int:
    """How many leading passages come from the dump's originals (titles without "(copy k)")."""
    index = dump.with_name(dump.name.replace("multistream.xml.bz2", "multistream-index.txt.bz2"))
    lines = bz2.decompress(index.read_bytes()).decode("utf-8").splitlines()
    copies = {line.split(":", 2)[1] for line in lines if re.search(r" \(copy \d+\)$", line)}
    return next((i for i, pid in enumerate(ids) if pid.split("-")[0] in copies), len(ids))


def question_vectors(encoder, n: int) -> Path:
    """The first ``n`` NQ-open dev questions, encoded (cached)."""
    path = CACHE / f"index-bench-nq-dev-{n}-{encoder.fingerprint_id}.npy"
    if not path.exists():
        with QUESTIONS.open() as f:
            np.save(path, encoder.encode_questions([json.loads(line)["question"] for line, _ in zip(f, range(n))]))
    return path


def _prepare_in_child(pages: int, queries: int) -> tuple[str, dict, str]:
    """Vectors of passages and questions, in a child process: torch never loads where we search."""
    from ingest_bench import prepare_dumps  # generates the dump once into bench/.cache

    from rag_core.index.encoders import Encoder

    encoder, dump = Encoder.load(), prepare_dumps(pages, [], CACHE)[pages].path
    npy, meta = passage_vectors(dump, encoder)
    meta = {k: v for k, v in meta.items() if k != "ids"} | {"originals": original_rows(dump, meta["ids"])}
    return str(npy), meta, str(question_vectors(encoder, queries))


# -- building: a fresh process per index or shard ---------------------------------------------------


def _status(key: str) -> int:  # bytes of a /proc/self/status line (VmRSS, VmHWM)
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))


def _build_in_child(npy: str, start: int, stop: int, config: dict, total: int, out: str) -> dict:
    """Read rows [start, stop), build, serialise to ``out``; seconds, bytes, peak and starting RSS."""
    faiss.omp_set_num_threads(THREADS)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) that the imports left
    base = _status("VmRSS")
    header = np.load(npy, mmap_mode="r")  # shape and data offset only: no page of it is read
    d = header.shape[1]
    x = np.fromfile(npy, np.float32, (stop - start) * d, offset=header.offset + start * d * 4).reshape(-1, d)
    cfg = IndexConfig(**config)
    t0 = time.perf_counter()
    index = build_shard_index(x, cfg, total_vectors=total)
    seconds = time.perf_counter() - t0
    data = serialize_index(index)
    Path(out).write_bytes(data)
    return {"seconds": seconds, "bytes": len(data), "peak": _status("VmHWM"), "base": base,
            "factory": cfg.resolve_factory(stop - start, d, total_vectors=total)}


def build(npy: Path, start: int, stop: int, config: IndexConfig, total: int, work: Path) -> tuple[bytes, dict]:
    out = work / f"{start}-{stop}.faiss"
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        info = pool.submit(_build_in_child, str(npy), start, stop, config.model_dump(), total, str(out)).result()
    data = out.read_bytes()
    out.unlink()
    return data, info


# -- searching: recall both ways, QPS, sweeps --------------------------------------------------------


@dataclass
class Point:
    param: str  # "efSearch=64", "nprobe=16", "saved" or "exact"
    recall: float  # threshold definition
    recall_set: float
    qps: float  # wall clock
    cpu_qps: float  # queries per CPU-second of this process (all threads): steadier on a shared machine


@dataclass
class Row:
    label: str
    factory: str
    saved: Point  # with the nprobe/efSearch that build_shard_index saved
    points: list[Point]  # the sweep
    load1: float  # 1-min load average when the sweep ended
    target: float = TARGET  # the recall@10 that "tuned" aims at
    qps1: float = 0.0  # at the tuned setting, one query per search call (a server answering one question)
    build: dict = dataclasses.field(default_factory=dict)  # seconds, bytes, peak, base (sharded: largest shard)
    same_as: str = ""

    @property
    def tuned(self) -> Point:
        """The cheapest setting reaching the target (the most accurate one when none does)."""
        return next((p for p in self.points if p.recall >= self.target), max(self.points, key=lambda p: p.recall))


@dataclass
class Truth:
    xb: np.ndarray  # [n, d] base vectors
    xq: np.ndarray  # [q, d] queries
    rows: np.ndarray  # [q, K] exact top-K rows
    kth: np.ndarray  # [q] exact K-th best inner product
    eps: float

    @classmethod
    def exact(cls, xb: np.ndarray, xq: np.ndarray, eps: float) -> Truth:
        flat = faiss.IndexFlatIP(xb.shape[1])
        flat.add(xb)
        scores, rows = flat.search(xq, K)
        return cls(xb, xq, rows, scores[:, -1], eps)

    def ties(self) -> float:
        """Mean number of base vectors within eps of a query's K-th best score."""
        return sum(int((self.xq[i:i + 256] @ self.xb.T >= self.kth[i:i + 256, None] - self.eps).sum())
                   for i in range(0, len(self.xq), 256)) / len(self.xq)

    def recall(self, found: np.ndarray) -> tuple[float, float]:
        """(threshold recall, set recall) of found rows ``[q, K]`` (-1 where none)."""
        ok = found >= 0
        exact = np.einsum("qd,qkd->qk", self.xq, self.xb[np.where(ok, found, 0)])  # [q, K] exact scores
        hit = ok & (exact >= self.kth[:, None] - self.eps)
        in_set = ok & (found[:, :, None] == self.rows[:, None, :]).any(-1)  # [q, K]
        return float(hit.sum() / found.size), float(in_set.sum() / found.size)


def knob(index: faiss.Index) -> list[str]:
    """The sweep of the index's search-time parameter (none for Flat)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return [f"nprobe={p}" for p in NPROBE_SWEEP if p <= ivf.nlist]
    return [f"efSearch={e}" for e in EF_SWEEP] if isinstance(index, faiss.IndexHNSW) else []


def sweep(label: str, factory: str, search, set_param, params: list[str], truth: Truth, repeats: int,
          target: float = TARGET) -> Row:
    """Saved setting first, then ``params`` until recall reaches 0.99; QPS is the best of ``repeats``."""
    search(truth.xq[:100])  # warm up thread pools and caches
    points = []
    for param in ["saved", *params]:
        if param != "saved":
            set_param(param.split("=")[0], int(param.split("=")[1]))
        best, best_cpu = float("inf"), float("inf")
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            found = search(truth.xq)
            best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
        points.append(Point(param if params else "exact", *truth.recall(found), len(found) / best,
                            len(found) / best_cpu))
        if param != "saved" and points[-1].recall >= 0.99:
            break
    row = Row(label, factory, points[0], points[1:] or points, os.getloadavg()[0], target)
    if params:
        set_param(row.tuned.param.split("=")[0], int(row.tuned.param.split("=")[1]))
    t0 = time.perf_counter()
    for q in truth.xq[:SINGLE]:
        search(q[None])
    row.qps1 = min(SINGLE, len(truth.xq)) / (time.perf_counter() - t0)
    log(f"{label} ({factory}): " + ", ".join(f"{p.param} {p.recall:.3f}/{p.recall_set:.3f} {p.qps:,.0f} QPS"
                                             for p in points) + f"; one query per call {row.qps1:,.0f} QPS")
    return row


def numpy_exact(xb: np.ndarray):
    """Exact top-K by numpy (its own BLAS): a reference for FAISS's Flat, not a rag_core path."""
    def search(xq: np.ndarray) -> np.ndarray:
        return np.concatenate([np.argpartition(-(xq[i:i + 512] @ xb.T), K, axis=1)[:, :K]
                               for i in range(0, len(xq), 512)])
    return search


def measure_index(label: str, config: IndexConfig, npy: Path, truth: Truth, work: Path, repeats: int) -> Row:
    """The whole index built in one process, then swept."""
    data, info = build(npy, 0, len(truth.xb), config, len(truth.xb), work)
    index = deserialize_index(data)
    row = sweep(label, info["factory"], lambda xq: index.search(xq, K)[1],
                lambda name, v: set_search_params(index, **{name: v}), knob(index), truth, repeats)
    return dataclasses.replace(row, build=info)


def measure_sharded(factory: str, npy: Path, truth: Truth, work: Path, repeats: int, target: float) -> list[Row]:
    """SHARDS contiguous shards, a build process each, searched by ShardedIndex (default threads, then 1)."""
    n = len(truth.xb)
    bounds = [shard_bounds(n, s, SHARDS) for s in range(SHARDS)]
    built = [build(npy, a, b, IndexConfig(factory=factory), n, work) for a, b in bounds]
    infos = [info for _, info in built]
    largest = max(infos, key=lambda i: i["peak"] - i["base"])
    summary = {**largest, "seconds": sum(i["seconds"] for i in infos), "bytes": sum(i["bytes"] for i in infos)}
    tables = [pa.table({"passage_id": pa.array([str(i) for i in range(a, b)])}) for a, b in bounds]
    offsets = np.array([a for a, _ in bounds])
    rows = []
    for workers in (None, 1):  # fresh copies of the shards, so that each starts from the saved settings
        sharded = ShardedIndex([deserialize_index(data) for data, _ in built], tables, max_workers=workers)

        def search(xq: np.ndarray) -> np.ndarray:
            _, shard, row = sharded.search_rows(xq, K)
            return np.where(row >= 0, offsets[shard] + row, -1)

        def set_param(name: str, value: int) -> None:
            sharded.set_search_params(**{"nprobe" if name == "nprobe" else "ef_search": value})

        label = f"{SHARDS} shards, ShardedIndex" + (" (max_workers=1)" if workers else "")
        row = sweep(label, factory, search, set_param, knob(sharded.shards[0]), truth, repeats, target)
        rows.append(dataclasses.replace(row, build=summary))
    return rows


# -- report -------------------------------------------------------------------------------------------


def mb(info: dict) -> str:
    """Peak RSS of a build and, in brackets, its rise above the process's RSS before reading rows (MB)."""
    return f"{info['peak'] / 1e6:,.0f} ({(info['peak'] - info['base']) / 1e6:,.0f})"


def speed(p: Point, ref: Point) -> str:
    """Two cells: wall-clock QPS and queries per CPU-second, each with its ratio to ``ref``."""
    return f"{p.qps:,.0f} ({p.qps / ref.qps:.2f}x) | {p.cpu_qps:,.0f} ({p.cpu_qps / ref.cpu_qps:.2f}x)"


def point_cells(p: Point) -> str:
    return f"{p.param} | {p.recall:.3f} | {p.recall_set:.3f}"


def tables(rows: list[Row], sharded: list[Row], originals: Row, n: int, n0: int, copies: float) -> dict[str, list[str]]:
    single = {r.factory: r for r in rows if not r.same_as}
    exact, out = single["Flat"].tuned, {}
    head = "tuned setting | recall@10 threshold | recall@10 set"
    out["indexes"] = [f"| index | factory | build s | index MB | bytes/vector | build peak RSS MB (rise) | {head} "
                      "| QPS (x exact) | QPS per CPU-s (x exact) | QPS, 1 query per call | saved setting: recall, QPS "
                      "| load1 |", "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    out["indexes"] += [f"| {r.label} {r.same_as}| `{r.factory}` | {r.build['seconds']:.1f} "
                       f"| {r.build['bytes'] / 1e6:,.1f} | {r.build['bytes'] / n:,.0f} | {mb(r.build)} "
                       f"| {point_cells(r.tuned)} | {speed(r.tuned, exact)} | {r.qps1:,.0f} | {r.saved.recall:.3f}, "
                       f"{r.saved.qps:,.0f} | {r.load1:.1f} |" if r.build else
                       f"| {r.label} | - | - | - | - | - | {point_cells(r.tuned)} | {speed(r.tuned, exact)} "
                       f"| {r.qps1:,.0f} | - "
                       f"| {r.load1:.1f} |" for r in rows]
    out["sharded"] = [f"| factory | layout | {head} | QPS (x one index) | QPS per CPU-s (x one index) "
                      "| QPS, 1 query per call (x one index) |", "|---|---|---|---:|---:|---:|---:|---:|"]
    out["memory"] = [f"| factory | whole index: build s, peak RSS MB (rise) | {SHARDS} shards, one process each: "
                     "build s (sum), largest peak RSS MB (rise) | shard rise / whole rise |", "|---|---|---|---:|"]
    out["goals"] = [f"- {verdict(r.tuned.recall >= TARGET and r.tuned.qps >= GOAL_SPEEDUP * exact.qps)}: {r.label} "
                    f"(`{r.factory}`, {r.tuned.param}): recall@10 {r.tuned.recall:.3f} (set {r.tuned.recall_set:.3f}) "
                    f"at {r.tuned.qps / exact.qps:.1f}x exact search's QPS (per CPU-second "
                    f"{r.tuned.cpu_qps / exact.cpu_qps:.1f}x); goal >= {TARGET} at >= {GOAL_SPEEDUP:g}x"
                    for r in rows if r.build and r.factory != "Flat" and not r.same_as]
    memory_goals = []
    for r in sharded:
        one, t, w, s = single[r.factory].tuned, r.tuned, single[r.factory].build, r.build
        one1 = single[r.factory].qps1
        if r is next(x for x in sharded if x.factory == r.factory):
            out["sharded"].append(f"| `{r.factory}` | one index | {point_cells(one)} | {speed(one, one)} "
                                  f"| {one1:,.0f} |")
            rise = (s["peak"] - s["base"]) / (w["peak"] - w["base"])
            out["memory"].append(f"| `{r.factory}` | {w['seconds']:.1f}, {mb(w)} | {s['seconds']:.1f}, {mb(s)} "
                                 f"| {rise:.2f} |")
            memory_goals.append(f"- {verdict(rise <= GOAL_SHARD_MEMORY)}: `{r.factory}`: the largest shard's build "
                                f"memory rise is {rise:.2f}x the whole index's; goal <= {GOAL_SHARD_MEMORY:g}x")
        out["sharded"].append(f"| `{r.factory}` | {r.label} | {point_cells(t)} | {speed(t, one)} "
                              f"| {r.qps1:,.0f} ({r.qps1 / one1:.2f}x) |")
        equal = t.recall >= min(TARGET, one.recall)
        out["goals"] += [f"- {verdict(equal and t.qps >= GOAL_SHARDED * one.qps)}: `{r.factory}`, {r.label}, "
                         f"batch: {t.qps / one.qps:.2f}x one index's QPS (per CPU-second "
                         f"{t.cpu_qps / one.cpu_qps:.2f}x) at recall@10 {t.recall:.3f} vs {one.recall:.3f}; "
                         f"goal >= {GOAL_SHARDED:g}x at equal recall",
                         f"- {verdict(equal and r.qps1 >= GOAL_SHARDED * one1)}: `{r.factory}`, {r.label}, one "
                         f"query per call: {r.qps1 / one1:.2f}x one index's QPS; goal >= {GOAL_SHARDED:g}x"]
    out["goals"] += memory_goals
    hnsw = single["HNSW32"]
    out["copies"] = [f"| HNSW32 over | vectors | copies of each text | saved setting: recall@10 | {head} |",
                     "|---|---:|---:|---:|---|---:|---:|",
                     f"| all passages | {n:,} | {copies:.1f} | {hnsw.saved.recall:.3f} | {point_cells(hnsw.tuned)} |",
                     f"| the originals only | {n0:,} | 1 | {originals.saved.recall:.3f} "
                     f"| {point_cells(originals.tuned)} |"]
    out["sweeps"] = ["| index | factory | setting | recall@10 threshold | recall@10 set | QPS | QPS per CPU-s |",
                     "|---|---|---|---:|---:|---:|---:|"]
    out["sweeps"] += [f"| {r.label} | `{r.factory}` | {point_cells(p)} | {p.qps:,.0f} | {p.cpu_qps:,.0f} |"
                      for r in [*rows, *sharded, originals] if not r.same_as and r.saved.param != "exact"
                      for p in [r.saved, *r.points]]
    return out


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def summary(rows: list[Row], sharded: list[Row], originals: Row, n: int, n0: int) -> list[str]:
    """A few sentences, every figure read from this run."""
    single = {r.factory: r for r in rows if not r.same_as}
    flat, hnsw = single["Flat"].tuned, single["HNSW32"]
    best = max((r for r in rows if r.build and r.factory != "Flat"), key=lambda r: (r.tuned.recall, r.tuned.qps))
    pool, one_by_one = (next(r for r in sharded if r.factory == "Flat" and ("max_workers" in r.label) == seq)
                        for seq in (False, True))
    rise = max((r.build["peak"] - r.build["base"]) / (single[r.factory].build["peak"] - single[r.factory].build["base"])
               for r in sharded)
    return [f"- Best approximate index: {best.label} (`{best.factory}`), recall@10 {best.tuned.recall:.3f} at "
            f"{best.tuned.param}, {best.tuned.qps / flat.qps:.1f}x Flat's QPS. HNSW32's saved efSearch gives recall "
            f"{hnsw.saved.recall:.3f}; over the originals alone (each text once, {n0 / n:.0%} of the vectors) the "
            f"same graph reaches {originals.tuned.recall:.3f} at {originals.tuned.param} (saved setting: "
            f"{originals.saved.recall:.3f}).",
            f"- Four Flat shards through `ShardedIndex` run at {pool.tuned.qps / flat.qps:.2f}x one index's batch "
            f"QPS with its default thread pool and {one_by_one.tuned.qps / flat.qps:.2f}x with max_workers=1.",
            f"- Build memory follows the shard: the largest shard's rise is at most {rise:.2f}x the whole index's."]


def render(args, meta: dict, n: int, q: int, ties: float, rows: list[Row], sharded: list[Row], originals: Row,
           loads: list[tuple[float, ...]], took: float) -> str:
    fp, copies = meta["fingerprint"], n / meta["distinct_texts"]
    t = tables(rows, sharded, originals, n, meta["originals"], copies)
    load = ", ".join(f"{when} {a:.1f}/{b:.1f}/{c:.1f}" for when, (a, b, c) in zip(("start", "end"), loads))
    return "\n".join([
        "## Index: Flat vs HNSW32 vs IVF-PQ vs auto, one index vs 4 shards", "",
        f"`python bench/index_bench.py{' --quick' if args.quick else ''} --pages {args.pages} --queries {q}` on "
        f"{time.strftime('%Y-%m-%d')} ({os.cpu_count()} cores, FAISS {faiss.__version__}, {THREADS} FAISS threads for "
        f"builds and searches); it took {took / 60:.1f} min; load average (1/5/15 min) {load}. QPS: the best of "
        f"{args.repeats} searches of the whole query batch, by wall clock and per CPU-second of the searching "
        "process (all its threads: less sensitive to other work on a shared machine, but it counts OpenMP's "
        f"spin-waiting); \"1 query per call\": the first {SINGLE} queries searched one at a time at the tuned "
        "setting, as a server answering single questions does; load1: the load when a row was measured.", "",
        f"Vectors: {n:,} passages ({meta['distinct_texts']:,} distinct texts) of `{meta['dump']}`, generated by "
        "`bench/make_dump.py` (the real sample's 106 articles cycled, copy k titled \"(copy k)\"), encoded by "
        f"{fp['name']} ({fp['dtype']}, {fp['dim']}-d, normalised, inner product). Queries: the first {q:,} "
        "NQ-open dev questions. Build peak RSS: VmHWM (reset after the imports) of a fresh process that reads only "
        "its rows, builds and serialises; \"rise\" is that peak minus the process's RSS before reading. \"tuned\": "
        f"the cheapest efSearch/nprobe giving recall@10 >= {TARGET} (threshold definition), or the most accurate "
        "tried; \"saved\": what `build_shard_index` stores for its default `recall_target=0.95`. The numpy row "
        "(exact top-10 by a matrix product in numpy's own BLAS, default threads) is a reference for FAISS's Flat.", "",
        *t["indexes"], "", "### Summary", "", *summary(rows, sharded, originals, n, meta["originals"]), "",
        "### Goals", "", *t["goals"], "",
        f"### {SHARDS} contiguous shards vs one index", "",
        f"Shards are tuned to recall@10 {TARGET}, or to one index's best recall where that falls short. "
        "`ShardedIndex` searches shards in a thread pool (a thread per shard by default), and FAISS runs "
        f"{THREADS} OpenMP threads inside each search; the max_workers=1 rows search shards one after another.", "",
        *t["sharded"], "",
        *t["memory"], "",
        "### Repeated texts and HNSW", "",
        f"The generator repeats each text about {copies:.0f} times (titles differ). HNSW32 (FAISS's default "
        "efConstruction 40) over the dump's originals alone, against exact search over the same originals (also "
        f"{1 / copies:.0%} of the vectors: part of any difference is size):", "",
        *t["copies"], "",
        "### Recall and QPS against the search setting", "", *t["sweeps"], "",
        "### Caveats", "",
        f"- Near-ties: on average {ties:,.1f} base vectors score within eps={args.eps:g} of a query's exact "
        "10th-best inner product. **Set recall** (|found & exact top-10| / 10) counts an equally good item as a "
        "miss; **threshold recall** (ann-benchmarks: a found item counts when its exact inner product >= the exact "
        "10th-best - eps) does not. Goals use the threshold definition; both are shown.",
        "- 106 articles' topics, repeated: neither the size nor the distribution of a real Wikipedia index.",
        "- One machine, one run, shared with other work: wall-clock QPS moves with the load (see load1).", "",
    ])


# -- the run ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1,000-page dump (~21k vectors), 300 queries, no OPQ")
    p.add_argument("--pages", type=int, help="pages of the generated dump (default 5000: ~107k vectors)")
    p.add_argument("--queries", type=int, help="NQ-open dev questions (default 2000; --quick 300)")
    p.add_argument("--repeats", type=int, help="timed searches per setting, the best kept (default 3; --quick 2)")
    p.add_argument("--eps", type=float, default=1e-3, help="threshold recall's slack on the 10th-best inner product")
    p.add_argument("--budgets", default="0.5", help="auto rows under memory budgets, as fractions of Flat's bytes")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    args = p.parse_args(argv)
    args.pages = args.pages or (1_000 if args.quick else 5_000)
    args.queries = args.queries or (300 if args.quick else 2_000)
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not QUESTIONS.exists():
        log(f"skipped: {QUESTIONS} is missing (NQ-open questions, from ../shared/data); nothing was measured")
        return
    t_start, loads = time.perf_counter(), [os.getloadavg()]
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        npy, meta, q_npy = pool.submit(_prepare_in_child, args.pages, args.queries).result()
    npy, xb, xq = Path(npy), np.load(npy), np.load(q_npy)
    n, d = xb.shape
    faiss.omp_set_num_threads(THREADS)
    truth = Truth.exact(xb, xq, args.eps)
    ties = truth.ties()
    log(f"{n:,} vectors, {len(xq):,} queries; {ties:.1f} base vectors within eps of the 10th-best, per query")
    pq = f"{'' if args.quick else 'OPQ48,'}IVF{ivf_lists(n)},PQ48"
    configs = [("Flat (exact)", IndexConfig(factory="Flat")), ("HNSW32", IndexConfig(factory="HNSW32")),
               ("IVF-PQ", IndexConfig(factory=pq)), ("auto, no budget", IndexConfig())]
    configs += [(f"auto, budget {b:g} x Flat", IndexConfig(memory_budget_bytes=int(b * 4 * d * n)))
                for b in args.budgets]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="index-bench-") as tmp:
        work = Path(tmp)
        for label, config in configs:
            same = next((r for r in rows if r.factory == config.resolve_factory(n, d) and not r.same_as), None)
            if same is not None:  # auto resolved to an index already measured: the same build and numbers
                rows.append(dataclasses.replace(same, label=label, same_as=f"(= {same.label}) "))
            else:
                rows.append(measure_index(label, config, npy, truth, work, args.repeats))
        rows.insert(1, sweep("exact, numpy matmul + argpartition (reference, not rag_core)", "numpy",
                             numpy_exact(xb), None, [], truth, args.repeats))
        single = {r.factory: r for r in rows}  # shards aim at one index's recall where it misses the target
        sharded = [r for f in ("Flat", "HNSW32") for r in measure_sharded(
            f, npy, truth, work, args.repeats, min(TARGET, single[f].tuned.recall))]
        n0 = meta["originals"]
        originals = measure_index("HNSW32, originals only", IndexConfig(factory="HNSW32"), npy,
                                  Truth.exact(xb[:n0], xq, args.eps), work, args.repeats)
    loads.append(os.getloadavg())
    text = render(args, meta, n, len(xq), ties, rows, sharded, originals, loads, time.perf_counter() - t_start)
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
