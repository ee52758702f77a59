"""Progress of a long stage, seen whether or not anybody watches a terminal.

On a terminal a tqdm bar; otherwise (CI, a Dask worker, ``wikirag run > log``)
a log line at least every ``interval`` seconds, written by a small timer
thread, so a line comes even while one step (a batch of an encoder on a slow
CPU, one FAISS ``add``) takes longer than the interval::

    embed 2/4: 1,200/2,195 passages (55%), 41.3 passages/s, ETA 24 s

and, when such a line was written, one closing line as the stage ends (a stage
shorter than the interval stays silent: its task logs its own summary). ``log`` is any ``str -> None``
callable: the tasks pass their Prefect run logger, so the lines reach the
Prefect UI as well as stderr; the default is the ``wikirag`` logger.

    with StageProgress("embed 2/4", total=len(titles), unit="passage", log=logger.info) as progress:
        encoder.encode_passages(titles, texts, progress=progress.update)
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

LOG_INTERVAL_S = 30.0  # at most this long between two log lines when output is not a terminal

T = TypeVar("T")


def _rate(done: int, elapsed: float, unit: str) -> str:
    """Units per second, or seconds per unit when slower than one a second (training steps: "0.0 steps/s" says
    nothing)."""
    if done and elapsed > done:
        return f"{elapsed / done:,.1f} s/{unit}"
    return f"{done / elapsed if elapsed > 0 else 0.0:,.1f} {unit}s/s"


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal units up to GB: ``"812 B"``, ``"4.9 MB"``, ``"1,600.0 GB"``."""
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} GB"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class StageProgress:
    """Counts the work a stage has done; a bar on a TTY, else periodic log lines (see the module).

    ``total`` may be None (unknown: no percentage or ETA); ``tty`` None asks
    ``stream.isatty()``; ``clock`` is for tests that drive time themselves.
    """

    def __init__(self, stage: str, total: int | None, unit: str = "item", *,
                 log: Callable[[str], None] | None = None, interval: float = LOG_INTERVAL_S,
                 tty: bool | None = None, stream=None, clock: Callable[[], float] = time.monotonic) -> None:
        self.stage, self.total, self.unit, self.interval = stage, total, unit, interval
        self.done = 0
        self._log = log or logging.getLogger("wikirag").info
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._logged = 0  # periodic lines written so far
        stream = stream if stream is not None else sys.stderr
        self._tty = stream.isatty() if tty is None else tty
        self._bar = None
        self._ticker: threading.Thread | None = None
        if self._tty:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=stage, unit=unit, leave=False, file=stream, mininterval=1)
        elif interval > 0:
            self._ticker = threading.Thread(target=self._tick, name=f"progress {stage}", daemon=True)
            self._ticker.start()

    # -- counting --------------------------------------------------------------------------
    def update(self, n: int = 1) -> None:
        """``n`` more units done (thread-safe; usable as an encoder's ``progress`` callback)."""
        with self._lock:
            self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def track(self, items: Iterable[T]) -> Iterator[T]:
        """Yield ``items``, counting one unit for each."""
        for item in items:
            yield item
            self.update()

    # -- reporting -------------------------------------------------------------------------
    def line(self) -> str:
        """``stage: done/total unit (pct), rate unit/s, ETA t`` as of now."""
        with self._lock:
            done = self.done
        elapsed = self._clock() - self._started
        rate = done / elapsed if elapsed > 0 else 0.0
        units = f"{self.unit}s"
        if self.total:
            head = f"{done:,}/{self.total:,} {units} ({done / self.total:.0%})"
            eta = f"ETA {_duration((self.total - done) / rate)}" if rate > 0 else "ETA unknown"
        else:
            head, eta = f"{done:,} {units}", "total unknown"
        return f"{self.stage}: {head}, {_rate(done, elapsed, self.unit)}, {eta}, {_duration(elapsed)} elapsed"

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self._log(self.line())
            self._logged += 1

    def close(self, failed: bool = False) -> None:
        """Stop the bar or the timer; after periodic lines, log how the stage ended."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._bar is not None:
            self._bar.close()
        elif self._logged:
            elapsed = self._clock() - self._started
            how = "stopped by an error after" if failed else "done,"
            self._log(f"{self.stage}: {how} {self.done:,} {self.unit}s in {_duration(elapsed)} "
                      f"({_rate(self.done, elapsed, self.unit)})")

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close(failed=exc_type is not None)
