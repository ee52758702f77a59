"""Fixtures of the tasks tests: a real local Dask cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """A client of a real 2-worker LocalCluster (processes, one thread each, loopback only), per test module."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        yield client


def shard_keys(client: Client) -> set[str]:
    """The wikirag shard keys the workers hold now."""
    return {str(k) for keys in client.has_what().values() for k in keys if str(k).startswith("wikirag-shard-")}


def held_after_release(client: Client, settle_s: float = 10) -> set[str]:
    """The shard keys still held once the workers have had ``settle_s`` to drop released ones: a cancel returns
    before the scheduler and the workers act on it."""
    deadline = time.monotonic() + settle_s
    while (keys := shard_keys(client)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return keys
