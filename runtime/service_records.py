"""What runs in a workspace: one JSON record per engine started, under ``<WIKIRAG_HOME>/services/NAME.json``.

``wikirag services`` writes one for each engine it starts, and ``wikirag server start`` writes the same record
for the Prefect server (``prefect.json``): whichever started it, the other one sees it (``services status``,
``server status``) and stops it (``services down``, ``server stop``). A record says what was started, not
whether it still runs; :func:`still_running` checks that the recorded pid still runs the recorded command line,
so a pid the kernel gave to another process is never signalled. No record holds a secret.

| field | meaning |
|---|---|
| ``name`` | the service (runtime/service_specs.py) |
| ``pid`` | the leader of its process group (what is stopped) |
| ``argv`` | its command line, as started |
| ``url``, ``ports`` | where clients reach it; the first port is the one its health check probes |
| ``log`` | its output |
| ``started`` | when (seconds since the epoch) |
| ``asks_credentials`` | whether it refuses requests without credentials (absent: true, as every service's) |
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from runtime.service_credentials import ServicesError


def record_path(home: Path, name: str) -> Path:
    return home / "services" / f"{name}.json"


def workspace_of(prefect_home: Path) -> Path:
    """The workspace whose Prefect home is ``prefect_home``: every Prefect server of a workspace, whoever starts
    it, keeps its state in ``<WIKIRAG_HOME>/prefect`` (runtime.settings.Settings.prefect_home)."""
    return prefect_home.parent


def read_record(home: Path, name: str) -> dict | None:
    path = record_path(home, name)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise ServicesError(f"{path}: not a service record (invalid JSON); stop the process by hand, "
                            "then delete the file") from None


def write_record(home: Path, record: dict) -> None:
    path = record_path(home, record["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(record, indent=1))
    os.replace(partial, path)  # a reader sees the old record or the new one, never half of one


def remove_record(home: Path, name: str) -> None:
    record_path(home, name).unlink(missing_ok=True)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def still_running(record: dict) -> bool:
    """The recorded pid still runs the recorded command (not a recycled pid)."""
    argv, running = record["argv"], _cmdline(record["pid"])
    # A console script (mlflow, dask) runs as `python /path/script ...`: compare the program's name and arguments.
    return (len(running) >= len(argv) and running[len(running) - len(argv) + 1:] == argv[1:]
            and any(Path(part).name == Path(argv[0]).name for part in running[:2]))


def asks_credentials(record: dict) -> bool:
    return record.get("asks_credentials", True)
