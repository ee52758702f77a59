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


def stop_process_group(pid: int, timeout: float = 20.0) -> None:
    """SIGTERM the group led by ``pid``, wait up to ``timeout`` s, then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap our own child, so the group can empty
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def die_with_parent() -> None:
    """``preexec_fn``: on Linux, SIGTERM this child when its parent dies (even by SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
