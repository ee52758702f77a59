"""int8 attention projections and FFN inputs for the passage tower on CPUs without native bf16 (``engine="int8"``).

Why it exists: where bf16 is not native (an AVX2-only AMD EPYC), the encoder
runs in float32 at ~80% of MKL's GEMM peak, so only fewer or cheaper
multiplies make it faster. int8 GEMMs run ~2x float32's rate there, but
int8 done crudely loses the vectors (torch's dynamic quantization: cosine
0.876 against float32, docs/benchmarks.md). This engine quantizes only the
Linears that cost little cosine, each layer's query, key and value
projections and its FFN input (:data:`TARGETS`, 7/12 of the encoder's
Linear FLOPs; the attention output and the FFN output stay float32: with the
attention output too, real passages fell to min cosine 0.99909, and the FFN
output costs the most), and quantizes them carefully:

- SmoothQuant's smoothing (Xiao et al., 2022): input channel j is divided by
  ``s_j = sqrt(max|x_j| / max|W_:j|)`` and the weight column multiplied by it
  (the same product in exact arithmetic), which moves activation outliers
  into the weights;
- activations quantized per token (dynamic, 8 bits): each token's row is
  divided by its largest magnitude, so that the one range FBGEMM's dynamic
  int8 Linear (``torch.ops.quantized.linear_dynamic``) quantizes a whole call
  with is every token's own range, and the output rows are multiplied back.
  FBGEMM quantizes, multiplies and dequantizes in one vectorized pass; the
  same per-token scheme around ``torch._int_mm`` spent on its eager
  quantize and dequantize passes about half of what int8 saves (profiled on
  real passages held to AVX2: the engine ran no faster than float32 there);
- weights per output channel, symmetric, **7 bits**: without VNNI, int8
  GEMMs on x86 (FBGEMM's and oneDNN's) add pairs of u8 x s8 products in
  16 bits and saturate unless weights stay within ±63 (bench/embed_bench.py
  prints a table of it); and rounded by GPTQ (Frantar et al., 2022): columns
  are rounded one at a time, in order of decreasing input energy, and each
  rounding error is spread over the columns not yet rounded, weighted by the
  inverse of the inputs' second moments. On real passages this halves the
  cosine loss of rounding to nearest (min cosine 0.99916 -> 0.99952 in the
  embedding bench held to AVX2, with the FFN input alone quantized).

The statistics (``max|x_j|`` and ``X^T X`` per layer) come from a float32 pass
over :data:`CALIBRATION_FILE`, encyclopedic text written for this purpose
(prose, lists of names, tables of figures, passages that start mid-sentence,
as Wikipedia passages do), so the quantized weights depend on the model
alone: every process, worker and machine that quantizes a model gets the
same int8 weights, and vectors do not depend on which shard a passage was in.
Quantizing takes several seconds (the pass and the rounding), so the encoder
does it on its first call of at least :data:`MIN_TEXTS` passages, never for
questions, and keeps the result in the user's cache
(``~/.cache/wikirag/int8/``, :func:`cache_path`): later processes, e.g. each
Dask worker of the next rebuild, read it back instead. A damaged or
unwritable cache costs only the time to quantize again.

``engine="auto"`` (the default) picks this engine where ``dtype="auto"``
resolved to float32 on a CPU and :func:`int8_probe_speedup` (an FFN-input
GEMM, quantization included, against float32 on one thread) shows at least
:data:`MIN_INT8_SPEEDUP`, for a BERT-style model (others stay float32 under
``auto``; an explicit ``engine="int8"`` refuses them); an explicit ``dtype``
or ``engine`` wins. Where torch has no int8 Linear kernels (a build without
FBGEMM, oneDNN or QNNPACK) the probe reports 0 and ``auto`` stays float32.
The probe is timed once per CPU and kept (:func:`measured_speedup`): each Dask
worker of a rebuild reads the verdict instead of timing it again (~0.5 s).
With the machinery off (:func:`rag_core.perf.set_enabled`) ``auto`` runs torch
and times nothing (:func:`auto_engine`).
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger("wikirag")

# Passages in one call before it quantizes. The first quantizing on a machine (the log line times it) costs more
# than 256 passages save; later processes read the user's cache instead, which 256 passages do repay.
MIN_TEXTS = 256
# The probe's int8 rate over float32 for auto to pick this engine. The quantized Linears are about half the
# encoder's float32 time, so 1.2x there is ~8% for the encoder; a CPU whose int8 is no faster probes ~1.0 (+-0.1).
MIN_INT8_SPEEDUP = 1.2
WEIGHT_BITS = 7  # exact on AVX2 kernels (see the module docstring); 8 saturates there
SMOOTHING = 0.5  # SmoothQuant's alpha: 0.35-0.5 held the most cosine in trials, 0.8 lost it
CALIBRATION_FILE = Path(__file__).with_name("int8_calibration.txt")
_PROBE_SHAPE = (2048, 384, 1536)  # a batch of 16 passages' tokens x hidden @ hidden x FFN: one FFN input


# The Linears quantized, by the names BERT, DPR, MiniLM and RoBERTa give them: the attention's input projections
# and the FFN's input: 1.24x float32's passages/s held to AVX2 in bench/embed_bench.py (the FFN input alone:
# 1.17x). Against float32 on all 4,391 passages of the sample: min cosine 0.99900, 1st percentile 0.99937 (the
# FFN input alone: 0.99924, 0.99964), the worst passage a list of ISBNs for both. Adding the attention output
# (attention.output.dense) fell to 0.99909 on 600 passages for ~no further speed.
TARGETS = ("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense")
TARGETS_LABEL = "q/k/v and FFN inputs"  # how logs, help and the embedding bench name TARGETS


def is_target(name: str) -> bool:
    """Whether the Linear named ``name`` in a BERT-style model is one this engine runs int8 (:data:`TARGETS`)."""
    return name.endswith(TARGETS)


def has_targets(model: Any) -> bool:
    """Whether ``model`` has a Linear this engine quantizes (see :func:`is_target`)."""
    return bool(_targets(model))


def calibration_texts() -> tuple[list[str], list[str]]:
    """(titles, texts) of the calibration passages: ``Title. text`` a line."""
    titles, texts = [], []
    for line in CALIBRATION_FILE.read_text(encoding="utf-8").splitlines():
        if line.strip():
            title, _, text = line.partition(". ")
            titles.append(title)
            texts.append(text)
    return titles, texts


def pack_weight(w_int8: torch.Tensor, w_scale: torch.Tensor) -> Any:
    """``w_int8 [out, in]`` with per-output-channel ``w_scale``, packed for ``torch.ops.quantized.linear_dynamic``.

    The packing takes a per-channel quantized tensor, a kind torch 2.13 marks deprecated (a warning at each
    creation, silenced here: the pinned torch has them, and ``cache_key`` names the torch version).
    """
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        # k * scale / scale rounds back to k exactly for |k| <= 127, so the packed integers are w_int8's.
        qweight = torch.quantize_per_channel(w_int8.float() * w_scale[:, None], w_scale.double(),
                                             torch.zeros_like(w_scale, dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(qweight, None)


def int8_linear(rows: torch.Tensor, packed: Any, inv_smooth: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``[tokens, in]`` float rows through a packed int8 Linear, each row smoothed and quantized on its own range."""
    import torch

    rows = rows * inv_smooth
    peak = torch.maximum(rows.amax(1, keepdim=True), rows.amin(1, keepdim=True).neg_()).clamp_(min=1e-8)  # [tokens, 1]
    y = torch.ops.quantized.linear_dynamic(rows.div_(peak), packed, False)  # 8-bit u8 inputs: exact with 7-bit weights
    return y.mul_(peak) if bias is None else y.mul_(peak).add_(bias)


