"""The embedding stage side by side: wikirag's Encoder vs sentence-transformers ``encode()``, same run.

Same real passages, same model (the packaged all-MiniLM-L6-v2), same cores
and threads, in one process:

* **sentence-transformers** ``encode()`` with its defaults (float32, batch 32),
  ``normalize_embeddings=True``, ``max_seq_length`` = wikirag's ``max_length``:
  the reference for speed and for the vectors;
* **wikirag** ``Encoder.encode_passages`` at ``EncoderConfig``'s default
  batch size, three ways (each loaded with dtype and engine forced): float32
  in torch; float32 with int8 q/k/v and FFN inputs (``rag_core.perf.int8_engine``;
  quantized on its first call of >= 256 passages, untimed, so ``--passages``
  must be at least that); bfloat16 in torch. The row that ``EncoderConfig()`` (dtype and
  engine auto) picks on this machine is marked "(auto)":
  it is the headline.

Both sides see ``f"{title}. {text}"`` of real passages: a seeded random
sample of the 4,391 that wikirag's ingest cuts from the 206-page Wikipedia
sample (``--passages``; 0 = all). bf16 where this CPU does not run it
natively (``auto`` says float32, e.g. on AVX2) runs only the first
``--slow-passages`` of them (it would take an hour otherwise), with the
reference timed on the same subset.

Timing: every row warms up on 32 passages; then ``--repeats`` rounds, rows in
a rotating order within each round; a row's rate in a round is its passages
over wall time, and its speed-up the ratio to the reference's rate in the
same round. Reported: min / median / max over rounds, the row-wise cosine
(min / mean) against the reference's vectors, GFLOP/s of useful work (the
encoder's matmul FLOPs on unpadded tokens, ``layers * (8 L h^2 + 4 L h ffn +
4 L^2 h)`` for L tokens) and its share of an encoder-shaped ``torch.matmul``
(256x384 @ 384x1536) at the same dtype and threads; cores used is CPU time
over wall time.

    python bench/embed_bench.py --quick                                   # 300 passages, 3 rounds (~3 min)
    python bench/embed_bench.py --markdown bench/results/embedding-native.md     # 1,000 passages, 1 thread
    python bench/embed_bench.py --avx2 --markdown bench/results/embedding-avx2.md  # as on an AVX2-only CPU
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]
from report import RunInfo, emulate_avx2_if_asked, publish, spread  # noqa: E402

SAMPLE = REPO.parent / "shared/data/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
GOAL_SPEEDUP = 1.5  # wikirag (dtype auto) passages/s over sentence-transformers encode(), median of rounds
GOAL_COSINE = 0.999  # min row-wise cosine of wikirag (auto) against sentence-transformers float32
ST_BATCH = 32  # sentence-transformers encode()'s default batch size
WARMUP = 32
CALIBRATION = 64  # passages outside the timed ones whose activations set the int8 rows' smoothing
WIKIPEDIA_PASSAGES = 21_000_000  # full English Wikipedia in 100-word passages (DPR's figure)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Row:
    """One timed configuration over one set of passages."""

    label: str
    dtype: str
    batch: int
    encode: Callable[[list[str], list[str]], object]  # (titles, texts) -> float32 [n, dim]
    subset: bool = False  # timed on the first --slow-passages only
    warmup: int = WARMUP  # passages of the untimed first call (int8: enough to quantize the model)
    setup_s: float = 0.0  # building the engine beyond loading the model: compile, export, quantize
    warm_s: float = 0.0  # the untimed first call (a lazy compile or export happens there)
    int8_cached: bool | None = None  # int8 engine: its weights were in the user's cache before the first call
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    vectors: object = None


# -- inputs and model facts ---------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _ingested(sample: Path):
    from rag_core.wiki.dumps import DumpSource, iter_pages
    from rag_core.wiki.passages import passages_from_pages

    return passages_from_pages(iter_pages(DumpSource(str(sample))))[0]


def _chosen(sample: Path, n: int):
    """Row numbers of the seeded random ``n`` passages (all when ``n`` is 0 or too large)."""
    import numpy as np

    rows = _ingested(sample).num_rows
    if not n or n >= rows:
        return np.arange(rows)
    return np.sort(np.random.default_rng(0).choice(rows, n, replace=False))


def load_passages(sample: Path, n: int) -> tuple[list[str], list[str]]:
    """(titles, texts): a seeded random ``n`` of the passages wikirag's ingest cuts from the sample (0 = all)."""
    passages = _ingested(sample).take(_chosen(sample, n))
    return passages.column("title").to_pylist(), passages.column("text").to_pylist()


