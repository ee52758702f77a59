"""docs/benchmarks.md holds only the benchmarks' generated results, the latest run of each (bench/assemble.py)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _assemble_module():
    spec = importlib.util.spec_from_file_location("bench_assemble", ROOT / "bench" / "assemble.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_benchmarks_page_is_exactly_the_generated_results() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "assemble.py"), "--check"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    results = sorted((ROOT / "bench" / "results").glob("*.md"))
    for result in results:
        assert f"From `bench/results/{result.name}`." in page
    benches = re.findall(r"^`python bench/(\w+)\.py", page, flags=re.MULTILINE)
    assert len(benches) == len(results) == len(set(benches)), benches  # one table's run per benchmark


def _result(bench: str, when: str, markdown: str) -> str:
    return (f"## {bench}\n\n`python bench/{bench}.py --markdown {markdown}` ({when} UTC)\n\n"
            f"Hardware: some CPU, 2 cores.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")


def test_two_runs_of_one_benchmark_are_refused_naming_both_files_and_the_older(tmp_path: Path) -> None:
    assemble = _assemble_module()
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    (results / "embedding-amd.md").write_text(_result("embed_bench", "2026-12-02 17:58",
                                                      "bench/results/embedding-amd.md"))
    (results / "embedding-intel.md").write_text(_result("embed_bench", "2026-12-04 04:33",
                                                        "bench/results/embedding-intel.md"))
    with pytest.raises(assemble.ResultFileError, match=r"embedding-amd\.md \(2026-12-02 17:58\) and "
                                                       r"bench/results/embedding-intel\.md .*delete the older"):
        assemble.assemble(results)
    (results / "embedding-amd.md").unlink()
    page = assemble.assemble(results)
    assert page.count("`python bench/embed_bench.py") == 1 and "From `bench/results/embedding-intel.md`." in page


def test_a_result_written_elsewhere_or_holding_several_runs_is_refused(tmp_path: Path) -> None:
    assemble = _assemble_module()
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    scratch = results / "rebuild.md"
    scratch.write_text(_result("rebuild_bench", "2026-12-04 23:15", "/tmp/scratch/rebuild1.md"))
    with pytest.raises(assemble.ResultFileError, match=r"rebuild\.md: its command writes --markdown "
                                                       r"/tmp/scratch/rebuild1\.md"):
        assemble.assemble(results)
    runs = [_result("rebuild_bench", when, "bench/results/rebuild.md") for when in ("2026-12-04 23:15",
                                                                                     "2026-12-04 23:52")]
    scratch.write_text("\n".join(runs))
    with pytest.raises(assemble.ResultFileError, match=r"rebuild\.md: 2 command lines"):
        assemble.assemble(results)
