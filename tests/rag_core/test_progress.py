"""StageProgress: periodic log lines off a terminal (a real timer thread, a short interval), a bar on one."""

from __future__ import annotations

import io
import threading
import time

import pytest

from rag_core.progress import StageProgress


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for a progress line"
        time.sleep(0.01)


def test_line_says_stage_done_total_rate_and_eta() -> None:
    clock = _Clock()
    progress = StageProgress("embed 2/4", total=200, unit="passage", tty=False, interval=0, clock=clock)
    clock.now += 10
    progress.update(50)
    assert progress.line() == "embed 2/4: 50/200 passages (25%), 5.0 passages/s, ETA 30 s, 10 s elapsed"
    clock.now += 290
    progress.update(1)
    assert progress.line().endswith("(26%), 5.9 s/passage, ETA 14.6 min, 5.0 min elapsed")  # 149 left at 51/300 s
    unknown = StageProgress("parse", total=None, unit="page", tty=False, interval=0, clock=clock)
    assert unknown.line() == "parse: 0 pages, 0.0 pages/s, total unknown, 0 s elapsed"


def test_off_a_terminal_lines_come_every_interval_even_while_a_step_blocks() -> None:
    lines: list[str] = []
    release = threading.Event()
    with StageProgress("index 1/2", total=10, unit="vector", log=lines.append, interval=0.05,
                       stream=io.StringIO()) as progress:  # StringIO is no terminal
        progress.update(4)
        # One long step (no update at all): the timer still reports, with the counts as they stand.
        _wait_for(lambda: len(lines) >= 3)
        release.set()
        progress.update(6)
    periodic, closing = lines[:-1], lines[-1]
    assert len(periodic) >= 3
    assert all(line.startswith("index 1/2: 4/10 vectors (40%), ") or line.startswith("index 1/2: 10/10")
               for line in periodic)
    assert "vectors/s, ETA " in periodic[0]
    assert closing.startswith("index 1/2: done, 10 vectors in ")
    count = len(lines)
    time.sleep(0.2)
    assert len(lines) == count  # the timer stopped with the stage


def test_a_short_stage_stays_silent_and_an_error_is_reported() -> None:
    lines: list[str] = []
    with StageProgress("gate", total=3, unit="part", log=lines.append, interval=60, tty=False) as progress:
        for _ in progress.track(range(3)):
            pass
    assert progress.done == 3 and lines == []  # shorter than the interval: its task logs the summary

    with pytest.raises(RuntimeError):
        with StageProgress("embed 1/1", total=5, unit="passage", log=lines.append, interval=0.02, tty=False):
            _wait_for(lambda: len(lines) >= 1)
            raise RuntimeError("encoder failed")
    assert lines[-1].startswith("embed 1/1: stopped by an error after 0 passages in ")


def test_on_a_terminal_a_bar_and_no_log_lines() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    lines: list[str] = []
    screen = Terminal()
    with StageProgress("parse 1/1", total=5, unit="page", log=lines.append, interval=0.01, stream=screen) as progress:
        for _ in progress.track(range(5)):
            time.sleep(0.02)
    assert lines == []
    assert "parse 1/1" in screen.getvalue() and "page" in screen.getvalue()
