"""The ranks of a running torchrun job, watched from the launcher: their peak memory, and how a killed one died.

:class:`RankWatch` samples, every ``interval`` seconds, the resident memory of each process under the
torchrun launcher that carries a ``RANK`` in its environment (torchrun's workers), and keeps each rank's
pid and peak RSS. After a failed job :func:`killed_rank` reads torchrun's error report (``rank : N``,
``exitcode : -9 (pid: P)``, ``Signal 9 (SIGKILL) received by PID P``) and :meth:`RankWatch.kill_line`
turns it into one line: a rank killed by SIGKILL while the kernel's OOM killer ran (``oom_kill`` in
/proc/vmstat grew during the job) or while the machine's available memory was nearly gone is reported
as killed by the kernel for memory, with its peak RSS; any other signal as that signal.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

GB = 1e9
SHORT = 0.05  # available memory below this fraction of the total: memory was short
_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID (\d+)")
_EXIT = re.compile(r"exitcode\s*:\s*-(\d+) \(pid: (\d+)\)")
_RANK = re.compile(r"^\s*(?:\S+\s+)?rank\s*:\s*(\d+)")


def oom_kills(vmstat: Path = Path("/proc/vmstat")) -> int | None:
    """The kernel's count of processes its OOM killer has killed since boot (None where it is not exposed)."""
    try:
        for line in vmstat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class Killed:
    """A rank that died by a signal, from torchrun's report."""

    rank: int | None
    pid: int
    signum: int


def killed_rank(lines: Iterable[str]) -> Killed | None:
    """The rank torchrun reports as killed by a signal in its "Root Cause" block (ranks it stopped after that one
    are listed before it, under "Failures"), if any."""
    lines = list(lines)
    cause = next((i for i, line in enumerate(lines) if "Root Cause" in line), 0)
    rank = None
    for line in lines[cause:]:
        if (found := _RANK.match(line)) is not None:
            rank = int(found.group(1))
        elif (found := _EXIT.search(line)) is not None:
            return Killed(rank, int(found.group(2)), int(found.group(1)))
        elif (found := _SIGNAL.search(line)) is not None:
            return Killed(rank, int(found.group(3)), int(found.group(1)))
    return None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class RankWatch:
    """Samples the ranks under a torchrun launcher's pid in a daemon thread (module docstring)."""

    def __init__(self, launcher_pid: int, interval: float = 0.5, vmstat: Path = Path("/proc/vmstat")) -> None:
        self.launcher_pid, self.interval, self.vmstat = launcher_pid, interval, vmstat
        self.ranks: dict[int, int] = {}  # pid -> rank
        self.peaks: dict[int, int] = {}  # rank -> peak RSS bytes
        self.total = psutil.virtual_memory().total
        self.least_available = psutil.virtual_memory().available
        self.oom_before = oom_kills(vmstat)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rank-watch", daemon=True)

    def __enter__(self) -> RankWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        """One look at every rank's RSS and at the machine's available memory."""
        self.least_available = min(self.least_available, psutil.virtual_memory().available)
        try:
            children = psutil.Process(self.launcher_pid).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                rank = self.ranks.get(child.pid)
                if rank is None:
                    value = child.environ().get("RANK")
                    if value is None:
                        continue
                    rank = self.ranks[child.pid] = int(value)
                self.peaks[rank] = max(self.peaks.get(rank, 0), child.memory_info().rss)
            except (psutil.Error, ValueError):
                continue  # gone between the listing and the read, or not ours to read

    def memory_was_short(self) -> bool:
        after = oom_kills(self.vmstat)
        if self.oom_before is not None and after is not None and after > self.oom_before:
            return True
        return self.least_available < SHORT * self.total

    def kill_line(self, killed: Killed) -> str:
        """One line for a rank that died by a signal: the kernel's OOM kill, or the signal, with its peak RSS."""
        rank = killed.rank if killed.rank is not None else self.ranks.get(killed.pid)
        who = f"rank {rank}" if rank is not None else f"a rank (pid {killed.pid})"
        peak = self.peaks.get(rank, 0) if rank is not None else 0
        memory = f"peak RSS {peak / GB:.1f} GB of {self.total / GB:.1f} GB"
        if killed.signum == signal.SIGKILL and self.memory_was_short():
            return f"{who} was killed by the kernel (out of memory: {memory}); lower --nproc or --n-docs"
        name = signal_name(killed.signum)
        return f"{who} was killed by signal {killed.signum} ({name}; {memory}, memory was not short)"

    def peak_line(self) -> str:
        return ", ".join(f"rank {rank} {peak / GB:.2f} GB" for rank, peak in sorted(self.peaks.items()))