def calibration_passages(sample: Path, n: int, k: int = CALIBRATION) -> tuple[list[str], list[str]]:
    """(titles, texts) of ``k`` passages that ``load_passages(sample, n)`` does not return (seeded)."""
    import numpy as np

    passages = _ingested(sample)
    rest = np.setdiff1d(np.arange(passages.num_rows), _chosen(sample, n))
    if not len(rest):  # every passage is timed: calibrate on some of them rather than on none
        rest = np.arange(passages.num_rows)
    picked = passages.take(np.sort(np.random.default_rng(1).choice(rest, min(k, len(rest)), replace=False)))
    return picked.column("title").to_pylist(), picked.column("text").to_pylist()


def encoder_flops(strings: list[str], max_length: int):
    """Matmul FLOPs per passage for the packaged BERT-style encoder (formula in the module docstring)."""
    import numpy as np
    from transformers import AutoTokenizer

    from rag_core.index.encoders import packaged_model_path

    cfg = json.loads((packaged_model_path() / "config.json").read_text())
    h, ffn, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_model_path()))
    lengths = np.array([len(x) for x in tokenizer(strings, truncation=True, max_length=max_length)["input_ids"]])
    L = lengths.astype(np.float64)
    return layers * (8 * L * h * h + 4 * L * h * ffn + 4 * L * L * h), lengths


def matmul_rate(dtype) -> float:
    """Best FLOP/s of an encoder-shaped matmul (256x384 @ 384x1536) at ``dtype`` on this process's threads."""
    import torch

    a, b = torch.randn(256, 384, dtype=dtype), torch.randn(384, 1536, dtype=dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * 256 * 384 * 1536 / best


def int8_gemm_errors() -> dict[int, float]:
    """Share of wrong outputs of the int8 engine's GEMM (FBGEMM's dynamic int8 Linear), by the weights' bound.

    Inputs are integers 0..255 (the u8 range the kernel quantizes a call's inputs to, so its quantization is
    exact) and weights random int8 within the bound; exact products come from float64. Non-zero where the int8
    kernels add u8 x s8 products in 16 bits (AVX2 without VNNI) and the weights are too wide for that.
    """
    import torch

    from rag_core.perf.int8_engine import pack_weight

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (256, 384), generator=gen).float()
    x[0, :2] = torch.tensor([0.0, 255.0])  # the call's range is exactly 0..255: scale 1, zero point 0
    errors = {}
    for bound in (127, 63):
        w = torch.randint(-bound, bound + 1, (512, 384), dtype=torch.int8, generator=gen)
        y = torch.ops.quantized.linear_dynamic(x, pack_weight(w, torch.ones(512)), False).double()
        exact = x.double() @ w.double().T
        errors[bound] = ((y - exact).abs() > 1e-5 * exact.abs().max()).double().mean().item()
    return errors


# -- rows -----------------------------------------------------------------------------------


