"""Which stop signal (SIGTERM, SIGHUP, SIGINT) reached the command, whatever became of its handler's exception.

While a flow runs, Prefect puts its own SIGTERM handler in place of the
CLI's; the exception it raises lands wherever the main thread happens to be,
and the code there may turn it into an error of its own: pydantic-core wraps
it into a ``PydanticSerializationError`` when it lands inside a serializer
(seen stopping an index build: exit status 1 and a traceback instead of 143).
The interpreter writes the number of every signal that has a Python handler
to a wakeup file descriptor before any handler runs, so this record holds
whichever handler ran and whatever its exception became.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
_received: list[int] = []
_read_fd: int | None = None


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Record the signals that reach this process while the block runs (main thread only; elsewhere a no-op)."""
    global _read_fd
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: nothing can be recorded (nor can handlers be installed)
        os.close(read_fd)
        os.close(write_fd)
        yield
        return
    _received.clear()
    _read_fd = read_fd
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        _read_fd = None
        _received.clear()  # a stop belongs to the command that recorded it, not to the next code in this process
        os.close(read_fd)
        os.close(write_fd)


def received() -> int | None:
    """The first stop signal that has reached the process while recording, or None (also when not recording)."""
    if _read_fd is None:
        return None
    with contextlib.suppress(BlockingIOError):
        while data := os.read(_read_fd, 512):
            _received.extend(data)
    return next((s for s in _received if s in STOP_SIGNALS), None)


class StopRequested(Exception):
    """A stop signal reached the command but its handler's exception was lost on the way (module docstring)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def raise_if_stopped() -> None:
    """Raise :class:`StopRequested` if a stop signal has reached the process while recording.

    Called where a stop must not be outrun: between a stage's shard runs, and before anything is published, so a
    signal whose exception library code swallowed (a future's wait that returns it as an outcome) still stops the
    command before it publishes."""
    if (signum := received()) is not None:
        raise StopRequested(signum)
