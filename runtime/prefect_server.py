"""A Prefect API for the CLI: the configured one, or a local server for the command's lifetime.

Dask workers run in their own processes and reach the API through
``PREFECT_API_URL`` in their environment; without it each would start its own
temporary server on one SQLite file ("database is locked").  So when no API
is configured we start one real server on loopback and export its URL before
any worker is spawned.

A server in a fresh ``PREFECT_HOME`` starts from a copy of a migrated, empty
database kept in the user's cache, and the first one that boots on a fresh
database leaves that copy (:func:`runtime.process_tuning.seed_prefect_database`:
process tuning, off with ``WIKIRAG_PROCESS_TUNING=off``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from rag_core.errors import WikiragError
from runtime import process_tuning
from runtime.process_groups import die_with_parent, stop_process_group
from runtime.service_records import (asks_credentials, read_record, remove_record, still_running, workspace_of,
                                     write_record)
from runtime.service_specs import SPECS, Placement, ServicePorts

log = logging.getLogger("wikirag.prefect")


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for bind(0) and outgoing connections (Linux; its default elsewhere)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _free_port() -> int:
    """A loopback port that is free now, from below the kernel's ephemeral range when one is free there.

    The server binds it seconds later. A port from bind(0) lies in the ephemeral range, which the kernel also
    hands to every outgoing connection and bind(0) on the machine, so one of those could take it in between
    and the server would fail to start; below the range a port goes only to whoever asks for it by number.
    """
    low, _ = _ephemeral_range()
    band = range(max(1024, low - 12000), low)
    for port in random.SystemRandom().sample(band, min(64, len(band))):  # unseeded: concurrent commands differ
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded band: a port from the ephemeral range beats not starting
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _flush_to_api() -> None:
    """Send queued logs and events before the server goes, instead of retrying at exit."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogHandler

    with contextlib.suppress(Exception):
        APILogHandler().flush()
    with contextlib.suppress(Exception):
        EventsWorker.drain_all(timeout=5)


