"""Guarantee: after a stop signal a command ends within its deadline, hung or not, and takes the processes it
started with it; a command that ends by itself in time is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from runtime.process_groups import die_with_parent
from tests.helpers.processes import REPO, proc_stat

# A command whose stop is lost: its SIGTERM handler swallows the signal (as library code sometimes does with the
# exception), and it waits for a child that never ends.
HUNG = textwrap.dedent("""
    import signal, subprocess, sys, time
    from runtime import stop_signals
    signal.signal(signal.SIGTERM, lambda *_: None)
    with stop_signals.recording(deadline_s={deadline}):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(child.pid, flush=True)
        {body}
    print("block ended", flush=True)
""")


def _start(deadline: float, body: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", HUNG.format(deadline=deadline, body=body)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_a_hung_command_ends_at_the_deadline_with_one_line_its_stacks_and_no_child_left() -> None:
    proc, child = _start(3, "child.wait()")
    started = proc_stat(child)
    assert started is not None
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - signalled
    assert proc.returncode == 143, err
    assert 3 <= took < 15, took
    assert err.startswith("wikirag: still running 3 s after SIGTERM; ending it and the processes it started now"), err
    assert "child.wait()" not in err and "in wait" in err  # the main thread's stack: where it hung
    assert "block ended" not in out
    time.sleep(0.5)
    assert proc_stat(child) is None or proc_stat(child)[1] != started[1], "the child outlived the command"


def test_a_command_that_ends_after_its_stop_in_time_is_left_alone() -> None:
    proc, child = _start(5, "time.sleep(1.5); child.kill(); child.wait()")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "block ended" in out and "still running" not in err
    time.sleep(6)  # past the deadline: nothing fires once the block has ended
    assert proc.poll() == 0


def test_without_a_stop_signal_nothing_fires() -> None:
    proc, child = _start(1, "time.sleep(3); child.kill(); child.wait()")
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, "still running" in err) == (0, False), err
    assert "block ended" in out


# A command that stops in time, then hangs in the interpreter's teardown: a non-daemon thread that never ends.
HANGS_AT_EXIT = textwrap.dedent("""
    import signal, sys, threading, time
    from runtime import stop_signals
    def stop(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    try:
        with stop_signals.recording(deadline_s=3):
            threading.Thread(target=time.sleep, args=(600,), name="never-ends").start()
            print("ready", flush=True)
            time.sleep(600)
    except SystemExit as exc:
        print("stopped", exc.code, flush=True)
    stop_signals.exit_by_the_deadline()  # the recording's 3 s, counted from the signal
    sys.exit(143)
""")


def test_a_teardown_that_hangs_after_a_stop_is_held_to_the_same_deadline() -> None:
    proc = subprocess.Popen([sys.executable, "-c", HANGS_AT_EXIT], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - signalled
    assert (proc.returncode, out) == (143, "stopped 143\n"), err
    assert 3 <= took < 15, took
    assert "still running 3 s after SIGTERM" in err and "in _shutdown" in err  # where it hung: the thread join
