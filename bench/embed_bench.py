"""The embedding stage side by side: wikirag's Encoder vs sentence-transformers, same model, same run.

One run, same passages, same cores, same model (the packaged all-MiniLM-L6-v2):

* sentence-transformers ``encode()`` in float32 (its default), with
  ``normalize_embeddings=True`` and ``max_seq_length`` set to wikirag's
  ``max_length``: the reference, for speed and for the vectors;
* wikirag ``Encoder.encode_passages`` in float32 (tokenized once, sorted by
  token length, ``inference_mode``) and in bfloat16 (the same, weights in bf16);
* optionally further batch sizes (``--batch-size 16,64``: the first is the main
  comparison, the others add a sentence-transformers and a wikirag bf16 row).

Both sides see the same strings, ``f"{title}. {text}"``, built from real
passages: the real Wikipedia sample cut into DPR-style 100-word passages by
wikirag's own ingest library (4,391 passages).

Figures: passages/s (rows take turns on chunks of 500 passages, each chunk
counting its fastest of ``--reps``, so that a busy machine slows all rows
alike), the speed-up over sentence-transformers, the min and mean row-wise
cosine against sentence-transformers' float32 vectors, and achieved FLOP/s
against this machine's ``torch.matmul`` peak (square 2048 and 4096) at the
same dtype and threads. FLOPs are the encoder's matmuls on the real, unpadded
tokens (useful work), from the model's config; for a passage of L tokens:

    layers * (8*L*h^2 + 4*L*h*ffn + 4*L^2*h)

(Q, K, V, output projections 4 * 2*L*h*h; FFN 2 * 2*L*h*ffn; Q K^T and
weights x V 2 * 2*L*L*h; embeddings, layer norms, softmax, GELU and pooling
are well under 1% of the FLOPs and left out). A projection to full English
Wikipedia (21M passages, DPR's figure) follows from the measured rates; the
H200 line is an ESTIMATE (FLOPs per passage against the published dense bf16
peak at a stated efficiency), not a measurement.

    python bench/embed_bench.py --quick                     # 500 passages, one repetition (~1-3 min)
    python bench/embed_bench.py --markdown /tmp/embed.md    # all 4,391 passages, fastest of 2 (53 min, busy machine)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from rag_core.index.encoders import Encoder, EncoderConfig, packaged_model_path  # noqa: E402
from rag_core.wiki.dumps import DumpSource, iter_pages  # noqa: E402
from rag_core.wiki.passages import passages_from_pages  # noqa: E402

SAMPLE = REPO.parent / "shared/data/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
GOAL_SPEEDUP = 2.5  # wikirag bf16 passages/s over sentence-transformers fp32, same batch size
GOAL_COSINE = 0.999  # min row-wise cosine of wikirag bf16 against sentence-transformers fp32
WIKIPEDIA_PASSAGES = 21_000_000  # full English Wikipedia in 100-word passages (DPR)
H200_BF16_PEAK = 989e12  # FLOP/s, NVIDIA's published dense bf16 (no sparsity) figure for the H200 SXM
H200_ASSUMED_EFFICIENCY = 0.20  # assumed share of that peak for a 384-wide, 6-layer encoder: NOT measured
H200_HOST_CORES = 16  # CPU cores beside the H200 on the machine this project may borrow: they tokenize
WARMUP = 32  # passages each path encodes once before any timing


@dataclass
class Row:
    """One timed configuration: an engine, a dtype and a batch size."""

    engine: str  # "sentence-transformers" or "wikirag"
    dtype: str
    batch_size: int
    encode: Callable[[list[str], list[str]], np.ndarray]  # (titles, texts) -> float32 [n, dim]
    seconds: float = 0.0  # sum over chunks of the fastest repetition of each chunk
    cpu_seconds: float = 0.0  # process CPU time in those same fastest repetitions
    vectors: np.ndarray | None = None

    @property
    def cores(self) -> float:
        """Cores this process kept busy while timed (below the thread count: other work took CPU)."""
        return self.cpu_seconds / self.seconds

    @property
    def label(self) -> str:
        return f"{self.engine} {self.dtype}, batch {self.batch_size}"

    def rate(self, n: int) -> float:
        return n / self.seconds


# -- inputs and model facts --------------------------------------------------------------------


def load_passages(sample: Path, n: int | None) -> tuple[list[str], list[str]]:
    """(titles, texts) of the first ``n`` passages wikirag's ingest library cuts from the sample."""
    passages, _, _ = passages_from_pages(iter_pages(DumpSource(str(sample))))
    if n is not None:
        passages = passages.slice(0, n)
    return passages.column("title").to_pylist(), passages.column("text").to_pylist()


