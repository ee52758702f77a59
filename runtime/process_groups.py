"""Process groups that wikirag starts (servers, services): stopped as a whole, never left behind.

Each server runs in a session of its own (``start_new_session=True``), so its
pid is also its process group id and one signal reaches every process it
spawned (gunicorn workers, Dask nannies, a Prefect server's children).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable


def stop_process_group(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM the group led by ``pid``, wait up to ``timeout`` s, then SIGKILL what is left."""
    stop_process_groups([pid], timeout)


def stop_process_groups(pids: Iterable[int], timeout: float = 20.0) -> None:
    """:func:`stop_process_group` for several groups at once: each has ``timeout`` s from the same SIGTERM, so
    groups that take a while to shut down gracefully wait side by side, not one after another."""
    left = set(pids)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for pid in list(left):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap our own child, so the group can empty
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                left.discard(pid)
        if left:
            time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def die_with_parent() -> None:
    """``preexec_fn``: on Linux, SIGTERM this child when its parent dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
