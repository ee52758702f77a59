"""The precision every wikirag model runs in, chosen where it loads.

Machines of one kind differ from day to day: an Intel CPU with AMX computes
bf16 matmuls ~70x faster than an AMD EPYC with AVX2 only, where bf16 is
~50x *slower* than float32 (../shared/STACK.md). So no dtype is fixed in
code: :func:`choose_precision` decides where the model loads, once per
process and device, and says why. Which device that is, is
:func:`rag_core.perf.device.choose_device`'s rule.

The rule (:func:`decide_precision`, pure, so tests cover every branch):

- an explicit ``float32`` or ``bfloat16`` wins;
- ``auto`` on CUDA: bf16 where the GPU computes it natively (compute capability 8.0+,
  :func:`rag_core.perf.device.cuda_native_bf16`), else float32;
- ``auto`` on CPU: float32 unless torch's CPU capability is AVX512 or
  better *and* the CPU flags show native bf16 (``avx512_bf16`` or
  ``amx_bf16``) *and* a short timed probe (a 256x384 @ 384x1536 matmul on one
  thread, the shape of an encoder layer) runs bf16 at least
  :data:`MIN_BF16_SPEEDUP` times as fast as float32. The probe catches what
  flags cannot: ``ATEN_CPU_CAPABILITY``/``ONEDNN_MAX_CPU_ISA`` limits, a
  hypervisor that hides AMX state, a torch build without the kernels.

Faithfulness is the callers' part: bf16 weights keep cosine >= 0.999 for the
encoders (tested in tests/rag_core/index/test_encoders.py).

With the machinery off (:func:`rag_core.perf.set_enabled`, ``WIKIRAG_PERF=off``)
``auto`` is float32 and no probe runs. The probe's verdict is kept per
machine (:func:`rag_core.perf.probes.cached_probe`).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Literal

from rag_core import perf
from rag_core.perf.cpu import NATIVE_BF16_FLAGS, cpu_capability, cpuinfo
from rag_core.perf.probes import cached_probe

log = logging.getLogger("wikirag")

DtypeChoice = Literal["auto", "float32", "bfloat16"]
MIN_BF16_SPEEDUP = 1.2  # bf16 must beat float32 by this much on the probe to be chosen
_PROBE_SHAPE = (256, 384, 1536)  # tokens x hidden @ hidden x ffn: one encoder FFN matmul


@dataclass(frozen=True)
class Precision:
    """A dtype and the reason it was chosen (logged once per process)."""

    dtype: Literal["float32", "bfloat16"]
    reason: str

    @property
    def torch_dtype(self):  # -> torch.dtype; torch is imported only when asked
        import torch

        return torch.bfloat16 if self.dtype == "bfloat16" else torch.float32


def bf16_probe_speedup(repeats: int = 7) -> float:
    """float32 time / bf16 time of one encoder-shaped matmul on one thread (best of ``repeats`` of each).

    The two dtypes alternate, so that a busy machine (a Prefect server and Dask
    workers starting beside the probe) slows both alike: timed one after the
    other, a bf16 matmul of ~0.3 ms could lose all of its few repeats to one
    preemption and look slower than float32 on a CPU where it is 5-9x faster.
    Takes ~0.05 s where bf16 is native, up to ~0.5 s where it is emulated.
    """
    import torch

    m, k, n = _PROBE_SHAPE
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        operands = {dtype: (torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype))
                    for dtype in (torch.float32, torch.bfloat16)}
        best = dict.fromkeys(operands, float("inf"))
        for a, b in operands.values():
            torch.matmul(a, b)  # warm-up: kernel selection, oneDNN primitive creation, AMX state
        for _ in range(repeats):
            for dtype, (a, b) in operands.items():
                start = time.perf_counter()
                torch.matmul(a, b)
                best[dtype] = min(best[dtype], time.perf_counter() - start)
            if best[torch.bfloat16] > 20 * best[torch.float32]:
                break  # hopeless: no need to wait for more of them
        return best[torch.float32] / best[torch.bfloat16]
    finally:
        torch.set_num_threads(threads)


def decide_precision(requested: DtypeChoice, device: str, *, capability: str = "", cpu_flags: frozenset[str] = frozenset(),
                     probe: float | None = None, cuda_bf16: bool = False) -> Precision:
    """The rule in the module docstring, with the facts passed in (``probe``: bf16 speed-up, None = not run)."""
    if requested != "auto":
        return Precision(requested, "asked for explicitly")
    if device.startswith("cuda"):
        if cuda_bf16:
            return Precision("bfloat16", f"{device} supports bf16")
        return Precision("float32", f"{device} has no bf16 support")
    native = sorted(f for f in cpu_flags if f in NATIVE_BF16_FLAGS)
    if not capability.upper().startswith("AVX512"):
        return Precision("float32", f"CPU capability {capability or 'unknown'}, no native bf16 kernels")
    if not native:
        return Precision("float32", f"CPU capability {capability}, but no native bf16 (no avx512_bf16/amx_bf16)")
    if probe is None:
        return Precision("float32", f"CPU capability {capability} with {'/'.join(native)}, bf16 probe not run")
    have = f"CPU capability {capability} with {'/'.join(native)}"
    if probe < 1:
        return Precision("float32", f"{have}, but bf16 probe {1 / probe:.1f}x slower")
    if probe < MIN_BF16_SPEEDUP:
        return Precision("float32", f"{have}, but bf16 probe only {probe:.2f}x faster (< {MIN_BF16_SPEEDUP})")
    return Precision("bfloat16", f"{have}, bf16 probe {probe:.1f}x faster")


def choose_precision(requested: DtypeChoice = "auto", device: str = "cpu") -> Precision:
    """The dtype to load a model in on ``device``: decided and logged once per process (see the module).

    With the machinery off (:func:`rag_core.perf.enabled`), ``auto`` is float32 and nothing is timed.
    """
    if requested not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"dtype {requested!r}: use auto, float32 or bfloat16")
    if requested != "auto":
        return decide_precision(requested, device)
    return _auto_precision(device, perf.enabled())


@functools.cache
def _auto_precision(device: str, machinery_on: bool) -> Precision:
    if not machinery_on:
        precision = Precision("float32", "performance machinery off (WIKIRAG_PERF=off)")
    elif device.startswith("cuda"):
        from rag_core.perf.device import cuda_native_bf16

        precision = decide_precision("auto", device, cuda_bf16=cuda_native_bf16(device))
    else:
        _, flags = cpuinfo()
        capability = cpu_capability()
        needs_probe = capability.upper().startswith("AVX512") and any(f in flags for f in NATIVE_BF16_FLAGS)
        precision = decide_precision("auto", device, capability=capability, cpu_flags=frozenset(flags),
                                     probe=cached_probe("bf16-matmul", bf16_probe_speedup) if needs_probe else None)
    log.info("model dtype %s on %s: %s", precision.dtype, device, precision.reason)
    return precision
