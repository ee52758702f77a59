"""Where the code runs: the CPU's facts, and the precision every wikirag model runs in.

Machines of one kind differ from day to day: an Intel CPU with AMX computes
bf16 matmuls ~70x faster than an AMD EPYC with AVX2 only, where bf16 is
~50x *slower* than float32 (../shared/STACK.md). So no dtype is fixed in
code: :func:`choose_precision` decides where the model loads, once per
process and device, and says why.

The rule (:func:`decide_precision`, pure, so tests cover every branch):

- an explicit ``float32`` or ``bfloat16`` wins;
- ``auto`` on CUDA: bf16 where the device supports it, else float32;
- ``auto`` on CPU: float32 unless torch's CPU capability is AVX512 or
  better *and* the CPU flags show native bf16 (``avx512_bf16`` or
  ``amx_bf16``) *and* a short timed probe (a 256x384 @ 384x1536 matmul on one
  thread, the shape of an encoder layer) runs bf16 at least
  :data:`MIN_BF16_SPEEDUP` times as fast as float32. The probe catches what
  flags cannot: ``ATEN_CPU_CAPABILITY``/``ONEDNN_MAX_CPU_ISA`` limits, a
  hypervisor that hides AMX state, a torch build without the kernels.

Faithfulness is the callers' part: bf16 weights keep cosine >= 0.999 for the
encoders (tested in tests/rag_core/index/test_encoders.py).

Timed probes (this one, and the int8 engine's) are kept per machine by
:func:`cached_probe`: the first process on a CPU measures, later ones (each Dask
worker, each ``wikirag ask``) read the verdict instead of spending up to
~0.5 s on it again.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger("wikirag")

DtypeChoice = Literal["auto", "float32", "bfloat16"]
MIN_BF16_SPEEDUP = 1.2  # bf16 must beat float32 by this much on the probe to be chosen
_PROBE_SHAPE = (256, 384, 1536)  # tokens x hidden @ hidden x ffn: one encoder FFN matmul
_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# The environment that makes torch on a newer x86 CPU run as on an AVX2-only one (an AMD EPYC without
# AVX512): ATen's own kernels, oneDNN (bf16 matmuls), MKL (float32 GEMM) and FBGEMM (int8 GEMM: an
# encoder-shaped int8 Linear took 2.2x as long on its AVX2 kernels as on an AMD EPYC's VNNI ones) all
# dispatch to AVX2. ONNX Runtime has no such switch: its kernels follow the CPU's flags. For a child
# process (benchmarks' --avx2, a test); the libraries read it when they load, so it cannot be set later.
AVX2_EMULATION = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                  "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}


@dataclass(frozen=True)
class Precision:
    """A dtype and the reason it was chosen (logged once per process)."""

    dtype: Literal["float32", "bfloat16"]
    reason: str

    @property
    def torch_dtype(self):  # -> torch.dtype; torch is imported only when asked
        import torch

        return torch.bfloat16 if self.dtype == "bfloat16" else torch.float32


@dataclass(frozen=True)
class Hardware:
    """What a benchmark or a run prints about the machine it ran on."""

    cpu_model: str
    capability: str  # torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512, AVX512_BF16? ...
    cpu_flags: tuple[str, ...]  # the bf16/AMX-relevant flags of /proc/cpuinfo
    cores: int  # cores this process may run on
    threads: int  # torch's intra-op threads
    load: tuple[float, float, float]  # 1, 5, 15 min load average when described

    def line(self) -> str:
        """``CPU <model> [amx_bf16 avx512_bf16], torch capability AVX512, 2 cores, 1 thread, load 0.52``."""
        flags = " ".join(self.cpu_flags) or "no native bf16"
        return (f"CPU {self.cpu_model} [{flags}], torch capability {self.capability}, {self.cores} cores, "
                f"{self.threads} thread{'s' if self.threads != 1 else ''}, load {self.load[0]:.2f}")


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and value.strip():
                    model = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                    break
    except OSError:  # not Linux: the probe alone decides
        pass
    return model, flags


def cpu_capability() -> str:
    """torch's CPU capability (AVX2, AVX512, ...): what its own kernels were dispatched to."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def describe() -> Hardware:
    """The machine as this process sees it now (torch is imported)."""
    import torch

    model, flags = _cpuinfo()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    relevant = tuple(sorted(f for f in flags if f in _NATIVE_BF16_FLAGS or f.startswith("amx")))
    return Hardware(model, cpu_capability(), relevant, cores, torch.get_num_threads(), os.getloadavg())


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


# What makes a probe's verdict hold for a machine: the CPU, torch, and the variables that limit its kernels'
# instruction sets (a process held to AVX2 measures differently from one that is not).
_ISA_ENV = (*AVX2_EMULATION, "DNNL_MAX_CPU_ISA", "MKL_DEBUG_CPU_TYPE", "MKL_CBWR")
PROBE_CACHE_FORMAT = 1  # bump when a probe's measurement changes meaning: old verdicts stop matching


def probe_cache_path() -> Path:
    """``<user cache>/probes.json`` (:func:`rag_core.storage.user_cache_dir`): timed probes' verdicts by machine."""
    from rag_core.storage import user_cache_dir

    return user_cache_dir() / "probes.json"


