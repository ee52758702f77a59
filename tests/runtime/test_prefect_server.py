"""The Prefect API a command gets: work given to it overlaps its server's boot, a failure stops that server, and a
fresh home's server starts from a migrated database template."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rag_core.errors import WikiragError
from runtime import prefect_server
from runtime.prefect_server import _healthy, prefect_api
from runtime.process_tuning import prefect_template_path
from tests.helpers.processes import REPO, descendants, still_running

# What the commands' ``meanwhile`` does, in a fresh process (where nothing has imported Prefect yet).
FLOW_IMPORTS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from cli.wikirag import import_flow
    from runtime.prefect_server import _healthy, prefect_api

    seen = {"prefect_before": "prefect" in sys.modules}
    def meanwhile():
        import_flow("flows.ingest")()
        from prefect.settings import get_current_settings
        seen["prefect_url"] = str(get_current_settings().api.url)
        seen["answered"] = _healthy(seen["prefect_url"])
        for module in ("flows.index_rebuild", "flows.evaluate", "flows.finetune"):
            import_flow(module)()
        seen["imported"] = [m for m in ("flows.index_rebuild", "flows.evaluate", "flows.finetune") if m in sys.modules]
    with prefect_api(Path(sys.argv[1]), meanwhile=meanwhile) as url:
        seen["url"] = url
    print(json.dumps(seen))
""")