def build_rows(max_length: int, batch: int | None, native: str) -> list[Row]:
    from sentence_transformers import SentenceTransformer

    from rag_core.index.encoders import Encoder, EncoderConfig, packaged_model_path
    from rag_core.perf import int8_engine

    st = SentenceTransformer(str(packaged_model_path()), device="cpu")
    st.max_seq_length = max_length

    def st_encode(titles: list[str], texts: list[str]):
        return st.encode([f"{a}. {b}" for a, b in zip(titles, texts)], batch_size=ST_BATCH,
                         normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)

    rows = [Row("sentence-transformers encode()", "float32", ST_BATCH, st_encode)]
    auto = Encoder.load(EncoderConfig(max_length=max_length))
    engines = {"torch": "torch", "int8": f"torch, int8 {int8_engine.TARGETS_LABEL}"}
    for dtype, engine in (("float32", "torch"), ("float32", "int8"), ("bfloat16", "torch")):
        config = EncoderConfig(dtype=dtype, engine=engine, max_length=max_length,
                               **({"batch_size": batch} if batch else {}))
        enc = Encoder.load(config)
        if enc.fingerprint["passage_format"] != "{title}. {text}" or enc.max_length != max_length:
            raise SystemExit(f"wikirag encoder {enc.fingerprint}: not the format or length compared here")
        picked = (dtype, engine) == (auto.precision.dtype, auto.engine)
        label = f"wikirag Encoder{' (auto)' if picked else ''}, {engines[engine]}"
        slow_here = dtype == "bfloat16" and native != "bfloat16"  # float32 is never the slow one
        # The untimed first call is large enough to build what the engine builds once (quantization).
        warmup = int8_engine.MIN_TEXTS if engine == "int8" else WARMUP
        cached = (int8_engine.cache_path(int8_engine.cache_key(enc.fingerprint_id)).exists()
                  if engine == "int8" else None)
        rows.append(Row(label, "int8 / float32" if engine == "int8" else dtype, config.batch_size,
                        enc.encode_passages, subset=slow_here, warmup=warmup, int8_cached=cached))
    return rows


# Which of a BERT layer's Linears smoothed_int8 quantizes, by module name: every one but the FFN's output (which
# cost the most cosine in trials), or only the FFN's input (the largest GEMM that costs little cosine alone).
INT8_LAYERS = {"all but FFN out": lambda name: not (name.endswith("output.dense") and "attention" not in name),
               "FFN in only": lambda name: name.endswith("intermediate.dense")}


def smoothed_int8(enc, calibration: tuple[list[str], list[str]], weight_bits: int, layers: str,
                  alpha: float = 0.5):
    """A copy of ``enc``'s passage tower whose ``INT8_LAYERS[layers]`` Linears run the int8 engine's kernel.

    W8A8 in SmoothQuant's manner (Xiao et al., 2022), as ``rag_core.perf.int8_engine`` does it, but with
    weights rounded to nearest instead of by GPTQ, and on any set of Linears: each input channel j is divided
    by ``s_j = max|x_j| ** alpha / max|W_:j| ** (1 - alpha)`` and its weight column multiplied by it (the same
    product in exact arithmetic); activations are quantized per token and weights per output channel,
    symmetric (``int8_engine.int8_linear``). ``max|x_j|`` comes from running the tower over ``calibration``
    (passages that are not timed). ``weight_bits`` 7 keeps AVX2's int8 kernels exact: without VNNI they sum
    pairs of u8 x s8 products in 16 bits, and weights beyond ±63 can saturate that sum
    (:func:`int8_gemm_errors`, printed under the alternatives).
    """
    import copy

    import torch

    from rag_core.perf.int8_engine import int8_linear, pack_weight

    class SmoothedInt8Linear(torch.nn.Module):
        def __init__(self, linear: torch.nn.Linear, in_max: torch.Tensor) -> None:
            super().__init__()
            w = linear.weight.detach().float()  # [out, in]
            smooth = in_max.clamp(min=1e-5) ** alpha / w.abs().amax(0).clamp(min=1e-5) ** (1 - alpha)  # [in]
            w = w * smooth
            qmax = 2 ** (weight_bits - 1) - 1
            w_scale = w.abs().amax(1).clamp(min=1e-8) / qmax  # [out]
            self.packed = pack_weight((w / w_scale[:, None]).round().clamp(-qmax, qmax).to(torch.int8), w_scale)
            self.inv_smooth = 1.0 / smooth
            self.bias = linear.bias.detach().float() if linear.bias is not None else None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = int8_linear(x.reshape(-1, x.shape[-1]), self.packed, self.inv_smooth, self.bias)
            return y.view(*x.shape[:-1], -1)

    model = enc.context.model
    targets = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
               and ".layer." in f".{name}" and INT8_LAYERS[layers](name)}
    in_max: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(_module, inputs, _output):
            seen = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0)
            in_max[name] = torch.maximum(in_max[name], seen) if name in in_max else seen
        return hook

    hooks = [module.register_forward_hook(record(name)) for name, module in targets.items()]
    try:
        enc.encode_passages(*calibration)
    finally:
        for hook in hooks:
            hook.remove()
    quantized = copy.deepcopy(model)
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = quantized.get_submodule(parent_name)
        setattr(parent, child, SmoothedInt8Linear(getattr(parent, child), in_max[name]))
    return quantized


