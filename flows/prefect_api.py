"""A Prefect API for the CLI: the configured one, or a local server for the command's lifetime.

Dask workers run in their own processes and reach the API through
``PREFECT_API_URL`` in their environment; without it each would start its own
temporary server on one SQLite file ("database is locked").  So when no API
is configured we start one real server on loopback and export its URL before
any worker is spawned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from rag_core.errors import WikiragError

log = logging.getLogger("wikirag.prefect")


def _free_port() -> int:
    with socket.socket() as s:
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


@contextlib.contextmanager
def prefect_api(prefect_home: Path, startup_timeout: float = 90.0) -> Iterator[str]:
    """Yield an API URL; start (and afterwards stop) a local server when none is configured."""
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        yield configured
        return
    prefect_home.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(prefect_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    log_path = prefect_home / "server.log"
    with log_path.open("ab") as server_log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + startup_timeout
        while not _healthy(url):
            if proc.poll() is not None:
                raise WikiragError(f"the local Prefect server exited (code {proc.returncode}); see {log_path}")
            if time.monotonic() > deadline:
                raise WikiragError(f"the local Prefect server did not answer within {startup_timeout:.0f} s; see {log_path}")
            time.sleep(0.3)
        log.info("local Prefect server at %s (PREFECT_HOME=%s)", url, prefect_home)
        os.environ["PREFECT_API_URL"] = url
        os.environ["PREFECT_HOME"] = str(prefect_home)
        yield url
    finally:
        _flush_to_api()
        os.environ.pop("PREFECT_API_URL", None) if os.environ.get("PREFECT_API_URL") == url else None
        # Stop only what we started: the server's own process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