@functools.cache
def _int8_linear_class() -> type:
    """The int8 Linear module class, defined on first use (torch loads late)."""
    import torch

    class Int8Linear(torch.nn.Module):
        """y = x W^T + b with x smoothed and quantized per token, W smoothed, GPTQ-rounded to 7 bits."""

        def __init__(self, w_int8: torch.Tensor, w_scale: torch.Tensor, inv_smooth: torch.Tensor,
                     bias: torch.Tensor | None) -> None:
            super().__init__()
            self.register_buffer("w_int8", w_int8)  # [out, in]
            self.register_buffer("w_scale", w_scale)  # [out]
            self.register_buffer("inv_smooth", inv_smooth)  # [in]
            self.register_buffer("bias", bias)
            self.packed = pack_weight(w_int8, w_scale)  # FBGEMM's layout of the same weights

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = int8_linear(x.reshape(-1, x.shape[-1]), self.packed, self.inv_smooth, self.bias)
            return y.view(*x.shape[:-1], -1)

    return Int8Linear


def gptq_round(w: torch.Tensor, hessian: torch.Tensor, scale: torch.Tensor, qmax: int) -> torch.Tensor:
    """Integer weights ``[out, in]`` for ``w`` (float64) on the grid ``scale[:, None] * k``, ``|k| <= qmax``.

    Columns are rounded in order of decreasing ``diag(hessian)`` (the inputs' energy); each column's rounding
    error is carried into the columns still to round through the upper Cholesky factor of the damped
    ``hessian``'s inverse, so that ``X W^T`` (X the calibration inputs) changes least.
    """
    import torch

    order = torch.argsort(torch.diag(hessian), descending=True)
    w = w[:, order].clone()
    h = hessian[order][:, order].clone()
    dead = torch.diag(h) == 0  # an input channel that never fired: nothing to fit, round it alone
    h[dead, dead] = 1
    h += 0.01 * torch.diag(h).mean() * torch.eye(h.shape[0], dtype=h.dtype)  # damping, as in GPTQ
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.empty_like(w)
    for i in range(w.shape[1]):
        q[:, i] = (w[:, i] / scale).round().clamp(-qmax, qmax)
        err = (w[:, i] - q[:, i] * scale) / u[i, i]
        w[:, i + 1:] -= err[:, None] * u[i, i + 1:][None, :]
    return q[:, torch.argsort(order)]