def alternative_rows(max_length: int, batch: int | None, calibration: tuple[list[str], list[str]]) -> list[Row]:
    """``--alternatives``: float32 ways to run the same encoder that an AVX2-only CPU might gain from.

    Each is wikirag's Encoder (same tokenizing, sorting and pooling) with its passage tower swapped: HF's eager
    attention instead of SDPA; ``torch.compile`` (inductor, weights frozen); int8 dynamic quantization of every
    Linear (``torch.ao.quantization.quantize_dynamic``: one activation scale per call); int8 with per-token
    activation scales after SmoothQuant's smoothing (:func:`smoothed_int8`, 8- and 7-bit weights), calibrated
    on ``calibration``.
    """
    import dataclasses

    import torch
    from transformers import AutoModel

    from rag_core.index.encoders import Encoder, EncoderConfig

    config = EncoderConfig(dtype="float32", max_length=max_length, **({"batch_size": batch} if batch else {}))

    def swapped(make: Callable[[Encoder], Callable]) -> tuple[Callable, float]:
        enc = Encoder.load(config)
        t0 = time.perf_counter()
        enc.context = dataclasses.replace(enc.context, model=make(enc))
        return enc.encode_passages, time.perf_counter() - t0

    def eager(enc: Encoder):
        return AutoModel.from_pretrained(str(enc.context.path), dtype=torch.float32,
                                         attn_implementation="eager").eval()

    def compiled(enc: Encoder):
        import torch._inductor.config as inductor

        inductor.freezing = True  # constant weights: inductor may prepack them for its GEMMs
        return torch.compile(enc.context.model, dynamic=True)

    def int8(enc: Encoder):
        return torch.ao.quantization.quantize_dynamic(enc.context.model, {torch.nn.Linear}, dtype=torch.qint8)

    def w8a8(bits: int, layers: str):
        return lambda enc: smoothed_int8(enc, calibration, bits, layers)

    makers = [("torch, eager attention", eager), ("torch.compile (inductor, frozen)", compiled),
              ("torch, int8 dynamic Linear", int8),
              *[(f"torch, int8 per-token SmoothQuant, {bits}-bit weights, {layers}", w8a8(bits, layers))
                for bits, layers in ((8, "all but FFN out"), (7, "all but FFN out"), (7, "FFN in only"))]]
    rows = []
    for label, make in makers:
        encode, setup = swapped(make)
        dtype = "int8 / float32" if "int8" in label else "float32"  # every int8 row's label says so
        rows.append(Row(f"alternative: {label}", dtype, config.batch_size, encode, setup_s=setup))
    return rows


def time_rows(rows: list[Row], titles: list[str], texts: list[str], slow: int, repeats: int) -> dict[bool, Row]:
    """Rounds of every row (rotating order); returns the reference row per passage set (full, subset)."""
    ref = rows[0]
    refs = {False: ref}
    if any(r.subset for r in rows):
        refs[True] = Row(ref.label, ref.dtype, ref.batch, ref.encode, subset=True)
    timed = [*rows, *([refs[True]] if True in refs else [])]
    for row in timed:
        t0 = time.perf_counter()
        row.encode(titles[:row.warmup], texts[:row.warmup])
        row.warm_s = time.perf_counter() - t0
    for rnd in range(repeats):
        for row in timed[rnd % len(timed):] + timed[:rnd % len(timed)]:
            t, x = (titles[:slow], texts[:slow]) if row.subset else (titles, texts)
            c0, t0 = time.process_time(), time.perf_counter()
            row.vectors = row.encode(t, x)
            row.walls.append(time.perf_counter() - t0)
            row.cpus.append(time.process_time() - c0)
        log(f"round {rnd + 1}/{repeats}: " + ", ".join(
            f"{r.label} {r.dtype}{' (subset)' if r.subset else ''} {len(r.vectors) / r.walls[-1]:.1f}/s"
            for r in timed))
    return refs


