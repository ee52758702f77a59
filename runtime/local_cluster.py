"""The local Dask cluster a command starts: loopback only, glibc's own malloc tuning, and a bounded close.

``distributed``'s ``Cluster.close()`` waits without a limit by default. A
command stopped with SIGTERM after its workers had frozen or died was seen
hanging there for minutes (``DaskTaskRunner.__exit__`` -> ``SpecCluster.close``
-> ``sync``). Here the close is bounded; worker processes still there when it
gives up are killed, so nothing outlives the command.

Every core of a local cluster runs a worker, so Dask's own background sampling
(its statistical profiler above all) takes CPU from the encoding; the cluster
turns it down (:func:`quiet_background`) unless the user configured it.

Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (so that
freed memory goes back to the OS). Setting any glibc malloc threshold also
freezes the mmap threshold at 128 KiB, so every activation tensor of an encoder
batch is a fresh ``mmap`` whose pages fault in again, batch after batch:
passage encoding in a worker ran ~20% slower than in a plain process
(bench/worker_malloc_bench.py). wikirag's workers keep glibc's adaptive
thresholds instead: :data:`NANNY_ENVIRONMENT` for workers started by
``dask worker`` (services, infra/), :func:`keep_glibc_malloc` for the local
cluster, and :func:`without_dask_trim` for the environments a process hands on
after a nanny of its own left Dask's value there. Where a worker then loads a
model on CPU, :func:`rag_core.hardware.keep_freed_memory` fixes both
thresholds high, which removes the remaining page faults.

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
import gc
import logging
import os
import signal
from collections.abc import Mapping
from typing import Any

import dask
from distributed import LocalCluster

from rag_core.hardware import DASK_TRIM_DEFAULT

log = logging.getLogger("wikirag")
CLOSE_TIMEOUT_S = 15.0
# Dask reads this at import; a value of None removes the variable from what the nanny sets (its other defaults,
# one OpenMP/MKL/OpenBLAS thread, stay).
NANNY_ENVIRONMENT = {"DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON": "{'MALLOC_TRIM_THRESHOLD_': None}"}


def without_dask_trim(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less a MALLOC_TRIM_THRESHOLD_ of Dask's own value (a user's other value stays).

    A nanny exports its pre-spawn variables into its own process's environment and leaves them there, and the
    configured None above cannot remove a variable the environment already has: after any plain Dask cluster
    in a process, every later worker or child of it would inherit Dask's value.
    """
    return {k: v for k, v in environ.items() if not (k == "MALLOC_TRIM_THRESHOLD_" and v == DASK_TRIM_DEFAULT)}


def keep_glibc_malloc() -> None:
    """Workers this process's nannies start from now on run without Dask's MALLOC_TRIM_THRESHOLD_ (module docstring)."""
    dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
    if os.environ.get("MALLOC_TRIM_THRESHOLD_") == DASK_TRIM_DEFAULT:
        del os.environ["MALLOC_TRIM_THRESHOLD_"]  # left by an earlier nanny of this process (without_dask_trim)


# Background sampling each Dask process does besides its tasks. On a local cluster every core already runs a
# worker, so the CPU it takes comes out of the encoding: the statistical profiler alone samples the task thread's
# stack every 10 ms (bench/worker_background_bench.py measures the difference).
QUIET_SETTINGS = {
    "distributed.worker.profile.enabled": False,  # the dashboard's Profile page stays empty
    "distributed.admin.tick.interval": "1s",  # event-loop health check; still warns of a blocked loop
    "distributed.admin.system-monitor.interval": "5s",  # the dashboard's CPU/memory plots refresh every 5 s
}


def quiet_background() -> None:
    """Dask's background sampling, in this process and the workers its nannies start: :data:`QUIET_SETTINGS`,
    except where the user chose a value: in a Dask YAML file or ``DASK_*`` variable (any value), or with
    ``dask.config.set`` (a value other than Dask's default: one equal to it cannot be told from it)."""
    users, defaults = dask.config.collect(), dask.config.merge(*dask.config.defaults)
    for key, value in QUIET_SETTINGS.items():
        set_by_user = dask.config.get(key, default=None, config=users) is not None
        if not set_by_user and dask.config.get(key) == dask.config.get(key, config=defaults):
            dask.config.set({key: value})


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
    """Dask's preload hook at a worker's close: the process's exit skips collecting its imports' objects.

    A worker that loaded torch and a model spends ~2 s in the interpreter's teardown, ~0.3 s with its objects
    frozen (bench/exit_bench.py), inside the cluster's close that the command waits for (see flows.cli.entry).
    """
    gc.freeze()


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, run in each worker process of a :class:`BoundedLocalCluster` (module docstring)."""
    worker_log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, OneLineLostHeartbeat) for f in worker_log.filters):
        worker_log.addFilter(OneLineLostHeartbeat())


class BoundedLocalCluster(LocalCluster):
    """A ``LocalCluster`` whose ``close()`` gives up after ``close_timeout`` seconds and kills its worker processes.

    Its workers preload this module (:func:`dask_setup`, :func:`dask_teardown`), besides any ``preload`` given,
    and sample less in the background (:func:`quiet_background`).
    """

    def __init__(self, *args: Any, close_timeout: float = CLOSE_TIMEOUT_S, **kwargs: Any) -> None:
        self.close_timeout = close_timeout
        keep_glibc_malloc()
        quiet_background()
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
