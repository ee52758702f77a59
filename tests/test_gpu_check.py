"""bench/gpu_check.py runs end to end: on the CPU with --allow-cpu --tiny, and refuses in one line without CUDA."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"
FIGURE = r"\| {name} \| ([0-9.e+-]+) / ([0-9.e+-]+) / ([0-9.e+-]+) \|"


def run(*args: str, env_device: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "WIKIRAG_DEVICE"}
    if env_device:
        env["WIKIRAG_DEVICE"] = env_device
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_allow_cpu_tiny_measures_the_three_figures(tmp_path: Path) -> None:
    markdown = tmp_path / "gpu.md"
    done = run("--allow-cpu", "--tiny", "--markdown", str(markdown), env_device="cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    text = markdown.read_text()
    assert text in done.stdout
    assert "Device cpu:" in text and re.search(r"precision (float32|bfloat16) \(", text)
    for name in ("passages/s", "training examples/s", r"ask latency \(s\)"):
        found = re.search(FIGURE.format(name=name), text)
        assert found, f"no {name} row in:\n{text}"
        low, mid, high = map(float, found.groups())
        assert 0 < low <= mid <= high


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_runs_nothing() -> None:
    done = run("--tiny")
    assert done.returncode == 2
    assert done.stdout.strip().count("\n") == 0 and "no CUDA device here" in done.stdout
    assert "--allow-cpu" in done.stdout and "GPU check on" not in done.stdout