def cosines(a, ref):
    import numpy as np

    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return (a * ref).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(ref, axis=1))


# -- report ------------------------------------------------------------------------------------


def report(info: RunInfo, args: argparse.Namespace, rows: list[Row], refs: dict[bool, Row], flops, lengths,
           rates: dict[str, float], native: str, reason: str, int8_errors: dict[int, float]) -> str:
    import numpy as np
    import torch

    n, slow = len(flops), min(args.slow_passages, len(flops))
    table = ["| engine | dtype | batch | passages | passages/s (min / median / max) | vs sentence-transformers "
             "(min / median / max) | cosine min / mean | GFLOP/s (median) | % of matmul rate | cores used |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    headline = None
    for row in rows:
        m = slow if row.subset else n
        ref = refs[row.subset]
        per_round = [m / w for w in row.walls]
        ratios = [(m / w) / (m / rw) for w, rw in zip(row.walls, ref.walls)]
        cos = cosines(row.vectors, ref.vectors)
        gflops = float(flops[:m].sum()) / float(np.median(row.walls)) / 1e9
        share = gflops * 1e9 / rates.get(row.dtype, rates["float32"])  # int8 rows: against float32's
        cores = sum(row.cpus) / sum(row.walls)
        table.append(f"| {row.label} | {row.dtype} | {row.batch} | {m:,} | {spread(per_round, '{:.1f}')} "
                     f"| {spread(ratios, '{:.2f}')}x | {cos.min():.5f} / {cos.mean():.6f} | {gflops:.1f} "
                     f"| {share:.0%} | {cores:.2f} |")
        if "(auto)" in row.label:
            headline = (ratios, cos.min(), float(np.median(per_round)))
    ratios, cos_min, rate = headline
    median = float(np.median(ratios))
    ok_speed, ok_cos = median >= GOAL_SPEEDUP, cos_min >= GOAL_COSINE
    hours = WIKIPEDIA_PASSAGES / rate / 3600
    lines = [
        f"## Embedding: wikirag Encoder vs sentence-transformers, {torch.get_num_threads()} thread"
        f"{'s' if torch.get_num_threads() != 1 else ''}",
        "",
        *info.markdown_header(),
        f"The packaged all-MiniLM-L6-v2, max length {args.max_length}, both sides fed `f\"{{title}}. {{text}}\"` for "
        f"{n:,} real passages (a seeded sample of wikirag's ingest of the 206-page Wikipedia sample; "
        f"{lengths.mean():.1f} tokens on average, median {np.median(lengths):.0f}, max {lengths.max()}). "
        f"`dtype=\"auto\"` chose **{native}** here: {reason}. bf16, when not native here, ran on the "
        f"first {slow} passages only, against the reference on the same {slow}. {args.repeats} rounds, rows in rotating "
        "order; cosine against sentence-transformers' float32 vectors (method in bench/README.md).",
        "",
        *table,
        "",
        *[f"The int8 engine's untimed first call ({r.warmup} passages) took {r.warm_s:.1f} s, "
          + ("its int8 weights read back from the user's cache (`~/.cache/wikirag/int8/`, present at the start) "
             "included." if r.int8_cached else "quantizing included (a float32 pass over its calibration text, "
             "then GPTQ rounding; once per machine: the result is kept in the user's cache).")
          for r in rows if r.int8_cached is not None],
        "",
        *([f"Alternatives (`--alternatives`, never picked by `auto`): set-up beyond loading the model "
           f"(int8 SmoothQuant: calibrating on {CALIBRATION} other passages), "
           f"and the untimed first call on {WARMUP} passages, where a lazy compile happens.", "",
           "| row | set-up s | first call s |", "|---|---:|---:|",
           *[f"| {r.label} | {r.setup_s:.1f} | {r.warm_s:.1f} |" for r in rows if r.label.startswith("alternative")],
           "", "The int8 GEMM of the int8 engine and the SmoothQuant rows (FBGEMM's dynamic int8 Linear) against "
           "exact products, inputs in the kernel's u8 range 0..255:", "", "| int8 weights within | wrong outputs |",
           "|---|---:|",
           *[f"| ±{bound} | {share:.1%} |" for bound, share in int8_errors.items()],
           ""] if args.alternatives else []),
        "| dtype | encoder-shaped matmul, GFLOP/s |", "|---|---:|",
        *[f"| {k} | {v / 1e9:,.1f} |" for k, v in rates.items()],
        "",
        "| goal | measured | verdict |", "|---|---:|---|",
        f"| wikirag (auto) / sentence-transformers encode() passages/s, median of rounds (>= {GOAL_SPEEDUP}x) "
        f"| {median:.2f}x | {'PASS' if ok_speed else 'FAIL'} |",
        f"| min cosine, wikirag (auto) vs sentence-transformers float32 (>= {GOAL_COSINE}) | {cos_min:.5f} "
        f"| {'PASS' if ok_cos else 'FAIL'} |",
        "",
        f"At the auto row's median rate, full English Wikipedia ({WIKIPEDIA_PASSAGES / 1e6:.0f}M passages) takes "
        f"{hours:,.0f} hours per thread like this one (assuming linear scaling in threads and the sample's "
        "passage lengths).",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="300 passages, 32 for non-native dtypes (smoke test)")
    p.add_argument("--passages", type=int, help="seeded random passages of the sample (default 1000; 0 = all)")
    p.add_argument("--slow-passages", type=int, help="passages for a dtype that is not native here (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: one per Dask worker)")
    p.add_argument("--batch-size", type=int, help="wikirag's batch size (default: EncoderConfig's)")
    p.add_argument("--max-length", type=int, default=256, help="tokens per passage, both sides (default 256)")
    p.add_argument("--sample", type=Path, default=SAMPLE, help="the real Wikipedia sample (.xml.bz2)")
    p.add_argument("--alternatives", action="store_true", help="also time alternatives: eager attention, "
                   "torch.compile, int8 dynamic Linear, int8 per-token SmoothQuant")
    p.add_argument("--avx2", action="store_true", help="run as on an AVX2-only CPU (re-runs itself)")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    args = p.parse_args(argv)
    args.passages = args.passages if args.passages is not None else (300 if args.quick else 1000)
    args.slow_passages = args.slow_passages or (32 if args.quick else 64)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.sample.exists():
        log(f"skipped: {args.sample} is missing (the real sample lives in ../shared/data); pass --sample PATH")
        return
    import torch

    from rag_core.perf.precision import choose_precision

    torch.set_num_threads(args.threads)
    info = RunInfo.start()
    precision = choose_precision("auto", "cpu")
    titles, texts = load_passages(args.sample, args.passages)
    flops, lengths = encoder_flops([f"{a}. {b}" for a, b in zip(titles, texts)], args.max_length)
    log(f"{len(titles):,} passages; auto picks {precision.dtype} ({precision.reason}); loading and warming up ...")
    rows = build_rows(args.max_length, args.batch_size, precision.dtype)
    if args.alternatives:
        rows += alternative_rows(args.max_length, args.batch_size, calibration_passages(args.sample, args.passages))
    refs = time_rows(rows, titles, texts, args.slow_passages, args.repeats)
    rates = {"float32": matmul_rate(torch.float32), "bfloat16": matmul_rate(torch.bfloat16)}
    int8_errors = int8_gemm_errors() if args.alternatives else {}
    info.finish()
    text = report(info, args, rows, refs, flops, lengths, rates, precision.dtype, precision.reason, int8_errors)
    publish(text, args.markdown)


if __name__ == "__main__":
    emulate_avx2_if_asked()
    main()
