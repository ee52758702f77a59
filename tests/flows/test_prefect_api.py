"""The Prefect API a command gets: work given to it overlaps its server's boot, and a failure stops that server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flows.prefect_api import _healthy, prefect_api
from tests.flows.test_stopping import _descendants, _still_running


def _servers(but: dict[int, str] | None = None) -> dict[int, str]:
    """This test process's `prefect server start` descendants (pid -> start time), except those in ``but``."""
    return {pid: started for pid, started in _descendants(os.getpid()).items()
            if b"server\0start" in Path(f"/proc/{pid}/cmdline").read_bytes() and pid not in (but or {})}


def test_meanwhile_runs_while_the_server_boots_and_its_failure_stops_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # not the session's server: one started here
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    earlier = _servers()  # the session's, when a test of this process started it
    seen: dict[str, object] = {}

    def meanwhile() -> None:
        seen["url"] = os.environ["PREFECT_API_URL"]  # already the one being started, for anything importing Prefect
        seen["answered"] = _healthy(str(seen["url"]))
        seen["servers"] = _servers(but=earlier)

    with prefect_api(tmp_path / "prefect", meanwhile=meanwhile) as url:
        assert url == seen["url"] and _healthy(url)
    assert seen["answered"] is False  # ran before the server was up, not after
    assert len(seen["servers"]) == 1 and _still_running(seen["servers"]) == []
    assert "PREFECT_API_URL" not in os.environ

    def fails() -> None:
        seen["servers"] = _servers(but=earlier)
        raise RuntimeError("the sample could not be fetched")

    with pytest.raises(RuntimeError, match="could not be fetched"), prefect_api(tmp_path / "prefect", meanwhile=fails):
        pytest.fail("the body must not run when meanwhile fails")
    assert len(seen["servers"]) == 1 and _still_running(seen["servers"]) == []
    assert "PREFECT_API_URL" not in os.environ
