"""docs/benchmarks.md holds only the benchmarks' generated tables (bench/assemble.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_page_is_exactly_the_generated_results() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "assemble.py"), "--check"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for result in (ROOT / "bench" / "results").glob("*.md"):
        assert f"From `bench/results/{result.name}`." in page
        assert "`python bench/" in result.read_text()  # every result names the command that made it