def token_lengths(strings: list[str], max_length: int) -> tuple[np.ndarray, float]:
    """(tokens per string as the encoder sees them, [CLS] and [SEP] included; CPU seconds the tokenizer took)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(packaged_model_path()))
    c0 = time.process_time()
    ids = tokenizer(strings, truncation=True, max_length=max_length, padding=False)["input_ids"]
    return np.array([len(x) for x in ids], dtype=np.int64), time.process_time() - c0


def encoder_flops(lengths: np.ndarray) -> np.ndarray:
    """Matmul FLOPs per passage for a BERT-style encoder (formula in the module docstring)."""
    cfg = json.loads((packaged_model_path() / "config.json").read_text())
    h, ffn, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    L = lengths.astype(np.float64)
    return layers * (8 * L * h * h + 4 * L * h * ffn + 4 * L * L * h)


def matmul_peak(dtype: torch.dtype, sizes: tuple[int, ...] = (2048, 4096), reps: int = 3) -> float:
    """Best FLOP/s of torch.matmul on square matrices of ``dtype`` (this process's threads)."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.matmul(a, b)  # warm-up
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


# -- the timed paths ---------------------------------------------------------------------------


def build_rows(titles: list[str], texts: list[str], batch_sizes: list[int], max_length: int) -> list[Row]:
    """Load every engine once and warm each path up on a few passages."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(packaged_model_path()), device="cpu")
    st.max_seq_length = max_length

    def st_row(bs: int) -> Row:
        def encode(t: list[str], x: list[str]) -> np.ndarray:
            strings = [f"{a}. {b}" for a, b in zip(t, x)]  # wikirag's format; encode_passages builds it too
            return st.encode(strings, batch_size=bs, normalize_embeddings=True, convert_to_numpy=True,
                             show_progress_bar=False)
        return Row("sentence-transformers", "float32", bs, encode)

    def wikirag_row(dtype: str, bs: int) -> Row:
        enc = Encoder.load(EncoderConfig(dtype=dtype, batch_size=bs, max_length=max_length))
        if enc.fingerprint["passage_format"] != "{title}. {text}" or enc.max_length != max_length:
            raise SystemExit(f"wikirag encoder {enc.fingerprint}: not the format or length compared here")
        return Row("wikirag", dtype, bs, enc.encode_passages)

    main, *others = batch_sizes
    rows = [st_row(main), wikirag_row("float32", main), wikirag_row("bfloat16", main)]
    for bs in others:
        rows += [st_row(bs), wikirag_row("bfloat16", bs)]
    for row in rows:  # warm-up: first calls allocate, pick kernels, fault pages in
        row.encode(titles[:WARMUP], texts[:WARMUP])
    return rows


def time_rows(rows: list[Row], titles: list[str], texts: list[str], chunk: int, reps: int) -> list[float]:
    """Time every row on consecutive chunks of ``chunk`` passages, rows in turn on each chunk.

    Each chunk is encoded ``reps`` times per row (the rows again in turn); a
    row's time is the sum over chunks of its fastest repetition. On a shared
    machine, load that comes and goes then slows every row alike, and a burst
    costs one chunk's repetition, not a whole row. Returns the 1-minute load
    average after each chunk.
    """
    loads = []
    parts: dict[int, list[np.ndarray]] = {id(r): [] for r in rows}
    for start in range(0, len(titles), chunk):
        t, x = titles[start:start + chunk], texts[start:start + chunk]
        best: dict[int, tuple[float, float]] = {}  # row -> (wall, cpu) of its fastest repetition
        for rep in range(reps):
            for row in rows:
                c0, t0 = time.process_time(), time.perf_counter()
                vectors = row.encode(t, x)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                best[id(row)] = min(best.get(id(row), (wall, cpu)), (wall, cpu))
                if rep == 0:
                    parts[id(row)].append(vectors)
        for row in rows:
            row.seconds += best[id(row)][0]
            row.cpu_seconds += best[id(row)][1]
        loads.append(os.getloadavg()[0])
        log(f"  passages {start:,}-{start + len(t):,}: "
            + ", ".join(f"{r.engine} {r.dtype} b{r.batch_size} {best[id(r)][0]:.1f} s" for r in rows)
            + f" (load {loads[-1]:.1f})")
    for row in rows:
        row.vectors = np.concatenate(parts[id(row)])
    return loads


def cosines(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two [n, d] float arrays."""
    a, ref = a.astype(np.float64), ref.astype(np.float64)
    return (a * ref).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(ref, axis=1))


