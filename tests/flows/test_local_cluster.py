"""The local Dask cluster's close is bounded: frozen workers cannot keep a stopping command waiting."""

from __future__ import annotations

import os
import signal
import time

from flows.local_cluster import DASK_TRIM_DEFAULT, BoundedLocalCluster, without_dask_trim
from tests.flows.test_stopping import _descendants, _still_running


def test_close_gives_up_on_frozen_workers_and_kills_them() -> None:
    cluster = BoundedLocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, close_timeout=1.0)
    pids = cluster.worker_pids()
    assert len(pids) == 2 and set(pids) <= set(_descendants(os.getpid()))
    seen = {pid: started for pid, started in _descendants(os.getpid()).items() if pid in pids}
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # alive, holding their connections, answering nothing
    started = time.monotonic()
    cluster.close()
    took = time.monotonic() - started
    time.sleep(0.5)
    assert took < 3, took  # the nanny alone kills a frozen worker after 4 s; distributed's close waits without limit
    assert _still_running(seen) == []



def _worker_environment() -> tuple[int, str | None, str | None]:
    import os  # the worker's: this function travels by value (cloudpickle), its imports run there

    return os.getpid(), os.environ.get("MALLOC_TRIM_THRESHOLD_"), os.environ.get("OMP_NUM_THREADS")


def test_workers_keep_glibcs_adaptive_malloc_and_dasks_other_defaults(monkeypatch) -> None:
    from distributed import Client

    # As an earlier plain Dask cluster of this process leaves it (its nanny exports its variables and keeps them)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", DASK_TRIM_DEFAULT)

    with BoundedLocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                             dashboard_address=None) as cluster, Client(cluster) as client:
        ((pid, trim, omp),) = client.run(_worker_environment).values()
        assert pid in cluster.worker_pids() and pid != os.getpid()
    # Dask's own default (65536) pins glibc's mmap threshold: every encoder batch re-faults its buffers
    assert (trim, omp) == (None, "1")
    assert "MALLOC_TRIM_THRESHOLD_" not in os.environ  # nor what this process starts later (the training job)
    # a value the user chose is theirs
    assert without_dask_trim({"MALLOC_TRIM_THRESHOLD_": "131072", "A": "1"}) == {"MALLOC_TRIM_THRESHOLD_": "131072",
                                                                              "A": "1"}
