"""Which stop signal (SIGTERM, SIGHUP, SIGINT) reached the command, whatever became of its handler's exception.

While a flow runs, Prefect puts its own SIGTERM handler in place of the
CLI's; the exception it raises lands wherever the main thread happens to be,
and the code there may turn it into an error of its own: pydantic-core wraps
it into a ``PydanticSerializationError`` when it lands inside a serializer
(seen stopping an index build: exit status 1 and a traceback instead of 143).
The interpreter writes the number of every signal that has a Python handler
to a wakeup file descriptor before any handler runs, so this record holds
whichever handler ran and whatever its exception became.

The same record bounds a stop. A thread reads the descriptor; once a stop
signal has come, the command gets ``STOP_DEADLINE_S`` to end through its
own cleanup (its Dask cluster's close is bounded below that). A command
still running then, hung wherever the exception landed (a lock, a thread
join at the interpreter's exit), says so in one line, writes its threads'
stacks for a bug report, kills the processes it started and exits with
128 + the signal. Nothing is published after a stop (:func:`raise_if_stopped`),
and the store's writes are atomic, so the deadline loses no published data.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
# Under the 30 s a scheduler or a user waits, above the local Dask cluster's bounded close (15 s).
STOP_DEADLINE_S = 25.0
_received: list[int] = []
_read_fd: int | None = None
_reading = threading.Lock()  # the deadline's thread and received() both drain the descriptor
_stop: tuple[int, float, float] | None = None  # the last recording's stop signal, when it came, its deadline


@contextlib.contextmanager
def recording(deadline_s: float = STOP_DEADLINE_S) -> Iterator[None]:
    """Record the signals that reach this process while the block runs, and end the process ``deadline_s``
    after a stop signal if the block has not ended by then (module docstring). Main thread only; elsewhere a
    no-op."""
    global _read_fd, _stop
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
    _stop = None
    ended = threading.Event()
    watch = threading.Thread(target=_deadline, args=(read_fd, ended, deadline_s), name="wikirag-stop-deadline",
                             daemon=True)
    watch.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        ended.set()
        watch.join()
        _read_fd = None
        _received.clear()  # a stop belongs to the command that recorded it, not to the next code in this process
        os.close(read_fd)
        os.close(write_fd)


def _drain(read_fd: int) -> int | None:
    with _reading, contextlib.suppress(BlockingIOError):
        while data := os.read(read_fd, 512):
            _received.extend(data)
    return next((s for s in _received if s in STOP_SIGNALS), None)


def received() -> int | None:
    """The first stop signal that has reached the process while recording, or None (also when not recording)."""
    return None if _read_fd is None else _drain(_read_fd)


def _deadline(read_fd: int, ended: threading.Event, deadline_s: float) -> None:
    """The recording's thread: wait for a stop signal, then for the block's end at most ``deadline_s``."""
    global _stop
    while (signum := _drain(read_fd)) is None:
        if ended.is_set():
            return
        select.select([read_fd], [], [], 0.2)
    _stop = (signum, time.monotonic(), deadline_s)
    if not ended.wait(deadline_s):
        _end_now(signum, deadline_s)


def exit_by_the_deadline() -> None:
    """After a recording that a stop signal ended: hold what is left of the process (the interpreter's teardown:
    atexit hooks, joins of non-daemon threads) to the recording's deadline, counted from the signal. Called by the
    program on its way out, never by code that goes on running in this process."""
    if (stop := _stop) is None:
        return
    signum, at, deadline_s = stop

    def end_at_the_deadline() -> None:
        time.sleep(max(1.0, at + deadline_s - time.monotonic()))
        _end_now(signum, deadline_s)

    threading.Thread(target=end_at_the_deadline, name="wikirag-exit-deadline", daemon=True).start()


def _end_now(signum: int, deadline_s: float) -> None:
    print(f"wikirag: still running {deadline_s:.0f} s after {signal.Signals(signum).name}; ending it and the "
          "processes it started now (its threads' stacks follow, for a bug report)", file=sys.stderr, flush=True)
    with contextlib.suppress(Exception):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    _kill_descendants()
    os._exit(128 + signum)


def _kill_descendants() -> None:
    """SIGKILL every process below this one (Dask workers, a server it started in a session of its own)."""
    import psutil  # Dask's dependency; imported here, where the stop has already come

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=2)


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
