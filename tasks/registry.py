"""The MLflow Model Registry for wikirag: a RAG model logged with its index binding, and the promotion gate.

A trained model becomes a version of ``wikirag-<task>``: an MLflow pyfunc
model (tasks/pyfunc_model.py, models from code) whose artifact is the saved
RAG model and whose ``model_config`` names the store and the index version it
reads. That index version is pinned in the store (``mlflow:wikirag-<task>/<n>``)
before the version exists, so nobody can delete it under the model.

The promotion gate moves the alias ``champion`` to the new version only when
its headline dev metric beats the current champion's by ``margin`` (or there
is no champion yet); otherwise the new version gets ``challenger``. The
decision, with its numbers, is written to the version's tags and to the
training run.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from rag_core.index.retention import pin_version
from rag_core.storage import Store
from tasks.tracking import check_reachable

# predict() has no type hints on purpose (MLflow would turn them into a schema that refuses a plain list of
# questions); MLflow's advice to add them, printed wherever the model's code is loaded, is noise in every log
warnings.filterwarnings("ignore", message=".*Add type hints to the `predict` method")

CHAMPION, CHALLENGER = "champion", "challenger"
PYFUNC_CODE = Path(__file__).with_name("pyfunc_model.py")
# Consumers load the model where wikirag is installed (`pip install -e .`; `mlflow models serve --env-manager
# local`): wikirag is no PyPI package, so these are the pins its code needs beside it.
PIP_REQUIREMENTS = ["torch==2.13.0", "transformers>=5.24,<5.25", "faiss-cpu>=1.15,<1.16"]


def model_name(task: str) -> str:
    return f"wikirag-{task}"


def pin_name(name: str, version: str | int) -> str:
    """Who holds an index version pinned for a registered model version."""
    return f"mlflow:{name}/{version}"


@dataclass(frozen=True)
class Promotion:
    """What the gate decided, and why, with its numbers."""

    name: str
    version: str
    alias: str  # champion or challenger
    metric: str
    value: float
    champion_version: str | None
    champion_value: float | None
    margin: float
    index_version: str
    reason: str


@contextlib.contextmanager
def _tracking(uri: str) -> Iterator[None]:
    """MLflow's fluent API (log_model, register_model) against ``uri``, restoring the process's URI after."""
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)


def log_rag_model(tracking_uri: str, run_id: str, model_dir: str | Path, *, store_url: str, index_version: str,
                  n_docs: int | None = None) -> str:
    """Log a saved RAG model as a pyfunc model of run ``run_id``, bound to ``index_version``; returns its URI."""
    check_reachable(tracking_uri)
    config = {"store": store_url, "index_version": index_version, **({"n_docs": n_docs} if n_docs else {})}
    with _tracking(tracking_uri), mlflow.start_run(run_id=run_id):
        info = mlflow.pyfunc.log_model(name="model", python_model=str(PYFUNC_CODE),
                                       artifacts={"rag_model": str(model_dir)}, model_config=config,
                                       pip_requirements=PIP_REQUIREMENTS)
    return info.model_uri


def _champion(client: MlflowClient, name: str) -> tuple[str | None, float | None]:
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None, None
    value = champion.tags.get("dev_metric_value")
    return str(champion.version), (float(value) if value is not None else None)


def register(tracking_uri: str, model_uri: str, task: str, *, run_id: str, metric: str, value: float,
             margin: float, store: Store, index_version: str) -> Promotion:
    """Register ``model_uri`` as a new version of ``wikirag-<task>``, pin its index, and gate its promotion."""
    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    name = model_name(task)
    with _tracking(tracking_uri):
        version = mlflow.register_model(model_uri, name).version
    pin_version(store, index_version, pin_name(name, version), note=f"registered model {name} version {version}")
    champion_version, champion_value = _champion(client, name)
    if champion_version is None or champion_value is None:
        alias, reason = CHAMPION, f"first {name} version with a {metric}: champion"
    elif value >= champion_value + margin:
        alias, reason = CHAMPION, (f"{metric} {value:.4f} >= champion v{champion_version}'s {champion_value:.4f} "
                                   f"+ margin {margin}: promoted")
    else:
        alias, reason = CHALLENGER, (f"{metric} {value:.4f} < champion v{champion_version}'s {champion_value:.4f} "
                                     f"+ margin {margin}: kept as challenger")
    promotion = Promotion(name, str(version), alias, metric, value, champion_version, champion_value, margin,
                          index_version, reason)
    for key, tag in {"dev_metric": metric, "dev_metric_value": f"{value:.6f}", "index_version": index_version,
                     "store": store.url, "promotion": reason, "run_id": run_id}.items():
        client.set_model_version_tag(name, str(version), key, tag)
    client.set_registered_model_alias(name, alias, str(version))
    client.log_dict(run_id, {k: v for k, v in asdict(promotion).items()}, "promotion.json")
    client.set_tag(run_id, "promotion", f"{name} v{version} -> {alias}: {reason}")
    return promotion
