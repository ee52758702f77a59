"""The live processes below a pid, read from /proc, to prove a stop leaves none behind."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the repository root


def proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process; None when gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return (None if fields[0] == "Z" else (int(fields[1]), fields[19]))


def descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live process below ``root``."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            parents[int(entry)] = stat
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, started) in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = started
                frontier.append(pid)
    return found


def still_running(seen: dict[int, str]) -> list[str]:
    alive = []
    for pid, started in seen.items():
        stat = proc_stat(pid)
        if stat is not None and stat[1] == started:  # the same process, not a reused pid
            alive.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
    return alive


def stacks(pids: list[int]) -> str:
    """Every thread's Python stack in each live process (``py-spy dump``), for a test's message when a process
    that should have ended hangs; a line saying why where py-spy is missing or may not attach."""
    import shutil
    import subprocess

    if (spy := shutil.which("py-spy")) is None:
        return "(no stacks: py-spy is not installed)"
    dumps = []
    for pid in pids:
        if proc_stat(pid) is None:
            continue
        try:
            done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30,
                                  check=False)
        except subprocess.TimeoutExpired:  # the message this feeds must still come out
            dumps.append(f"pid {pid}: py-spy did not answer within 30 s")
            continue
        dumps.append(done.stdout or f"pid {pid}: {done.stderr.strip()}")
    return "\n".join(dumps)
