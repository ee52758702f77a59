"""Stopping the process groups wikirag starts: several at once, gracefully where they let us, never left behind."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from runtime.process_groups import stop_process_groups
from runtime.service_credentials import ServicesError
from runtime.service_records import record_path, write_record
from runtime.service_specs import spec
from runtime.services import ORDER, down, stop_waves


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
    deadline = time.monotonic() + 10
    while _alive(pgid):
        assert time.monotonic() < deadline, f"process group {pgid} still has members"
        time.sleep(0.05)


def _ready(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)


def _waits_for(me: str, other: str, folder: Path) -> str:
    """A group whose SIGTERM handler finishes only once ``other``'s has started: it ends gracefully only when
    both are signalled together, not one after the other."""
    return (f"trap 'touch {folder}/{me}.term; while [ ! -e {folder}/{other}.term ]; do sleep 0.05; done; "
            f"echo done > {folder}/{me}.done; kill $child; exit 0' TERM; sleep 60 & child=$!; "
            f"touch {folder}/{me}.up; wait")


def test_groups_stop_together_gracefully_and_a_group_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    first = _group(_waits_for("a", "b", tmp_path))
    second = _group(_waits_for("b", "a", tmp_path))
    # ignores SIGTERM, it and its child: only SIGKILL ends it
    stubborn = _group(f"trap '' TERM; (trap '' TERM; sleep 60) & touch {tmp_path}/c.up; wait")
    gone = _group("exit 0")
    for name in "abc":
        _ready(tmp_path / f"{name}.up")
    gone.wait()

    stop_process_groups([first.pid, second.pid, stubborn.pid, gone.pid], timeout=5)

    # both handlers ran to the end: each saw the other's SIGTERM, so they had it at once (one after the other,
    # the first would have waited out its timeout and been killed)
    assert (tmp_path / "a.done").read_text() == (tmp_path / "b.done").read_text() == "done\n"
    assert stubborn.wait(timeout=5) == -9  # killed after its timeout (and reaped here: it is our child)
    for proc in (first, second, stubborn):
        _gone(proc.pid)  # the children too, the one that ignored SIGTERM included


def test_services_stop_after_every_service_that_needs_or_uses_them() -> None:
    waves = stop_waves(ORDER)
    assert sorted(n for wave in waves for n in wave) == sorted(ORDER)  # each once
    wave_of = {name: i for i, wave in enumerate(waves) for name in wave}
    for name in ORDER:
        for other in (n for n in (spec(name).needs, *spec(name).uses) if n is not None):
            assert wave_of[name] < wave_of[other], (name, other, waves)
    assert wave_of["worker"] < wave_of["mlflow"]  # a flow run stopping still writes its MLflow run's end
    assert len(waves) < len(ORDER)  # some stop side by side


def test_down_stops_what_runs_and_reports_an_unreadable_record_after(tmp_path: Path) -> None:
    home = tmp_path / "home"
    procs = {}
    for name in ("worker", "s3"):
        procs[name] = subprocess.Popen(["sleep", "300"], start_new_session=True)
        write_record(home, {"name": name, "pid": procs[name].pid, "argv": ["sleep", "300"]})
    record_path(home, "mlflow").write_text("{not json")
    write_record(home, {"name": "prefect", "pid": 2 ** 22 - 1, "argv": ["no-such-program"]})
    said: list[str] = []

    with pytest.raises(ServicesError, match="mlflow.json: not a service record"):
        down(home, said.append)

    assert said == [f"worker: stopped (pid {procs['worker'].pid})", "prefect: was not running",
                    f"s3: stopped (pid {procs['s3'].pid})"]
    for proc in procs.values():
        _gone(proc.pid)
    assert sorted(p.name for p in (home / "services").iterdir()) == ["mlflow.json"]  # left for the user to check
    assert record_path(home, "mlflow").read_text() == "{not json"
