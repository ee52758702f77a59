"""The launcher's watch over torchrun's ranks (tasks/adapters/torchrun_ranks.py): real torchrun jobs whose rank 1
dies by SIGKILL.

The kernel's OOM killer is not triggered here (the machine is shared): the rank kills itself with
SIGKILL, as the OOM killer would, and the kernel's ``oom_kill`` counter is read from a file the test
writes in /proc/vmstat's format. The whole training job killed mid-run is in
tests/rag_core/train/test_recipe_ddp.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.adapters.torchrun_ranks import RankWatch, killed_rank, oom_kills

pytestmark = pytest.mark.slow

RANK_SCRIPT = """
import os, signal, time
block = bytearray(300_000_000)
for i in range(0, len(block), 4096):
    block[i] = 1  # touched: resident
time.sleep(3)
if os.environ["RANK"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def _killed_job(tmp_path: Path, oom_before: int, oom_after: int) -> tuple[RankWatch, str]:
    """torchrun with 2 ranks of RANK_SCRIPT, watched; the fake vmstat's counter moves while it runs."""
    script, vmstat = tmp_path / "rank.py", tmp_path / "vmstat"
    script.write_text(RANK_SCRIPT)
    vmstat.write_text(f"nr_free_pages 1000\noom_kill {oom_before}\npgfault 7\n")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    with RankWatch(proc.pid, interval=0.2, vmstat=vmstat) as watch:
        out, _ = proc.communicate(timeout=120)
        vmstat.write_text(f"nr_free_pages 1000\noom_kill {oom_after}\npgfault 7\n")
    assert proc.returncode != 0, out[-2000:]
    return watch, out


def test_a_rank_killed_while_the_oom_killer_ran_is_reported_as_out_of_memory(tmp_path: Path) -> None:
    watch, out = _killed_job(tmp_path, 3, 4)
    killed = killed_rank(out.splitlines())
    assert killed is not None and killed.rank == 1 and killed.signum == 9, out[-2000:]
    assert sorted(watch.peaks) == [0, 1] and watch.ranks[killed.pid] == 1
    line = watch.kill_line(killed)
    found = re.fullmatch(r"rank 1 was killed by the kernel \(out of memory: peak RSS (\d+\.\d) GB of (\d+\.\d) GB\); "
                         r"lower --nproc or --n-docs", line)
    assert found, line
    assert 0.3 <= float(found.group(1)) < 1.0  # the 300 MB it touched, sampled
    assert float(found.group(2)) > 1.0  # the machine's memory


def test_a_rank_killed_by_sigkill_without_memory_pressure_names_the_signal(tmp_path: Path) -> None:
    watch, out = _killed_job(tmp_path, 5, 5)
    line = watch.kill_line(killed_rank(out.splitlines()))
    assert re.fullmatch(r"rank 1 was killed by signal 9 \(SIGKILL; peak RSS 0\.\d GB of \d+\.\d GB, memory was "
                        r"not short\)", line), line
    assert "\n" not in line


def test_the_kernels_oom_counter_is_read_where_it_exists(tmp_path: Path) -> None:
    assert isinstance(oom_kills(), int) or not Path("/proc/vmstat").exists()
    (tmp_path / "vmstat").write_text("pgfault 7\n")
    assert oom_kills(tmp_path / "vmstat") is None and oom_kills(tmp_path / "absent") is None
    assert killed_rank(["rank 0 INFO step 3", "everything fine"]) is None


def test_the_ranks_run_the_checkout_that_holds_the_launcher() -> None:
    # The ranks start as `python -m tasks.adapters.torchrun_launcher` with ROOT first on PYTHONPATH and as cwd: it
    # must be the folder that holds tasks/ and rag_core/, or a rank imports another copy of the code (or none).
    from tasks.adapters import torchrun_launcher

    root = torchrun_launcher.ROOT
    assert (root / "tasks" / "adapters" / "torchrun_launcher.py").resolve() == Path(torchrun_launcher.__file__).resolve()
    assert (root / "rag_core" / "__init__.py").is_file()