def _probe_key(name: str, cpu_model: str, cpu_flags: set[str]) -> str:
    import torch

    facts = {"probe": name, "format": PROBE_CACHE_FORMAT, "cpu": cpu_model, "flags": sorted(cpu_flags),
             "torch": torch.__version__, "capability": cpu_capability(),
             "env": {k: os.environ.get(k) for k in _ISA_ENV}}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def _read_probes(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # torn or not ours: measure again and replace it
        log.debug("%s: unreadable probe cache (%s); measuring again", path, exc)
        return {}
    return entries if isinstance(entries, dict) else {}


def kept_probe(name: str) -> float | None:
    """This machine's kept verdict of the probe ``name`` (see :func:`cached_probe`); None when there is none."""
    kept = _read_probes(probe_cache_path()).get(_probe_key(name, *_cpuinfo()))
    value = kept.get("value") if isinstance(kept, dict) else None
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def cached_probe(name: str, probe: Callable[[], float]) -> float:
    """``probe()`` for this machine, measured once and kept in :func:`probe_cache_path` under a key of the CPU
    (model and flags), torch and its instruction-set variables, so the same CPU gets the same verdict without
    timing it again. A cache that cannot be read or written costs only the measurement."""
    kept = kept_probe(name)
    if kept is not None:
        return kept
    value = probe()
    path, (model, flags) = probe_cache_path(), _cpuinfo()
    entries = _read_probes(path)  # again: another process may have added its own since
    entries[_probe_key(name, model, flags)] = {"probe": name, "value": value, "cpu": model,
                                               "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    from rag_core.storage import write_aside

    try:
        write_aside(path, lambda f: f.write(json.dumps(entries, indent=1, sort_keys=True).encode()))
    except OSError as exc:  # a read-only or full home: the next process measures again
        log.debug("could not keep the %s probe in %s: %s", name, path, exc)
    return value


def decide_precision(requested: DtypeChoice, device: str, *, capability: str = "", cpu_flags: frozenset[str] = frozenset(),
                     probe: float | None = None, cuda_bf16: bool = False) -> Precision:
    """The rule in the module docstring, with the facts passed in (``probe``: bf16 speed-up, None = not run)."""
    if requested != "auto":
        return Precision(requested, "asked for explicitly")
    if device.startswith("cuda"):
        if cuda_bf16:
            return Precision("bfloat16", f"{device} supports bf16")
        return Precision("float32", f"{device} has no bf16 support")
    native = sorted(f for f in cpu_flags if f in _NATIVE_BF16_FLAGS)
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


# glibc's mallopt parameters and the values wikirag sets (see keep_freed_memory)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's maximum: blocks below it come from the heap and are reused
TRIM_THRESHOLD = 512 << 20  # freed heap kept for reuse before any goes back to the OS
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
DASK_TRIM_DEFAULT = "65536"  # what a plain Dask nanny exports as MALLOC_TRIM_THRESHOLD_; not a user's choice


@functools.cache
def keep_freed_memory() -> bool:
    """Let glibc reuse the heap that a model's forward pass frees, instead of unmapping it; once per process.

    Why: a forward pass allocates its activations anew on every batch (an encoder batch: several tensors of
    10-25 MiB). Under glibc's adaptive thresholds, many of them become fresh ``mmap``s (or heap that was
    trimmed) whose pages fault in again on first touch: 1,500-2,000 page faults per passage encoded in
    tests/rag_core/test_hardware.py, each a trip into the kernel (dearer in a VM), and how often varies from
    process to process. Fixing the mmap threshold at glibc's maximum and keeping up to :data:`TRIM_THRESHOLD`
    of freed heap brought that to 2-170 there. The cost is memory the process keeps after a peak (at most
    the trim threshold above what it uses).

    Returns whether the thresholds were set: not on a libc without ``mallopt`` (musl, macOS), nor where the
    environment already sets a malloc threshold (a user's tuning wins; Dask's nanny default does not count).
    """
    user_set = [k for k in _MALLOC_ENV if k in os.environ
                and not (k == "MALLOC_TRIM_THRESHOLD_" and os.environ[k] == DASK_TRIM_DEFAULT)]
    if user_set or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


@functools.cache
def choose_precision(requested: DtypeChoice = "auto", device: str = "cpu") -> Precision:
    """The dtype to load a model in on ``device``: decided and logged once per process (see the module).

    On CPU it also sets glibc's malloc to reuse freed memory (:func:`keep_freed_memory`): every model wikirag
    runs on a CPU goes through here before it loads.
    """
    if requested not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"dtype {requested!r}: use auto, float32 or bfloat16")
    if device == "cpu":
        keep_freed_memory()
    if requested != "auto":
        return decide_precision(requested, device)
    if device.startswith("cuda"):
        import torch

        precision = decide_precision("auto", device, cuda_bf16=torch.cuda.is_bf16_supported())
    else:
        _, flags = _cpuinfo()
        capability = cpu_capability()
        needs_probe = capability.upper().startswith("AVX512") and any(f in flags for f in _NATIVE_BF16_FLAGS)
        precision = decide_precision("auto", device, capability=capability, cpu_flags=frozenset(flags),
                                     probe=cached_probe("bf16-matmul", bf16_probe_speedup) if needs_probe else None)
    log.info("model dtype %s on %s: %s", precision.dtype, device, precision.reason)
    return precision