def _spawn(prefect_home: Path, port: int, ui: bool,
           persistent: bool = False) -> tuple[subprocess.Popen, str, Path, bool]:
    """Start `prefect server start` on loopback in its own session; returns at once (process, API URL, its log,
    whether its database came from the template: a home without one gets a copy when there is one)."""
    prefect_home.mkdir(parents=True, exist_ok=True)
    seeded = process_tuning.seed_prefect_database(prefect_home)
    # the command line of `wikirag services`' Prefect server (runtime/service_specs.py), on this port
    at = Placement.local(prefect_home, ServicePorts.model_construct(prefect_port=port))
    url = at.url("prefect")
    env = {**os.environ, "PREFECT_HOME": str(prefect_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "true" if ui else "false"}
    log_path = prefect_home / "server.log"
    with log_path.open("ab") as server_log:
        proc = subprocess.Popen(
            SPECS["prefect"].argv(at),
            env=env, stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=None if persistent else die_with_parent,
        )
    return proc, url, log_path, seeded


def _wait_until_healthy(proc: subprocess.Popen, url: str, log_path: Path, startup_timeout: float,
                        seeded: bool) -> None:
    """Wait for the server's health check; then keep its fresh database as the template, or drop a bad one."""
    deadline = time.monotonic() + startup_timeout
    try:
        while not _healthy(url):
            if proc.poll() is not None:
                raise WikiragError(f"the local Prefect server exited (code {proc.returncode}); see {log_path}")
            if time.monotonic() > deadline:
                raise WikiragError(f"the local Prefect server did not answer within {startup_timeout:.0f} s; "
                                   f"see {log_path}")
            time.sleep(0.3)
    except WikiragError:
        if seeded:  # the next start migrates afresh rather than trusting the template again
            process_tuning.drop_prefect_template()
        raise
    if not seeded:
        process_tuning.keep_prefect_template(log_path.parent)


def _launch(prefect_home: Path, port: int, ui: bool, startup_timeout: float,
            persistent: bool = False) -> tuple[subprocess.Popen, str]:
    """Start `prefect server start` on loopback in its own session; wait until it answers."""
    proc, url, log_path, seeded = _spawn(prefect_home, port, ui, persistent)
    try:
        _wait_until_healthy(proc, url, log_path, startup_timeout, seeded)
    except BaseException:
        stop_process_group(proc.pid)
        raise
    return proc, url


def _workspace_record(prefect_home: Path) -> dict | None:
    """The record of the workspace's Prefect server (``wikirag server start`` or ``wikirag services up``) while
    the recorded process runs it and it answers."""
    record = read_record(workspace_of(prefect_home), "prefect")
    if record is None or not still_running(record) or not _healthy(record["url"]):
        return None
    return record


def workspace_server(prefect_home: Path) -> str | None:
    """URL of the workspace's persistent server when it is up: started by ``wikirag server start`` or by
    ``wikirag services up`` (one record, runtime/service_records.py)."""
    record = _workspace_record(prefect_home)
    return record["url"] if record else None


def start_workspace_server(prefect_home: Path, port: int = ServicePorts.model_fields["prefect_port"].default,
                           startup_timeout: float = 90.0) -> str:
    """Start a persistent server (with its UI) that later commands of this workspace reuse; the one running
    already, whoever started it, when there is one."""
    running = workspace_server(prefect_home)
    if running:
        return running
    record = read_record(workspace_of(prefect_home), "prefect")
    if record and still_running(record):  # booting, or stuck: a second server would share its database
        raise WikiragError(f"the workspace's Prefect server (pid {record['pid']}) runs but does not answer at "
                           f"{record['url']}; see {record['log']}, or stop it with `wikirag server stop`")
    port = port or _free_port()
    proc, url = _launch(prefect_home, port, ui=True, startup_timeout=startup_timeout, persistent=True)
    write_record(workspace_of(prefect_home), {
        "name": "prefect", "pid": proc.pid, "argv": proc.args, "url": url, "ports": [port],
        "log": str(prefect_home / "server.log"), "started": time.time(), "asks_credentials": False})
    return url


def stop_workspace_server(prefect_home: Path) -> bool:
    """Stop the workspace's persistent server, whoever started it, by its recorded pid once that pid is seen to
    still run the recorded command; False when none runs."""
    home = workspace_of(prefect_home)
    record = read_record(home, "prefect")
    if record is None:
        return False
    remove_record(home, "prefect")
    if not still_running(record):
        return False  # gone already; its pid may belong to another process by now
    stop_process_group(record["pid"])
    return True


@contextlib.contextmanager
def prefect_api(prefect_home: Path, startup_timeout: float = 90.0,
                meanwhile: Callable[[], None] | None = None) -> Iterator[str]:
    """Yield an API URL: the configured one, the workspace's server, or one started for this command.

    ``meanwhile`` runs once before the yield, while a server started here boots in its own process (a fresh
    one takes 10-25 s on 2 cores, about half that from the database template), so that work which needs no API overlaps
    the wait.
    """
    configured = os.environ.get("PREFECT_API_URL")
    if not configured and (record := _workspace_record(prefect_home)):
        if asks_credentials(record) and not os.environ.get("PREFECT_API_AUTH_STRING"):
            raise WikiragError(f"the workspace's Prefect server at {record['url']} (`wikirag services up`) asks "
                               "for credentials: export PREFECT_API_AUTH_STRING as given to `wikirag services up` "
                               "(and eval \"$(wikirag services env)\")")
        configured = record["url"]
    if configured:
        os.environ["PREFECT_API_URL"] = configured
        if meanwhile is not None:
            meanwhile()
        yield configured
        return
    proc, url, log_path, seeded = _spawn(prefect_home, _free_port(), ui=False)
    # Set before ``meanwhile`` runs: whatever imports Prefect there reads its settings from this environment.
    os.environ["PREFECT_API_URL"] = url
    os.environ["PREFECT_HOME"] = str(prefect_home)
    answered = False
    try:
        if meanwhile is not None:
            meanwhile()
        _wait_until_healthy(proc, url, log_path, startup_timeout, seeded)
        answered = True
        log.info("local Prefect server at %s (PREFECT_HOME=%s)", url, prefect_home)
        yield url
    finally:
        if answered:
            _flush_to_api()
        if os.environ.get("PREFECT_API_URL") == url:
            del os.environ["PREFECT_API_URL"]
        stop_process_group(proc.pid)  # only what we started: the server's own process group
        proc.wait()
