"""The ``evaluate`` flow: a registered model on a task's dev set, against any index version, recorded in MLflow.

load the dev examples -> load ``models:/wikirag-<task>@...`` (optionally onto another index
version: the paper's knowledge hot-swap, no retraining) -> predict -> gate the predictions (GX)
-> metrics, predictions and scores in an MLflow run of experiment ``wikirag-<task>`` whose tags
name the model, the index version it was trained against and the one it read.
"""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from rag_core.train.cloze import ClozeConfig
from runtime.process_tuning import start_process
from runtime.settings import Settings, StoreAccess, quiet_environment
from tasks.adapters.mlflow_tracking import close_run, closing_run, open_run
from tasks.dataset_quality import gate_predictions
from tasks.evaluation import evaluate, load_examples, load_registered_model, record_evaluation
from tasks.finetune import cloze_files

quiet_environment()


@task
def load_model(model_uri: str, tracking_uri: str, index_version: str | None) -> object:
    """The registered model's RagModel, retrieving from ``index_version`` (default: the one it is bound to)."""
    return load_registered_model(model_uri, tracking_uri, index_version)


@task(cache_policy=NO_CACHE)  # a model is no cache key: Prefect would warn on every call
def start_run(tracking_uri: str, task_kind: str, model_uri: str, model: object, closed_book: bool) -> str:
    tags = {"model_uri": model_uri, "trained_index_version": str(model.trained_index_version),
            "index_version": "none (closed book)" if closed_book else str(model.index_version)}
    name = "evaluate closed-book" if closed_book else f"evaluate on index {model.index_version}"
    return open_run(tracking_uri, f"wikirag-{task_kind}", name, tags)


@task
def finish_run(tracking_uri: str, run_id: str, failed: bool = False) -> None:
    close_run(tracking_uri, run_id, failed=failed)


@flow(name="evaluate", validate_parameters=True)
def evaluate_registered(model_uri: str, task_kind: str, dev: str | None, tracking_uri: str, store: StoreAccess,
                        index_version: str | None = None, closed_book: bool = False) -> dict[str, float]:
    """Evaluate ``model_uri`` on the ``task_kind`` dev file ``dev``; returns the metrics recorded.

    Without ``dev`` a cloze model is evaluated on the held-out questions of the passage set it was
    trained on (the same questions whichever index version it reads now)."""
    model = load_model(model_uri, tracking_uri, index_version)
    if dev is None:
        if task_kind != "cloze":
            raise ValueError(f"evaluate: task {task_kind} needs a dev file; only cloze draws its own questions")
        _, dev = cloze_files(store.store(), model.trained_index_version, ClozeConfig())
    examples = load_examples(task_kind, dev, store.options(dev))
    run_id = start_run(tracking_uri, task_kind, model_uri, model, closed_book)
    with closing_run(tracking_uri, run_id, finish_run):
        evaluation = evaluate(model, examples, closed_book=closed_book)
        gate_predictions(task_kind, examples, evaluation.predictions)
        return record_evaluation(tracking_uri, run_id, evaluation)


@flow(name="evaluate-deployment", validate_parameters=True)
def deployed_evaluate(model_uri: str, task_kind: str, dev: str | None = None, index_version: str | None = None,
                      closed_book: bool = False) -> dict[str, float]:
    """The deployment's entry point: the worker's settings (MLflow, store), read once."""
    settings = Settings()
    start_process(settings)  # the deployment's process: the same switches as a command's
    return evaluate_registered(model_uri, task_kind, dev, settings.tracking_uri, settings.store_access(),
                               index_version, closed_book)
