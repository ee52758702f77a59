"""The CPU a process runs on: its model, its bf16/AMX flags, torch's kernel capability, and the line that says so.

Machines of one kind differ from day to day (an Intel CPU with AMX, an AMD
EPYC with AVX2 only: ../shared/STACK.md), so every choice of precision or
engine starts from these facts, and every benchmark prints
:meth:`Hardware.line`.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# The environment that makes torch on a newer x86 CPU run as on an AVX2-only one (an AMD EPYC without
# AVX512): ATen's own kernels, oneDNN (bf16 matmuls), MKL (float32 GEMM) and FBGEMM (int8 GEMM: an
# encoder-shaped int8 Linear took 2.2x as long on its AVX2 kernels as on an AMD EPYC's VNNI ones) all
# dispatch to AVX2. For a child process (benchmarks' --avx2, a test); the libraries read it when they load,
# so it cannot be set later.
AVX2_EMULATION = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                  "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}


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


def cpuinfo() -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; the platform's processor and no flags elsewhere."""
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

    model, flags = cpuinfo()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    relevant = tuple(sorted(f for f in flags if f in NATIVE_BF16_FLAGS or f.startswith("amx")))
    return Hardware(model, cpu_capability(), relevant, cores, torch.get_num_threads(), os.getloadavg())
