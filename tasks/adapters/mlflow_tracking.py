"""MLflow behind rag_core's RunLogger: one experiment per task, one run per training or evaluation.

Every call names its tracking URI (no global ``mlflow.set_tracking_uri``): DDP
processes and Dask workers get it as an argument, since client environment
variables do not reach them (../shared/STACK.md). With a local SQLite store the
experiment's artifacts go beside the database, never into the working
directory; with a server the server decides (it proxies artifacts to S3).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus

from rag_core.errors import WikiragError

# Parameters whose names look like credentials are never logged, whatever their value.
_SECRET_NAME = re.compile(r"secret|password|passwd|token|credential|(^|[_.])key$", re.IGNORECASE)
_PARAM_CHARS = 6000  # MLflow's limit on a parameter value
_BATCH = 1000  # MLflow's limit on metrics per log_batch call
_METRIC_NAME = re.compile(r"[^\w\-. :/]")  # what MLflow refuses in a metric name


def metric_name(name: str) -> str:
    """``answer_recall@5`` as MLflow accepts it: ``answer_recall_at_5`` (other refused characters become _)."""
    return _METRIC_NAME.sub("_", name.replace("@", "_at_"))


class TrackingError(WikiragError):
    """The tracking store cannot be reached or refuses a write."""


def artifact_root(tracking_uri: str) -> str | None:
    """Where a new experiment's artifacts go: beside a SQLite/file store; None (the server's choice) otherwise."""
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


def check_reachable(tracking_uri: str, timeout: float = 5.0) -> None:
    """Fail in seconds, not minutes, when a tracking server is down (MLflow's own client retries for minutes)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return
    import urllib.request

    try:
        with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=timeout):
            return
    except OSError as exc:
        raise TrackingError(f"MLflow at {tracking_uri} does not answer ({exc}); check MLFLOW_TRACKING_URI and "
                            "that the server runs (`wikirag services status`)") from None


def experiment_id(client: MlflowClient, name: str, tracking_uri: str) -> str:
    """The experiment ``name``, created on first use."""
    try:
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        root = artifact_root(tracking_uri)
        return client.create_experiment(name, artifact_location=f"{root}/{name}" if root else None)
    except Exception as exc:
        if isinstance(exc, WikiragError):
            raise
        raise TrackingError(f"MLflow at {tracking_uri}: cannot open experiment {name!r} ({type(exc).__name__}: "
                            f"{str(exc)[:200]}); check MLFLOW_TRACKING_URI and that the server runs") from exc


class MlflowRunLogger:
    """A :class:`rag_core.train.tracking.RunLogger` writing into one MLflow run."""

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self.client = client
        self.run_id = run_id

    @classmethod
    def open(cls, tracking_uri: str, run_id: str) -> MlflowRunLogger:
        """A logger for an existing run (e.g. one a flow created, written to by a training job)."""
        check_reachable(tracking_uri)
        return cls(MlflowClient(tracking_uri=tracking_uri), run_id)

    def log_params(self, params: Mapping[str, Any]) -> None:
        safe = [Param(k, str(v)[:_PARAM_CHARS]) for k, v in _flatten(params).items() if not _SECRET_NAME.search(k)]
        for start in range(0, len(safe), 100):
            self.client.log_batch(self.run_id, params=safe[start:start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        rows = [Metric(metric_name(k), float(v), now, step or 0) for k, v in metrics.items()]
        for start in range(0, len(rows), _BATCH):
            self.client.log_batch(self.run_id, metrics=rows[start:start + _BATCH])

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path=folder)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dicts as ``a.b.c`` parameters (MLflow's parameters are flat)."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


@contextlib.contextmanager
def tracked_run(tracking_uri: str, experiment: str, run_name: str,
                tags: Mapping[str, str] | None = None) -> Iterator[MlflowRunLogger]:
    """An MLflow run that ends FINISHED, or FAILED when the block raises (also on KeyboardInterrupt)."""
    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = experiment_id(client, experiment, tracking_uri)
    run = client.create_run(exp, run_name=run_name, tags=dict(tags or {}))
    with closing_run(tracking_uri, run.info.run_id):
        yield MlflowRunLogger(client, run.info.run_id)


def open_run(tracking_uri: str, experiment: str, run_name: str, tags: Mapping[str, str] | None = None) -> str:
    """Create a run that stays open across tasks and processes (a training job writes into it); returns its id."""
    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    return client.create_run(experiment_id(client, experiment, tracking_uri), run_name=run_name,
                             tags=dict(tags or {})).info.run_id


def close_run(tracking_uri: str, run_id: str, *, failed: bool = False) -> None:
    status = RunStatus.FAILED if failed else RunStatus.FINISHED
    MlflowClient(tracking_uri=tracking_uri).set_terminated(run_id, status=RunStatus.to_string(status))


@contextlib.contextmanager
def closing_run(tracking_uri: str, run_id: str, close: Callable[..., None] = close_run) -> Iterator[None]:
    """The block's work in the open run ``run_id``, which ``close`` ends FINISHED after it, or FAILED when the block
    raises (also on KeyboardInterrupt). A flow passes its closing task, so that the close is a task run of its own."""
    try:
        yield
    except BaseException:
        close(tracking_uri, run_id, failed=True)
        raise
    close(tracking_uri, run_id)
