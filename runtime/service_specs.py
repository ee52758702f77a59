"""Each engine of a deployment, defined once: its command line, ports, health check and credentials.

Every way of starting an engine renders these definitions: ``wikirag services`` (runtime/services.py), the
scripts in infra/ (``python -m runtime.services run NAME``), the per-command and workspace Prefect servers
(runtime/prefect_server.py), and the commands, published ports, health checks and credentials of
infra/compose.yaml and infra/k8s, which tests/test_infra.py renders from here for their :class:`Placement`
and compares.

| service | engine | listens on (``WIKIRAG_<FIELD>``) | health |
|---|---|---|---|
| ``s3`` | SeaweedFS (``weed mini``), two S3 identities in a file in memory | ``s3_port`` (+ 4 more) | TCP |
| ``mlflow`` | ``mlflow server --app-name basic-auth``, its artifacts in S3 | ``mlflow_port`` | ``GET /health`` |
| ``prefect`` | ``prefect server start`` with basic auth | ``prefect_port`` | ``GET /api/health`` |
| ``worker`` | ``prefect worker start`` on the ``wikirag-process`` pool | | |
| ``dask`` | ``dask scheduler`` over TLS, encryption required | ``dask_port``, ``dask_dashboard_port`` | TCP |
| ``dask-workers`` | ``dask worker``, one thread each, over TLS, preloading runtime.process_tuning | | |
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.service_credentials import MLFLOW_BUCKET, ServicesError, TlsFiles

WORK_POOL = "wikirag-process"
GRPC_OFFSET = 10_000  # SeaweedFS serves gRPC this far above each HTTP port
_REQUIRE_TLS = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}
# Each worker process imports it and runs its dask_setup (start_process) as a command's local cluster does; it
# reads WIKIRAG_PROCESS_TUNING and WIKIRAG_PERF from the worker's own environment.
WORKER_PRELOAD = "runtime.process_tuning"


class ServicePorts(BaseSettings):
    """Where the services listen; ``WIKIRAG_<FIELD>`` overrides each."""

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
class Placement:
    """Where the services run: the values that differ between one machine, compose and Kubernetes."""

    bind: str  # the address every server listens on
    hosts: Mapping[str, str]  # how the others reach a service, by name
    ports: ServicePorts
    state: str  # the folder each service keeps its data under
    tls: str  # Dask's CA and certificates (runtime.service_credentials.TlsFiles)
    programs: str = ""  # the folder of SeaweedFS's `weed` (and, without ``python``, of the console scripts); "": PATH
    python: str = ""  # an interpreter that runs Prefect, MLflow and Dask as modules; "": their console scripts
    s3_advertised: str | None = None  # SeaweedFS's -ip: the address its parts give each other; None: its own guess
    dask_workers: str = "1"  # processes per `dask worker`: a count or "auto"
    dask_worker_options: tuple[str, ...] = ()  # fixed ports and memory limit where a network policy names them
    mlflow_workers: int = 1
    mlflow_backend: str | None = None  # None: MLFLOW_BACKEND_STORE_URI in its environment (it holds a password)
    mlflow_allowed_hosts: str | None = None  # the Host headers MLflow answers beyond localhost's
    worker_name: str | None = None  # the Prefect worker's name; None: Prefect picks one

    @classmethod
    def local(cls, home: Path, ports: ServicePorts | None = None) -> Placement:
        """One machine, loopback only: ``wikirag services``, the scripts and the Prefect servers of commands."""
        ports = ports or ServicePorts()
        state = home / "services"
        return cls(bind="127.0.0.1", hosts=dict.fromkeys(SPECS, "127.0.0.1"), ports=ports, state=str(state),
                   tls=str(state / "tls"), programs=str(Path(sys.executable).parent), python=sys.executable,
                   s3_advertised="127.0.0.1",
                   dask_workers=str(ports.dask_workers), mlflow_backend=f"sqlite:///{state / 'mlflow.db'}",
                   worker_name=f"wikirag-{socket.gethostname()}")

    def url(self, name: str) -> str:
        """Where a client reaches the service ``name`` (Prefect's is its API)."""
        host, p = self.hosts[name], self.ports
        return {"s3": f"http://{host}:{p.s3_port}", "mlflow": f"http://{host}:{p.mlflow_port}",
                "prefect": f"http://{host}:{p.prefect_port}/api", "dask": f"tls://{host}:{p.dask_port}"}[name]


_CONTAINER_HOSTS = {"s3": "s3", "mlflow": "mlflow", "prefect": "prefect-server", "dask": "dask-scheduler"}
_DEFAULT_PORTS = ServicePorts.model_construct(**{k: f.default for k, f in ServicePorts.model_fields.items()})
# infra/compose.yaml: one Docker network, each service's name resolves to its container.
COMPOSE = Placement(bind="0.0.0.0", hosts=_CONTAINER_HOSTS, ports=_DEFAULT_PORTS, state="/var/lib/wikirag",
                    tls="/var/lib/wikirag/tls", s3_advertised="s3", dask_workers="auto", mlflow_workers=2,
                    mlflow_allowed_hosts="mlflow:5000,127.0.0.1:5000,localhost:5000")
# infra/k8s: a Service name resolves to a virtual address that forwards only the published port, so SeaweedFS's
# parts find each other by the pod's own address; one worker process per pod, on the ports the policies allow.
KUBERNETES = replace(COMPOSE, tls="/etc/wikirag/dask-tls", s3_advertised=None, dask_workers="1",
                     dask_worker_options=("--worker-port", "8788", "--nanny-port", "8789", "--memory-limit", "6GiB"),
                     mlflow_allowed_hosts="mlflow:5000,mlflow.wikirag.svc:5000,127.0.0.1:5000,localhost:5000")


@dataclass(frozen=True)
class Health:
    """A probe that needs no credentials: ``GET path`` answers 200, or (``path`` None) the port accepts."""

    port: str  # a ServicePorts field
    path: str | None = None


@dataclass(frozen=True)
class ServiceSpec:
    """One engine: how it is started, where it listens, how it is probed, what it is locked with."""

    name: str  # as `wikirag services` calls it
    deployed_as: str  # its service in infra/compose.yaml and its app label in infra/k8s
    command: Callable[[Placement], list[str]]  # argv, the program first
    ports: tuple[str, ...] = ()  # the ServicePorts fields it publishes
    health: Health | None = None
    # what the engine (or, with identities_in_memory, its launcher) reads from its environment -> the variable of
    # `wikirag services up` it comes from
    credentials: Mapping[str, str] = field(default_factory=dict)
    passes_on: tuple[str, ...] = ()  # client credentials it hands its tasks when given (none is required)
    environment: Mapping[str, str] = field(default_factory=dict)  # other settings the engine needs, no secret
    needs: str | None = None  # the service that must answer before this one starts
    # the services its work calls while it runs (flow runs write to MLflow and S3...): `down` stops it before them
    uses: tuple[str, ...] = ()
    identities_in_memory: bool = False  # S3 identities handed over as a file in memory (runtime.services seaweedfs)

    def argv(self, placement: Placement) -> list[str]:
        return self.command(placement)

    def container_command(self, placement: Placement) -> list[str]:
        """The command of the compose service or Kubernetes container (through the identities' launcher)."""
        argv = self.argv(placement)
        return ["python", "-m", "runtime.services", "seaweedfs", *argv] if self.identities_in_memory else argv

    def engine_environment(self, sources: Mapping[str, str]) -> dict[str, str]:
        """Its settings and its credentials under the names it reads, from ``sources`` (skipping empty ones).

        Identities handed over in memory stay out: SeaweedFS makes AWS_ACCESS_KEY_ID in its environment an admin
        of every bucket."""
        mapping = {} if self.identities_in_memory else dict(self.credentials)
        mapping.update((name, name) for name in self.passes_on)
        secrets = {var: sources[src] for var, src in mapping.items() if sources.get(src)}
        return {**self.environment, **secrets}


def _program(placement: Placement, name: str) -> list[str]:
    if placement.python and name != "weed":  # the installed package, wherever pip put its console scripts
        return [placement.python, "-m", name]
    return [str(Path(placement.programs) / name) if placement.programs else name]


def _seaweedfs(at: Placement) -> list[str]:
    weed = at.ports.weed_ports()
    return [*_program(at, "weed"), "mini", f"-dir={at.state}/s3",
            *([f"-ip={at.s3_advertised}"] if at.s3_advertised else []), f"-ip.bind={at.bind}",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            *(f"-{part}.port={port}" for part, port in weed.items()),
            *(f"-{part}.port.grpc={port + GRPC_OFFSET}" for part, port in weed.items())]


def _mlflow(at: Placement) -> list[str]:
    return [*_program(at, "mlflow"), "server", "--app-name", "basic-auth", "--host", at.bind,
            "--port", str(at.ports.mlflow_port), "--workers", str(at.mlflow_workers),
            *(["--backend-store-uri", at.mlflow_backend] if at.mlflow_backend else []),
            "--artifacts-destination", f"s3://{MLFLOW_BUCKET}/artifacts",
            *(["--allowed-hosts", at.mlflow_allowed_hosts] if at.mlflow_allowed_hosts else [])]


def _prefect_server(at: Placement) -> list[str]:
    return [*_program(at, "prefect"), "server", "start", "--host", at.bind, "--port", str(at.ports.prefect_port)]


def _prefect_worker(at: Placement) -> list[str]:
    return [*_program(at, "prefect"), "worker", "start", "--pool", WORK_POOL, "--type", "process",
            *(["--name", at.worker_name] if at.worker_name else [])]


def _dask_scheduler(at: Placement) -> list[str]:
    return [*_program(at, "dask"), "scheduler", "--host", at.bind, "--port", str(at.ports.dask_port),
            "--protocol", "tls", *TlsFiles(Path(at.tls)).cli_args(),
            "--dashboard-address", f"{at.bind}:{at.ports.dask_dashboard_port}"]


def _dask_workers(at: Placement) -> list[str]:
    return [*_program(at, "dask"), "worker", at.url("dask"), "--host", at.bind, "--protocol", "tls",
            *TlsFiles(Path(at.tls)).cli_args(), "--nworkers", at.dask_workers, "--nthreads", "1",
            "--dashboard-address", f"{at.bind}:0", "--preload", WORKER_PRELOAD, *at.dask_worker_options]


_STORE_IDENTITY = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}
SPECS: dict[str, ServiceSpec] = {s.name: s for s in (  # in start order
    ServiceSpec("s3", "s3", _seaweedfs, ports=("s3_port",), health=Health("s3_port"),
                credentials={**_STORE_IDENTITY, "WIKIRAG_MLFLOW_S3_KEY": "WIKIRAG_MLFLOW_S3_KEY",
                             "WIKIRAG_MLFLOW_S3_SECRET": "WIKIRAG_MLFLOW_S3_SECRET"},
                identities_in_memory=True),
    ServiceSpec("mlflow", "mlflow", _mlflow, ports=("mlflow_port",), health=Health("mlflow_port", "/health"),
                credentials={"AWS_ACCESS_KEY_ID": "WIKIRAG_MLFLOW_S3_KEY",  # its own identity: bucket wikirag-mlflow
                             "AWS_SECRET_ACCESS_KEY": "WIKIRAG_MLFLOW_S3_SECRET",
                             "MLFLOW_AUTH_ADMIN_USERNAME": "MLFLOW_TRACKING_USERNAME",
                             "MLFLOW_AUTH_ADMIN_PASSWORD": "MLFLOW_TRACKING_PASSWORD"},
                needs="s3"),
    ServiceSpec("prefect", "prefect-server", _prefect_server, ports=("prefect_port",),
                health=Health("prefect_port", "/api/health"),
                credentials={"PREFECT_SERVER_API_AUTH_STRING": "PREFECT_API_AUTH_STRING"}),
    ServiceSpec("worker", "prefect-worker", _prefect_worker,
                credentials={"PREFECT_API_AUTH_STRING": "PREFECT_API_AUTH_STRING", **_STORE_IDENTITY,
                             "MLFLOW_TRACKING_USERNAME": "MLFLOW_TRACKING_USERNAME",
                             "MLFLOW_TRACKING_PASSWORD": "MLFLOW_TRACKING_PASSWORD"},
                needs="prefect", uses=("s3", "mlflow", "dask")),
    ServiceSpec("dask", "dask-scheduler", _dask_scheduler, ports=("dask_port", "dask_dashboard_port"),
                health=Health("dask_port"), environment=_REQUIRE_TLS),
    ServiceSpec("dask-workers", "dask-worker", _dask_workers, passes_on=("PREFECT_API_AUTH_STRING",),
                environment=_REQUIRE_TLS, needs="dask", uses=("s3", "prefect")),
)}


def spec(name: str) -> ServiceSpec:
    if name not in SPECS:
        raise ServicesError(f"no service {name!r}; the services are {', '.join(SPECS)}")
    return SPECS[name]


def listening_ports(name: str, ports: ServicePorts) -> list[int]:
    """Every port the service binds on its host (SeaweedFS's parts and their gRPC twins included)."""
    if name == "s3":
        return [p + offset for p in ports.weed_ports().values() for offset in (0, GRPC_OFFSET)]
    return [getattr(ports, f) for f in SPECS[name].ports]