def int8_weights(model: Any, calibrate: Callable[[], Any]) -> dict[str, torch.Tensor]:
    """What :func:`swap_in` needs to run ``model``'s :data:`TARGETS` int8; ``calibrate()`` runs ``model`` over the text.

    Keys are ``<module name>.<buffer>`` (``w_int8``, ``w_scale``, ``inv_smooth`` and ``bias`` where the Linear has
    one). Raises ValueError when the model has none of them (not BERT-style).
    """
    import torch

    targets = _targets(model)
    if not targets:
        raise ValueError("no BERT-style Linear to quantize (modules named ...intermediate.dense, "
                         "...attention.self.query)")
    stats: dict[str, list] = {}

    def record(name: str):
        def hook(_module, inputs, _output):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
            if name not in stats:
                stats[name] = [x.abs().amax(0), x.T @ x]
            else:
                stats[name][0] = torch.maximum(stats[name][0], x.abs().amax(0))
                stats[name][1] += x.T @ x
        return hook

    hooks = [m.register_forward_hook(record(name)) for name, m in targets.items()]
    try:
        calibrate()
    finally:
        for hook in hooks:
            hook.remove()
    qmax = 2 ** (WEIGHT_BITS - 1) - 1
    weights: dict[str, torch.Tensor] = {}
    for name, linear in targets.items():
        in_max, xtx = stats[name]
        w = linear.weight.detach().double()  # [out, in]
        smooth = in_max.clamp(min=1e-5) ** SMOOTHING / w.abs().amax(0).clamp(min=1e-5) ** (1 - SMOOTHING)
        w = w * smooth
        scale = w.abs().amax(1).clamp(min=1e-8) / qmax
        q = gptq_round(w, xtx / smooth[:, None] / smooth[None, :], scale, qmax)
        weights[f"{name}.w_int8"] = q.to(torch.int8)
        weights[f"{name}.w_scale"] = scale.float()
        weights[f"{name}.inv_smooth"] = (1 / smooth).float()
        if linear.bias is not None:
            weights[f"{name}.bias"] = linear.bias.detach().float().clone()
    return weights


