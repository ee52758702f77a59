"""Waiting on a stage's shard runs: every one of them, unless the store is down.

A shard that fails on its own (bad input, a damaged record) leaves the others
to finish, so that a rerun reuses them. A shard that fails because the store
stayed unreachable through its retries stops the stage at once: every shard
still queued would meet the same dead store, each after retries of its own
(seen: eight shards on two workers failing one after another, 76 s in all,
instead of one retry window).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect.futures import PrefectFuture, PrefectWrappedFuture, as_completed

from rag_core.storage import StoreUnreachableError
from runtime.stop_signals import StopRequested, raise_if_stopped


def wait_for_shards(runs: Sequence[PrefectFuture[Any]]) -> None:
    """Wait until every run is finished; the first one that found the store unreachable cancels the rest and raises,
    as does a stop signal (:func:`runtime.stop_signals.raise_if_stopped`)."""
    for run in as_completed(list(runs)):
        outcome = run.result(raise_on_failure=False)
        try:
            raise_if_stopped()  # a stop whose exception the wait turned into this outcome still stops the stage
        except StopRequested:
            _cancel_others(runs, run)
            raise
        if isinstance(outcome, StoreUnreachableError):
            _cancel_others(runs, run)
            raise outcome


def _cancel_others(runs: Sequence[PrefectFuture[Any]], done: PrefectFuture[Any]) -> None:
    for other in runs:
        if isinstance(other, PrefectWrappedFuture) and other is not done:
            other.wrapped_future.cancel()  # queued ones never start; a running one ends with its cluster
