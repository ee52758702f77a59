"""Stopping the process groups wikirag starts: several at once, gracefully where they let us, never left behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from runtime.process_groups import stop_process_groups
from runtime.service_specs import spec
from runtime.services import ORDER, stop_waves


def _group(script: str) -> subprocess.Popen:
    """A shell leading its own session (as wikirag's servers do), with a child of its own."""
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone(pgid: int) -> None:
    """The group empties once its killed members are reaped (by us, or by init for orphans)."""
    import time

    deadline = time.monotonic() + 10
    while _alive(pgid):
        assert time.monotonic() < deadline, f"process group {pgid} still has members"
        time.sleep(0.05)


def _ready(path: Path) -> None:
    import time

    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)


def test_groups_stop_together_gracefully_and_a_group_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    graceful = tmp_path / "graceful"
    # shuts down on SIGTERM after a second of "flushing", as a server would, and says so
    polite = _group(f"trap 'sleep 1; echo done > {graceful}; kill $child; exit 0' TERM; sleep 60 & child=$!; "
                    f"touch {tmp_path}/a; wait")
    # ignores SIGTERM, it and its child: only SIGKILL ends it
    stubborn = _group(f"trap '' TERM; (trap '' TERM; sleep 60) & touch {tmp_path}/b; wait")
    gone = _group("exit 0")
    _ready(tmp_path / "a")
    _ready(tmp_path / "b")
    gone.wait()

    stop_process_groups([polite.pid, stubborn.pid, gone.pid], timeout=3)

    assert graceful.read_text() == "done\n"  # its SIGTERM handler ran to the end, within the common timeout
    assert polite.wait(timeout=5) == 0
    assert stubborn.wait(timeout=5) == -9  # killed, after its timeout
    _gone(polite.pid)
    _gone(stubborn.pid)  # the child that ignored SIGTERM too


def test_services_stop_after_every_service_that_needs_them() -> None:
    waves = stop_waves(ORDER)
    assert sorted(n for wave in waves for n in wave) == sorted(ORDER)  # each once
    wave_of = {name: i for i, wave in enumerate(waves) for name in wave}
    for name in ORDER:
        if (needed := spec(name).needs) is not None:
            assert wave_of[name] < wave_of[needed], (name, needed, waves)
    assert len(waves) < len(ORDER)  # some stop side by side
