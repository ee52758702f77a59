"""Bounded waits on Dask futures: a stuck or lost worker ends a stage with one line instead of hanging it."""

from __future__ import annotations

from distributed import Future, wait

from rag_core.errors import WikiragError


class DaskWaitTimeoutError(WikiragError):
    """Dask tasks of one stage were not done within that stage's limit."""


def wait_within(futures: list[Future], stage: str, timeout_s: float, *, raise_with: str,
                return_when: str = "ALL_COMPLETED") -> None:
    """``distributed.wait`` (with the current client) bounded by ``timeout_s``; past it, one line naming ``stage``
    and, in ``raise_with``, the setting that raises the limit."""
    try:
        wait(futures, timeout=timeout_s, return_when=return_when)
    except TimeoutError as exc:  # distributed's TimeoutError is the built-in one
        pending = sum(not f.done() for f in futures)
        raise DaskWaitTimeoutError(
            f"{stage}: {pending} of {len(futures)} Dask tasks not done after {timeout_s:g} s; check that the "
            f"cluster's workers are alive and not overloaded (its dashboard), or raise {raise_with}"
        ) from exc
