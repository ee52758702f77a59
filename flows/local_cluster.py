"""The local Dask cluster a command starts: loopback only, and a close that cannot keep a stopping command waiting.

``distributed``'s ``Cluster.close()`` waits without a limit by default. A
command stopped with SIGTERM after its workers had frozen or died was seen
hanging there for minutes (``DaskTaskRunner.__exit__`` -> ``SpecCluster.close``
-> ``sync``). Here the close is bounded; worker processes still there when it
gives up are killed, so nothing outlives the command.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any

from distributed import LocalCluster

log = logging.getLogger("wikirag")
CLOSE_TIMEOUT_S = 15.0


class BoundedLocalCluster(LocalCluster):
    """A ``LocalCluster`` whose ``close()`` gives up after ``close_timeout`` seconds and kills its worker processes."""

    def __init__(self, *args: Any, close_timeout: float = CLOSE_TIMEOUT_S, **kwargs: Any) -> None:
        self.close_timeout = close_timeout
        super().__init__(*args, **kwargs)

    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (nanny-managed) this cluster started."""
        pids = []
        for worker in list(self.workers.values()):
            process = getattr(getattr(worker, "process", None), "process", None)
            if process is not None and process.pid:
                pids.append(process.pid)
        return pids

    def close(self, timeout: float | None = None) -> Any:
        pids = self.worker_pids()
        try:
            return super().close(timeout=self.close_timeout if timeout is None else timeout)
        except TimeoutError:
            if not pids:
                # No worker process to kill: seen at interpreter exit (distributed's atexit hook closes leftover
                # clusters with a 10 s limit), where a warning would only go to an already closed stream.
                return None
            log.warning("the local Dask cluster did not close within %.0f s; killing its worker processes %s",
                        self.close_timeout if timeout is None else timeout, pids)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return None
