"""Fixtures of the tasks tests: a real local Dask cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """A client of a real 2-worker LocalCluster (processes, one thread each, loopback only), per test module."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        yield client