# -- report ------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


@dataclass
class Context:
    """What the report needs besides the rows."""

    n: int  # passages timed
    lengths: np.ndarray  # tokens per passage
    flops: np.ndarray  # matmul FLOPs per passage
    tokenize_cpu_s: float  # CPU seconds of the fast tokenizer on all passages, one batch call
    peaks: dict[str, float]  # dtype -> matmul FLOP/s
    loads: list[float]  # 1-minute load average after each chunk
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float]
    took_s: float
    args: argparse.Namespace


def fmt_load(load: tuple[float, ...]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def row_figures(rows: list[Row], ctx: Context) -> tuple[list[str], list[str]]:
    """(printed lines, markdown table) of every row's rate, speed-up, cosine and FLOP/s."""
    ref = rows[0]  # sentence-transformers fp32 at the main batch size
    lines, table = [], [
        "| engine | dtype | batch | passages/s | vs sentence-transformers | cosine min / mean | GFLOP/s "
        "| % of matmul peak | cores used |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        st = next(x for x in rows if x.engine != "wikirag" and x.batch_size == r.batch_size)
        rate, cos = r.rate(ctx.n), cosines(r.vectors, ref.vectors)
        achieved = ctx.flops.sum() / r.seconds
        share = achieved / ctx.peaks[r.dtype]
        lines.append(f"{r.label}: {rate:.1f} passages/s, {rate / st.rate(ctx.n):.2f}x sentence-transformers, "
                     f"cosine min {cos.min():.5f} mean {cos.mean():.6f}, {achieved / 1e9:.1f} GFLOP/s = "
                     f"{share:.1%} of the {r.dtype} matmul peak, {r.cores:.2f} cores used")
        table.append(f"| {r.engine} | {r.dtype} | {r.batch_size} | {rate:.1f} | {rate / st.rate(ctx.n):.2f}x "
                     f"| {cos.min():.5f} / {cos.mean():.6f} | {achieved / 1e9:.1f} | {share:.1%} | {r.cores:.2f} |")
    return lines, table


def projection(rows: list[Row], ctx: Context, main_bf16: Row) -> tuple[list[str], list[str]]:
    """21M passages: measured rates on this machine; the H200 from FLOPs at a stated efficiency."""
    threads, per_passage = torch.get_num_threads(), ctx.flops.mean()
    where = f"this machine, {threads} thread{'s' if threads > 1 else ''}"
    best = max(rows, key=lambda r: r.rate(ctx.n))
    bf16_eff = ctx.flops.sum() / main_bf16.seconds / ctx.peaks["bfloat16"]
    lines, table = [], ["| where | how | passages/s | hours for 21M passages |", "|---|---|---:|---:|"]
    for r in [rows[0]] + ([best] if best is not rows[0] else []):
        rate = r.rate(ctx.n)
        h = WIKIPEDIA_PASSAGES / rate / 3600
        lines.append(f"21M passages, {where}, measured {r.label}: "
                     f"{rate:.1f} passages/s -> {h:,.0f} h ({h * threads:,.0f} core-hours)")
        table.append(f"| {where} | measured: {r.label} | {rate:.1f} "
                     f"| {h:,.0f} ({h * threads:,.0f} core-hours) |")
    for how, eff in ((f"{H200_ASSUMED_EFFICIENCY:.0%} of the {H200_BF16_PEAK / 1e12:.0f} TFLOP/s bf16 peak "
                      "(an assumption)", H200_ASSUMED_EFFICIENCY),
                     (f"this machine's measured bf16 efficiency, {bf16_eff:.1%} of peak", bf16_eff)):
        rate = H200_BF16_PEAK * eff / per_passage
        h = WIKIPEDIA_PASSAGES / rate / 3600
        lines.append(f"21M passages, one H200, ESTIMATE (not measured) at {how}: {rate:,.0f} passages/s -> "
                     f"{h:.2f} h ({h * 60:.0f} min)")
        table.append(f"| one H200 | ESTIMATE, not measured: {how} | {rate:,.0f} | {h:.2f} ({h * 60:.0f} min) |")
    rate = H200_HOST_CORES * ctx.n / ctx.tokenize_cpu_s
    h = WIKIPEDIA_PASSAGES / rate / 3600
    lines.append(f"21M passages, one H200, ESTIMATE (not measured) of the host tokenization bound, "
                 f"{H200_HOST_CORES} cores: {rate:,.0f} passages/s -> {h:.2f} h ({h * 60:.0f} min)")
    table.append(f"| one H200 | ESTIMATE, not measured: bound by tokenizing on its host's {H200_HOST_CORES} cores "
                 f"| {rate:,.0f} | {h:.2f} ({h * 60:.0f} min) |")
    return lines, table


def report(rows: list[Row], ctx: Context) -> tuple[list[str], str]:
    """(one printed line per figure, the markdown section for docs/benchmarks.md)."""
    ref = rows[0]
    main_bf16 = next(r for r in rows if r.engine == "wikirag" and r.dtype == "bfloat16")
    speedup, cos_min = main_bf16.rate(ctx.n) / ref.rate(ctx.n), cosines(main_bf16.vectors, ref.vectors).min()
    threads, args = torch.get_num_threads(), ctx.args
    lines = [f"passages: {ctx.n:,}, tokens per passage mean {ctx.lengths.mean():.1f} (median "
             f"{np.median(ctx.lengths):.0f}, max {ctx.lengths.max()}), {ctx.flops.mean() / 1e9:.3f} GFLOP per passage",
             f"torch threads: {threads}; chunks of {args.chunk} passages, fastest of {args.reps} per chunk",
             f"load average (1/5/15 min) at start {fmt_load(ctx.load_start)}, at end {fmt_load(ctx.load_end)}; "
             f"1 min after each chunk {min(ctx.loads):.1f}-{max(ctx.loads):.1f}"]
    lines.append(f"tokenization alone (fast tokenizer): {ctx.n / ctx.tokenize_cpu_s:,.0f} passages per CPU-second")
    lines += [f"matmul peak {k}: {v / 1e9:,.0f} GFLOP/s" for k, v in ctx.peaks.items()]
    row_lines, row_table = row_figures(rows, ctx)
    proj_lines, proj_table = projection(rows, ctx, main_bf16)
    ok_speed, ok_cos = speedup >= GOAL_SPEEDUP, cos_min >= GOAL_COSINE
    lines += row_lines
    lines += [f"goal wikirag bf16 >= {GOAL_SPEEDUP}x sentence-transformers fp32: {speedup:.2f}x {verdict(ok_speed)}",
              f"goal min cosine >= {GOAL_COSINE}: {cos_min:.5f} {verdict(ok_cos)}"]
    lines += proj_lines
    md = [
        "## Embedding: wikirag Encoder vs sentence-transformers",
        "",
        f"`python bench/embed_bench.py {args.command}` on {time.strftime('%Y-%m-%d')} ({os.cpu_count()} cores, "
        f"torch {torch.__version__}, `torch.set_num_threads({threads})`), {ctx.took_s / 60:.1f} min; method in "
        f"bench/README.md. The packaged all-MiniLM-L6-v2, max length {args.max_length}, both sides fed "
        f"`f\"{{title}}. {{text}}\"` for {ctx.n:,} real passages (wikirag's ingest of the 206-page sample; "
        f"{ctx.lengths.mean():.1f} tokens on average, median {np.median(ctx.lengths):.0f}, max "
        f"{ctx.lengths.max()}). Rows take turns on chunks of {args.chunk} passages, fastest of {args.reps} per "
        "chunk. Cosine: row-wise against sentence-transformers' fp32 vectors. GFLOP/s: the encoder's matmul "
        "FLOPs on real tokens (padding not counted) over wall time, against the best `torch.matmul` at the "
        f"same dtype and threads. Cores used: CPU time over wall time (below {threads}: other work took CPU). "
        f"Load average (1/5/15 min) {fmt_load(ctx.load_start)} at start, {fmt_load(ctx.load_end)} at end.",
        "",
        *row_table,
        "",
        "| dtype | matmul peak, GFLOP/s |", "|---|---:|",
        *[f"| {k} | {v / 1e9:,.0f} |" for k, v in ctx.peaks.items()],
        "",
        "| goal | measured | verdict |", "|---|---:|---|",
        f"| wikirag bf16 / sentence-transformers fp32 passages/s, batch {ref.batch_size} (>= {GOAL_SPEEDUP}x) "
        f"| {speedup:.2f}x | {verdict(ok_speed)} |",
        f"| min cosine, wikirag bf16 vs sentence-transformers fp32 (>= {GOAL_COSINE}) | {cos_min:.5f} "
        f"| {verdict(ok_cos)} |",
        "",
        f"### Projection: full English Wikipedia ({WIKIPEDIA_PASSAGES / 1e6:.0f}M passages, DPR's figure)",
        "",
        *proj_table,
        "",
        "This machine: measured rates; core-hours assume linear scaling in cores (an assumption). One H200: "
        f"NOT measured; {ctx.flops.mean() / 1e9:.3f} GFLOP per passage (the sample's mean) against NVIDIA's "
        f"published dense bf16 peak ({H200_BF16_PEAK / 1e12:.0f} TFLOP/s) at the efficiency in the row. All rows "
        "assume the sample's passage lengths are typical of Wikipedia; the H200 rows also assume that "
        "host-to-device copies keep up; the last row bounds the H200 by tokenizing on its host's "
        f"{H200_HOST_CORES} cores at this machine's {ctx.n / ctx.tokenize_cpu_s:,.0f} passages per CPU-second "
        "(assumes linear scaling in cores; tokenizing ahead of time, or on more cores, lifts it).",
        "",
        f"**Summary:** wikirag bf16 ran at {speedup:.2f}x sentence-transformers fp32 (goal >= {GOAL_SPEEDUP}x: "
        f"**{verdict(ok_speed)}**) with min cosine {cos_min:.5f} (goal >= {GOAL_COSINE}: **{verdict(ok_cos)}**).",
    ]
    return lines, "\n".join(md) + "\n"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="500 passages, one repetition (smoke test)")
    p.add_argument("--passages", type=int, help="first N passages of the sample (default all; --quick 500)")
    p.add_argument("--batch-size", default="16", help="comma-separated; the first is the main comparison (16)")
    p.add_argument("--reps", type=int, help="timed repetitions per chunk and row, fastest kept (default 2; --quick 1)")
    p.add_argument("--chunk", type=int, default=500, help="passages per timed call, rows in turn (default 500)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2, this machine's cores)")
    p.add_argument("--max-length", type=int, default=256, help="tokens per passage, both sides (default 256)")
    p.add_argument("--sample", type=Path, default=SAMPLE, help="the real Wikipedia sample (.xml.bz2)")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    args = p.parse_args(argv)
    args.passages = args.passages or (500 if args.quick else None)
    args.reps = args.reps or (1 if args.quick else 2)
    args.command = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                            if k in ("passages", "batch_size", "reps", "threads", "chunk") and v is not None)
    args.batch_size = [int(b) for b in args.batch_size.split(",") if b.strip()]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.sample.exists():
        log(f"skipped: {args.sample} is missing (the real Wikipedia sample lives in ../shared/data); "
            "pass --sample PATH")
        sys.exit(0)
    t0, load_start = time.perf_counter(), os.getloadavg()
    torch.set_num_threads(args.threads)
    titles, texts = load_passages(args.sample, args.passages)
    n = len(titles)
    lengths, tokenize_cpu_s = token_lengths([f"{t}. {x}" for t, x in zip(titles, texts)], args.max_length)
    flops = encoder_flops(lengths)
    log(f"{n:,} passages; measuring the matmul peak ...")
    peaks = {"float32": matmul_peak(torch.float32), "bfloat16": matmul_peak(torch.bfloat16)}
    log("loading and warming up ...")
    rows = build_rows(titles, texts, args.batch_size, args.max_length)
    loads = time_rows(rows, titles, texts, args.chunk, args.reps)
    peaks = {k: max(v, matmul_peak(getattr(torch, k))) for k, v in peaks.items()}  # again after: keep the best
    ctx = Context(n, lengths, flops, tokenize_cpu_s, peaks, loads, load_start, os.getloadavg(),
                  time.perf_counter() - t0, args)
    lines, md = report(rows, ctx)
    print("\n".join(lines))
    if args.markdown:
        args.markdown.write_text(md, encoding="utf-8")
        log(f"markdown written to {args.markdown}")


if __name__ == "__main__":
    main()