def _servers(but: dict[int, str] | None = None) -> dict[int, str]:
    """This test process's `prefect server start` descendants (pid -> start time), except those in ``but``."""
    return {pid: started for pid, started in descendants(os.getpid()).items()
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
    assert len(seen["servers"]) == 1 and still_running(seen["servers"]) == []
    assert "PREFECT_API_URL" not in os.environ

    def fails() -> None:
        seen["servers"] = _servers(but=earlier)
        raise RuntimeError("the sample could not be fetched")

    with pytest.raises(RuntimeError, match="could not be fetched"), prefect_api(tmp_path / "prefect", meanwhile=fails):
        pytest.fail("the body must not run when meanwhile fails")
    assert len(seen["servers"]) == 1 and still_running(seen["servers"]) == []
    assert "PREFECT_API_URL" not in os.environ


def test_a_flow_imported_while_the_server_boots_talks_to_that_server(tmp_path: Path) -> None:
    """The commands import their flow's module (Prefect, Dask: seconds) as ``meanwhile``: Prefect, first imported
    there, must read the URL of the server still booting, not start a temporary server of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME")}
    # An empty cache: no database template, so the server migrates (~10 s) and is surely still booting while
    # the imports run (from a template it can answer before they end, and "still booting" is not checked).
    env |= {"PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", FLOW_IMPORTS, str(tmp_path / "prefect")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["prefect_before"] is False  # the CLI leaves Prefect's import to the flow modules
    assert seen["prefect_url"] == seen["url"] and seen["answered"] is False
    assert seen["imported"] == ["flows.index_rebuild", "flows.evaluate", "flows.finetune"]


# A flow run against the server at PREFECT_API_URL, in a fresh process.
TINY_FLOW = textwrap.dedent("""
    from prefect import flow

    @flow(name="template-check")
    def check() -> int:
        return 42

    print(check())
""")


def _block_type_ids(database: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(database)) as db:
        return {row[0] for row in db.execute("SELECT id FROM block_type")}


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers started here (not the session's), with a cache of their own for the database template."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.mark.usefixtures("own_cache")
def test_a_fresh_home_boots_from_the_database_template_that_the_first_server_left(tmp_path: Path) -> None:
    template = prefect_template_path()
    assert template.parent == tmp_path / "cache" / "wikirag" and not template.exists()

    with prefect_api(tmp_path / "first"):
        pass
    with contextlib.closing(sqlite3.connect(template)) as db:  # migrated, with Prefect's block types, no run
        assert db.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        assert db.execute("SELECT count(*) FROM flow_run").fetchone()[0] == 0
    registered = _block_type_ids(template)
    assert registered

    second = tmp_path / "second"
    with prefect_api(second) as url:
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_HOME"} | {"PREFECT_API_URL": url,
                                                                                "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, "-c", TINY_FLOW], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "42", proc.stderr[-2000:]
    # The second server started from a copy (a migration of its own would have registered new ids) and ran on it.
    assert _block_type_ids(second / "prefect.db") == registered
    with contextlib.closing(sqlite3.connect(second / "prefect.db")) as db:
        assert db.execute("SELECT count(*) FROM flow_run WHERE state_type = 'COMPLETED'").fetchone()[0] == 1
    with contextlib.closing(sqlite3.connect(template)) as db:  # the template itself is left as it was
        assert db.execute("SELECT count(*) FROM flow_run").fetchone()[0] == 0


@pytest.mark.usefixtures("own_cache")
def test_a_template_that_a_server_cannot_start_from_is_dropped_and_the_next_start_migrates_afresh(
        tmp_path: Path) -> None:
    template = prefect_template_path()
    template.parent.mkdir(parents=True)
    template.write_bytes(b"not a database " * 100)  # e.g. a disk that filled up while it was written elsewhere

    with pytest.raises(WikiragError, match="the local Prefect server exited"), prefect_api(tmp_path / "first"):
        pytest.fail("no server should answer on a broken database")
    assert not template.exists()
    with prefect_api(tmp_path / "second") as url:
        assert _healthy(url)
    assert _block_type_ids(template)  # a good template again, from the fresh migration


def test_server_ports_come_from_below_the_ephemeral_range_and_from_it_only_when_that_is_full(
        monkeypatch: pytest.MonkeyPatch) -> None:
    low, _ = prefect_server._ephemeral_range()
    ports = [prefect_server._free_port() for _ in range(20)]
    # Below the range, no outgoing connection or bind(0) on the machine can take the port before the server binds it.
    assert all(1024 <= port < low for port in ports) and len(set(ports)) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # free indeed
    real = prefect_server._ephemeral_range()
    monkeypatch.setattr(prefect_server, "_ephemeral_range", lambda: (1024, 60999))  # nothing below it
    fallback = prefect_server._free_port()
    assert real[0] <= fallback <= real[1]  # the kernel's bind(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", fallback))


_AUTH = "wikirag:prefect-secret-5a0c71"
# A command's Prefect API, where the workspace's server is the one `wikirag services up` started.
COMMAND_API = textwrap.dedent("""
    import sys
    from pathlib import Path
    from rag_core.errors import WikiragError
    from runtime.prefect_server import prefect_api
    try:
        with prefect_api(Path(sys.argv[1])) as url:
            print(url)
    except WikiragError as exc:
        print("refused:", exc)
""")


def _gone(pid: int, timeout: float = 30) -> bool:
    """The pid no longer runs (the server was orphaned when its starting command exited: init reaps it)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not Path(f"/proc/{pid}").exists()


def test_wikirag_server_and_services_keep_one_record_of_the_workspaces_prefect_server(tmp_path: Path) -> None:
    """One starts it, the other sees it and stops it, by the recorded pid; `services up` adopts no server that asks
    for no credentials, and a command without the services' password gets one line instead of a 401."""
    from runtime.service_records import read_record

    home = tmp_path / "home"
    services_port = prefect_server._free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "WIKIRAG_"))}
    env |= {"WIKIRAG_HOME": str(home), "WIKIRAG_PREFECT_PORT": str(services_port), "PYTHONPATH": str(REPO),
            "XDG_CACHE_HOME": str(tmp_path / "cache")}
    locked = {**env, "PREFECT_API_AUTH_STRING": _AUTH}

    def wikirag(*args: str, environ: dict[str, str] = env) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli.wikirag", *args], env=environ, cwd=REPO,
                              capture_output=True, text=True, timeout=240)

    def prefect_row() -> list[str]:
        rows = [r.split("\t") for r in wikirag("services", "status").stdout.splitlines()]
        return next(r for r in rows if r[0] == "prefect")

    # `wikirag server start` first: `services status` sees it, `services up` refuses it, `services down` stops it
    started = wikirag("server", "start", "--port", "0")
    assert started.returncode == 0, started.stderr[-2000:]
    url, record = started.stdout.strip(), read_record(home, "prefect")
    assert record["url"] == url and not record["asks_credentials"]
    try:
        assert prefect_row()[:4] == ["prefect", "up", str(record["pid"]), url]
        refused = wikirag("services", "up", "prefect", environ=locked)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert "wikirag server stop" in refused.stderr.strip().splitlines()[-1]
        assert read_record(home, "prefect") == record  # nothing started beside it on its database
        with socket.socket() as s:
            s.bind(("127.0.0.1", services_port))
        stopped = wikirag("services", "down")
        assert stopped.returncode == 0 and f"prefect: stopped (pid {record['pid']})" in stopped.stderr
        assert _gone(record["pid"])
    finally:
        wikirag("server", "stop")
    assert wikirag("server", "status").stdout.strip() == "not running"
    assert read_record(home, "prefect") is None

    # `wikirag services up prefect` first: `server status` and `server start` see it, `server stop` stops it
    up = wikirag("services", "up", "prefect", environ=locked)
    assert up.returncode == 0, up.stderr[-2000:]
    record = read_record(home, "prefect")
    assert record["asks_credentials"] and record["url"] == f"http://127.0.0.1:{services_port}/api"
    try:
        assert prefect_row()[1] == "up"
        assert wikirag("server", "status").stdout.strip() == record["url"]
        again = wikirag("server", "start")
        assert again.returncode == 0 and again.stdout.strip() == record["url"], again.stderr[-2000:]
        assert read_record(home, "prefect") == record
        # a command reaches it with the password, and is told which variable it lacks without it
        for environ, expected in ((locked, record["url"]), (env, "refused: ")):
            command = subprocess.run([sys.executable, "-c", COMMAND_API, str(home / "prefect")], env=environ,
                                     capture_output=True, text=True, timeout=120)
            assert command.stdout.strip().startswith(expected), command.stderr[-2000:]
        assert "PREFECT_API_AUTH_STRING" in command.stdout and _AUTH not in command.stdout
        stop = wikirag("server", "stop")
        assert stop.returncode == 0 and "stopped" in stop.stderr, stop.stderr[-2000:]
        assert _gone(record["pid"])
    finally:
        wikirag("services", "down")
    assert prefect_row()[1] == "not started"