def _targets(model: Any) -> dict[str, Any]:
    import torch

    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and is_target(name)}


def fits(model: Any, weights: dict[str, torch.Tensor]) -> bool:
    """Whether ``weights`` are int8 weights of exactly ``model``'s targets, with their shapes and dtypes."""
    import torch

    expected = {}
    for name, linear in _targets(model).items():
        out_features, in_features = linear.weight.shape
        expected[f"{name}.w_int8"] = (torch.int8, (out_features, in_features))
        expected[f"{name}.w_scale"] = (torch.float32, (out_features,))
        expected[f"{name}.inv_smooth"] = (torch.float32, (in_features,))
        if linear.bias is not None:
            expected[f"{name}.bias"] = (torch.float32, (out_features,))
    if not expected or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        return False
    return {k: (t.dtype, tuple(t.shape)) for k, t in weights.items()} == expected


def swap_in(model: Any, weights: dict[str, torch.Tensor]) -> Any:
    """A copy of ``model`` whose target Linears are :func:`int8_weights`' int8 modules (``model`` is untouched)."""
    quantized = copy.deepcopy(model)
    for name in _targets(model):
        module = _int8_linear_class()(weights[f"{name}.w_int8"], weights[f"{name}.w_scale"],
                                      weights[f"{name}.inv_smooth"], weights.get(f"{name}.bias"))
        parent, _, child = name.rpartition(".")
        setattr(quantized.get_submodule(parent), child, module)
    return quantized


# -- the user's cache of quantized weights -----------------------------------------------------------------------
# Quantizing costs each process seconds (a float32 pass over the calibration text, then GPTQ; the log line
# "quantized to int8 in N s" says how many), every Dask worker of every rebuild. The result depends only
# on the model, the passage format and the recipe below, so it is kept in the user's cache, as pip and Hugging Face
# keep theirs, and read back instead (logged as "int8 ... read from <path> in N s").

# Bump when int8_weights' recipe or layout changes what it writes: old files then stop matching a key.
CACHE_FORMAT = 3


def cache_key(passage_fingerprint_id: str) -> str:
    """The file name stem of the cached int8 weights of the passage encoder ``passage_fingerprint_id``."""
    import hashlib
    import json

    import torch

    recipe = {
        "encoder": passage_fingerprint_id,  # weights, passage format, max_length: what the calibration pass sees
        "calibration_sha256": hashlib.sha256(CALIBRATION_FILE.read_bytes()).hexdigest(),
        "weight_bits": WEIGHT_BITS, "smoothing": SMOOTHING, "format": CACHE_FORMAT,
        "torch": ".".join(torch.__version__.split(".")[:2]),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:24]


def cache_folder() -> Path:
    """``<user cache>/int8`` (:func:`rag_core.storage.user_cache_dir`: ``~/.cache/wikirag`` by default)."""
    from rag_core.storage import user_cache_dir

    return user_cache_dir() / "int8"


def cache_path(key: str) -> Path:
    """Where the int8 weights of :func:`cache_key` ``key`` are kept: ``<cache_folder()>/<key>.pt``."""
    return cache_folder() / f"{key}.pt"


def read_cached(path: Path, model: Any) -> dict[str, torch.Tensor] | None:
    """The int8 weights kept at ``path`` for ``model``; None when there are none (or, after a warning, none usable)."""
    import torch

    if not path.exists():
        return None
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torn, truncated or not ours: quantize again and overwrite it
        log.warning("%s: unreadable cached int8 weights (%s: %s); quantizing again and replacing it",
                    path, type(exc).__name__, str(exc)[:120])
        return None
    if not isinstance(weights, dict) or not fits(model, weights):
        log.warning("%s: cached int8 weights do not fit this model's Linears; quantizing again and replacing it",
                    path)
        return None
    return weights


