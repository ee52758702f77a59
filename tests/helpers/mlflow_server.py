"""A real MLflow tracking server for the end-to-end tests: ``mlflow server`` on 127.0.0.1, its registry in SQLite,
its artifacts proxied to a local folder (clients reach them only through the server, as over a network)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.prefect_server import _free_port  # below the ephemeral range, as the servers' ports
from runtime.process_groups import stop_process_group


@contextmanager
def mlflow_server(folder: Path, timeout: float = 120) -> Iterator[str]:
    """Start the server with its state under ``folder``; yields its URL, stops it (its process group) at the end."""
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING")},
           "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
    log = (folder / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                             "--artifacts-destination", str(folder / "artifacts")],
                            env=env, cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not answer on {url}: {(folder / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        stop_process_group(proc.pid)
        log.close()