def test_a_recorded_server_that_runs_but_does_not_answer_is_not_doubled_and_stop_ends_it(tmp_path: Path) -> None:
    """A second server would share the first one's database: `server start` says so in one line instead."""
    from runtime.service_records import read_record, write_record

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "WIKIRAG_"))}
    env |= {"WIKIRAG_HOME": str(home), "PYTHONPATH": str(REPO)}
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        with socket.socket() as s:  # a port that nothing answers on
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}/api"
        record = {"name": "prefect", "pid": stuck.pid, "argv": stuck.args, "url": url, "ports": [0],
                  "log": str(home / "prefect" / "server.log"), "started": time.time(), "asks_credentials": False}
        write_record(home, record)

        def wikirag(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "cli.wikirag", *args], env=env, cwd=REPO,
                                  capture_output=True, text=True, timeout=120)

        start = wikirag("server", "start", "--port", "0")
        assert start.returncode == 2 and "Traceback" not in start.stderr, start.stderr[-2000:]
        assert f"(pid {stuck.pid}) runs but does not answer" in start.stderr.strip().splitlines()[-1]
        assert read_record(home, "prefect") == record and stuck.poll() is None
        assert wikirag("server", "status").stdout.strip() == "not running"
        stop = wikirag("server", "stop")
        assert stop.returncode == 0 and stuck.wait(timeout=30) is not None
        assert read_record(home, "prefect") is None
    finally:
        stuck.kill()
        stuck.wait()