def write_cached(path: Path, weights: dict[str, torch.Tensor]) -> bool:
    """Keep ``weights`` at ``path`` (:func:`rag_core.storage.write_aside`: readers never see half a file). False if it
    failed."""
    import torch

    from rag_core.storage import write_aside

    try:
        write_aside(path, lambda f: torch.save(weights, f))
    except OSError as exc:  # a read-only or full home: the next process quantizes again, nothing else changes
        log.warning("could not keep the int8 weights in %s (%s); each process will quantize again",
                    path, exc.strerror or exc)
        return False
    return True


@functools.cache
def int8_probe_speedup(repeats: int = 7) -> float:
    """float32 time / int8 time of one FFN-input Linear (quantizing the input included), one thread, best of each.

    The two alternate, so that a busy machine slows both alike. ~0.7 s where int8 runs on AVX2 kernels. 0 where
    this torch has no int8 Linear kernels.
    """
    import torch

    m, k, n = _PROBE_SHAPE
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(m, k)
        weight, bias = torch.randn(n, k), torch.randn(n)
        inv_smooth = torch.rand(k) + 0.5
        try:
            packed = pack_weight(torch.randint(-63, 64, (n, k), dtype=torch.int8), torch.rand(n) + 0.5)
        except RuntimeError:  # no quantized engine in this build of torch
            return 0.0

        def fp32():
            torch.nn.functional.linear(x, weight, bias)

        def int8():
            int8_linear(x, packed, inv_smooth, bias)

        best = {fp32: float("inf"), int8: float("inf")}
        # Warm-up: the int8 path's first calls ran ~1.4x its settled time (held to AVX2 on an Intel Xeon,
        # settling by the 6th call), enough to swing the verdict when timed too early.
        for _ in range(5):
            for fn in best:
                fn()
        for _ in range(repeats):
            for fn in best:
                start = time.perf_counter()
                fn()
                best[fn] = min(best[fn], time.perf_counter() - start)
        return best[fp32] / best[int8]
    finally:
        torch.set_num_threads(threads)


PROBE_NAME = "int8-linear"  # its verdict's name in the user's probe cache


def measured_speedup() -> float:
    """:func:`int8_probe_speedup` of this machine, timed once per CPU and kept (:func:`rag_core.perf.probes.cached_probe`)."""
    from rag_core.perf.probes import cached_probe

    return cached_probe(PROBE_NAME, int8_probe_speedup)


def decide_engine(requested: str, dtype_requested: str, dtype: str, device: str,
                  probe: Callable[[], float]) -> tuple[str, str]:
    """("int8" or "torch", why) for a requested engine "auto"; the rule is in the module docstring."""
    if requested != "auto":
        return requested, "asked for explicitly"
    if device != "cpu" or dtype != "float32":
        return "torch", f"{dtype} on {device}"
    if dtype_requested != "auto":
        return "torch", "float32 asked for explicitly"
    speedup = probe()
    if speedup < MIN_INT8_SPEEDUP:
        return "torch", f"float32 on CPU, int8 probe only {speedup:.2f}x faster (< {MIN_INT8_SPEEDUP})"
    return "int8", f"float32 on CPU, int8 probe {speedup:.1f}x faster"


def auto_engine(dtype_requested: str, dtype: str, device: str) -> str:
    """What ``engine="auto"`` runs here: "int8" or "torch"; "torch" without a probe when the machinery is off."""
    from rag_core import perf

    return _auto_engine(dtype_requested, dtype, device) if perf.enabled() else "torch"


@functools.cache
def _auto_engine(dtype_requested: str, dtype: str, device: str) -> str:
    """Decided (the probe runs at most once) and logged once a process."""
    engine, why = decide_engine("auto", dtype_requested, dtype, device, measured_speedup)
    # said where the probe decided; bf16, or a float32 the caller fixed, leaves nothing to report
    decided = engine == "int8" or (device == "cpu" and dtype == "float32" and dtype_requested == "auto")
    log.log(logging.INFO if decided else logging.DEBUG, "encoder engine %s: %s",
            f"int8 ({TARGETS_LABEL})" if engine == "int8" else engine, why)
    return engine
