"""The Dask task runner every flow runs on: an existing cluster by address, else a local one."""

from __future__ import annotations

from prefect_dask import DaskTaskRunner


def dask_runner(address: str | None, workers: int | None) -> DaskTaskRunner:
    """An existing cluster by address, else a local cluster of single-threaded worker processes.

    ``workers`` None lets Dask size the local cluster (one worker per core).
    """
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(
        cluster_class="runtime.local_cluster.BoundedLocalCluster",  # its close cannot hang a stopping command
        # Cleaning is pure Python: processes, not threads, to use every core.
        cluster_kwargs={
            "n_workers": workers,
            "threads_per_worker": 1,
            "processes": True,
            "host": "127.0.0.1",
            "dashboard_address": "127.0.0.1:0",  # loopback, any free port: runs may overlap
        },
    )
