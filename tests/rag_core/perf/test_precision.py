"""The precision rule, branch by branch with injected facts, and once for real under the AVX2 emulation; the
switch that turns it off."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_core import perf
from rag_core.perf import int8_engine, precision
from rag_core.perf.cpu import AVX2_EMULATION, Hardware, describe
from rag_core.perf.precision import MIN_BF16_SPEEDUP, choose_precision, decide_precision

REPO = Path(__file__).resolve().parents[3]
AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
EPYC_AVX2 = frozenset({"avx2", "fma", "f16c"})


@pytest.mark.parametrize(("requested", "device", "facts", "dtype", "reason"), [
    # An explicit dtype wins whatever the hardware says.
    ("float32", "cpu", {"capability": "AVX512", "cpu_flags": AMX, "probe": 10.0}, "float32", "asked for explicitly"),
    ("bfloat16", "cpu", {"capability": "AVX2", "cpu_flags": EPYC_AVX2}, "bfloat16", "asked for explicitly"),
    # CUDA: the device's own bf16 support decides.
    ("auto", "cuda:0", {"cuda_bf16": True}, "bfloat16", "cuda:0 supports bf16"),
    ("auto", "cuda", {"cuda_bf16": False}, "float32", "cuda has no bf16 support"),
    # CPU: capability, then flags, then the probe.
    ("auto", "cpu", {"capability": "AVX2", "cpu_flags": EPYC_AVX2}, "float32",
     "CPU capability AVX2, no native bf16 kernels"),
    ("auto", "cpu", {"capability": "AVX2", "cpu_flags": AMX, "probe": 10.0}, "float32",  # ATEN_CPU_CAPABILITY=avx2
     "CPU capability AVX2, no native bf16 kernels"),
    ("auto", "cpu", {"capability": "", "cpu_flags": frozenset()}, "float32", "CPU capability unknown"),
    ("auto", "cpu", {"capability": "AVX512", "cpu_flags": frozenset({"avx512f"})}, "float32",
     "no native bf16 (no avx512_bf16/amx_bf16)"),
    ("auto", "cpu", {"capability": "AVX512", "cpu_flags": AMX, "probe": None}, "float32", "bf16 probe not run"),
    ("auto", "cpu", {"capability": "AVX512", "cpu_flags": AMX, "probe": 1 / 9.8}, "float32",  # ONEDNN_MAX_CPU_ISA
     "amx_bf16/avx512_bf16, but bf16 probe 9.8x slower"),
    ("auto", "cpu", {"capability": "AVX512", "cpu_flags": AMX, "probe": 1.1}, "float32",
     f"bf16 probe only 1.10x faster (< {MIN_BF16_SPEEDUP})"),
    ("auto", "cpu", {"capability": "AVX512", "cpu_flags": AMX, "probe": 9.6}, "bfloat16",
     "CPU capability AVX512 with amx_bf16/avx512_bf16, bf16 probe 9.6x faster"),
    ("auto", "cpu", {"capability": "AVX512_BF16", "cpu_flags": frozenset({"avx512_bf16"}), "probe": 2.0},
     "bfloat16", "with avx512_bf16, bf16 probe 2.0x faster"),
])
def test_rule(requested: str, device: str, facts: dict, dtype: str, reason: str) -> None:
    precision = decide_precision(requested, device, **facts)
    assert precision.dtype == dtype
    assert reason in precision.reason


def test_choose_precision_decides_once_logs_why_and_refuses_unknown_dtypes(caplog: pytest.LogCaptureFixture) -> None:
    precision._auto_precision.cache_clear()
    with caplog.at_level(logging.INFO, logger="wikirag"):
        first, again = choose_precision("auto", "cpu"), choose_precision("auto", "cpu")
    assert first is again and first.dtype in ("float32", "bfloat16")
    lines = [r.getMessage() for r in caplog.records if r.name == "wikirag"]
    assert lines == [f"model dtype {first.dtype} on cpu: {first.reason}"]
    assert choose_precision("float32").dtype == "float32"
    with pytest.raises(ValueError, match="dtype 'fp16': use auto, float32 or bfloat16"):
        choose_precision("fp16")  # type: ignore[arg-type]


def _choose_in_subprocess(env: dict[str, str]) -> tuple[str, str, str]:
    code = ("from rag_core.perf.cpu import describe; from rag_core.perf.precision import choose_precision; p = choose_precision('auto', 'cpu'); "
            "print(p.dtype); print(p.reason); print(describe().line())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=300, check=True)
    dtype, reason, line = out.stdout.strip().splitlines()
    return dtype, reason, line


def test_the_avx2_emulation_really_gets_float32() -> None:
    """torch run as on an AMD EPYC with AVX2 only: capability AVX2, so float32 (whatever this CPU is)."""
    dtype, reason, line = _choose_in_subprocess(AVX2_EMULATION)
    assert dtype == "float32"
    assert reason == "CPU capability AVX2, no native bf16 kernels"
    assert "torch capability AVX2" in line


def test_the_probe_catches_bf16_kernels_that_flags_promise_but_onednn_does_not_run() -> None:
    """oneDNN limited to AVX2 while torch's capability and the CPU flags still say bf16: the timed probe decides."""
    dtype, reason, _ = _choose_in_subprocess({"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert dtype == "float32"
    here = describe()
    if here.capability.upper().startswith("AVX512") and any(f in here.cpu_flags for f in ("amx_bf16", "avx512_bf16")):
        assert "bf16 probe" in reason and "x slower" in reason, reason  # the probe ran, on this CPU for real
    else:  # a CPU without native bf16: the flags already said no
        assert "no native bf16" in reason, reason


def test_hardware_line_names_cpu_capability_cores_threads_and_load() -> None:
    hw = Hardware("AMD EPYC 9B14", "AVX2", (), 2, 1, (0.52, 0.4, 0.3))
    assert hw.line() == "CPU AMD EPYC 9B14 [no native bf16], torch capability AVX2, 2 cores, 1 thread, load 0.52"
    here = describe()
    assert here.cores >= 1 and here.threads >= 1 and here.capability and here.cpu_model


def test_with_the_machinery_off_auto_is_float32_and_torch_and_nothing_is_timed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_probe(*_args, **_kwargs):
        pytest.fail("a probe was timed with the machinery off")

    monkeypatch.setattr(precision, "cached_probe", no_probe)
    monkeypatch.setattr(int8_engine, "measured_speedup", no_probe)
    perf.set_enabled(False)
    try:
        off = choose_precision("auto", "cpu")
        assert (off.dtype, off.reason) == ("float32", "performance machinery off (WIKIRAG_PERF=off)")
        assert int8_engine.auto_engine("auto", "float32", "cpu") == "torch"
        assert choose_precision("bfloat16").dtype == "bfloat16"  # an explicit dtype still wins
    finally:
        perf.set_enabled(True)
    assert perf.enabled()
