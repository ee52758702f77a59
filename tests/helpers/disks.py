"""Real small filesystems for the tests of full disks: a tmpfs mounted for the test, then filled on purpose."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``mount``'s syntax: ``2m``) mounted at ``where``, unmounted afterwards. Mounting needs
    root: the test skips, with the reason, where it is not permitted."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a small filesystem needs `mount -t tmpfs` as root; this run is not root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({proc.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until about ``leave`` bytes are free (``filler-<n>`` files, removed to make space again)."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    (disk / f"filler-{len(list(disk.glob('filler-*')))}").write_bytes(b"\0" * max(0, free - leave))
