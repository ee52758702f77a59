"""The local Dask cluster a command starts: loopback only, tuned workers, and a bounded close.

``distributed``'s ``Cluster.close()`` waits without a limit by default. A
command stopped with SIGTERM after its workers had frozen or died was seen
hanging there for minutes (``DaskTaskRunner.__exit__`` -> ``SpecCluster.close``
-> ``sync``). Here the close is bounded; worker processes still there when it
gives up are killed, so nothing outlives the command.

The workers are tuned as every wikirag process is (runtime.process_tuning,
off with ``WIKIRAG_PROCESS_TUNING=off``): without Dask's malloc trim, with
Dask's background sampling turned down, and each worker runs
:func:`runtime.process_tuning.start_process` when it starts and freezes its
objects before its exit (the preload hooks below).

A worker whose heartbeat meets a scheduler that is closing logs
``distributed.worker - ERROR - Failed to communicate with scheduler during
heartbeat.`` with a full traceback (an upstream race, dask/distributed#7105).
A command that fails early, e.g. on a corrupt dump, closes its cluster seconds
after starting it, and that traceback landed beside the command's one-line
error. The local cluster's workers preload this module, whose
:func:`dask_setup` turns that one record into a one-line warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any

from distributed import LocalCluster

from runtime import process_tuning

log = logging.getLogger("wikirag")
CLOSE_TIMEOUT_S = 15.0
HEARTBEAT_LOST = "Failed to communicate with scheduler during heartbeat."


class OneLineLostHeartbeat(logging.Filter):
    """Distributed's lost-heartbeat error, traceback and all, as a one-line warning naming the exception."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == HEARTBEAT_LOST and record.exc_info:
            exc = record.exc_info[1]
            record.msg = f"{HEARTBEAT_LOST[:-1]} ({type(exc).__name__}: {exc}); expected while the cluster closes"
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def dask_teardown(worker: Any) -> None:
    """Dask's preload hook at a worker's close: :func:`runtime.process_tuning.freeze_before_exit`."""
    process_tuning.dask_teardown(worker)


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, run in each worker process of a :class:`BoundedLocalCluster` (module docstring)."""
    process_tuning.dask_setup(worker)
    worker_log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, OneLineLostHeartbeat) for f in worker_log.filters):
        worker_log.addFilter(OneLineLostHeartbeat())


class BoundedLocalCluster(LocalCluster):
    """A ``LocalCluster`` whose ``close()`` gives up after ``close_timeout`` seconds and kills its worker processes.

    Its workers preload this module (:func:`dask_setup`, :func:`dask_teardown`), besides any ``preload`` given,
    and sample less in the background (:func:`runtime.process_tuning.quiet_background`).
    """

    def __init__(self, *args: Any, close_timeout: float = CLOSE_TIMEOUT_S, **kwargs: Any) -> None:
        self.close_timeout = close_timeout
        process_tuning.keep_glibc_malloc()
        process_tuning.quiet_background()
        given = kwargs.get("preload") or []
        kwargs["preload"] = [*([given] if isinstance(given, str) else given), __name__]  # Dask takes a str or list
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
