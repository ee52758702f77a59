"""Prefect tasks of evaluation: task data in, a model's predictions and metrics out, all recorded in MLflow."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rag_core.evaluate.predictions import Evaluation, evaluate_model, predictions_jsonl
from rag_core.model.answers import MAX_NEW_TOKENS
from rag_core.progress import StageProgress
from rag_core.train.examples import Example
from rag_core.train.loaders import load_task
from tasks.adapters.mlflow_registry import _tracking
from tasks.adapters.mlflow_tracking import MlflowRunLogger, check_reachable, metric_name
from tasks.retry_policy import retry_unless_bad_input


@task(retries=2, retry_delay_seconds=5, retry_condition_fn=retry_unless_bad_input)
def load_examples(kind: str, url: str, options: dict[str, Any] | None = None) -> list[Example]:
    """A task file in its original format (path or URL) as examples."""
    return list(load_task(kind, url, options or {}))


def load_registered_model(model_uri: str, tracking_uri: str, index_version: str | None = None) -> Any:
    """The RagModel of a registered wikirag model, retrieving from ``index_version`` (default: its own).

    Its files are read as data and checked against their checksums; installed code builds the model
    (tasks.adapters.mlflow_flavor.load_registered): nothing from the artifact runs."""
    from tasks.adapters.mlflow_flavor import load_registered

    check_reachable(tracking_uri)
    with _tracking(tracking_uri):
        return load_registered(model_uri, tracking_uri, index_version)


@task(cache_policy=NO_CACHE)  # a model is no cache key: Prefect would warn on every call
def evaluate(model: Any, examples: list[Example], *, closed_book: bool = False, batch_size: int = 8,
             max_new_tokens: int = MAX_NEW_TOKENS, mode: str = "thorough", precision: str = "float32",
             split: str = "dev") -> Evaluation:
    """Predictions and metrics of ``model`` on ``examples`` (progress as a bar, or a line every 30 s); ``split``
    names them in the log (the wikirag-qa gate's are test questions).

    ``precision``: "auto" computes in bf16 autocast where this machine runs it natively (as training does;
    ~3x faster on AMX), float32 elsewhere; compare evaluations made at the same precision."""
    import contextlib

    import torch

    from rag_core.perf.precision import choose_precision

    device = str(getattr(model, "device", "cpu"))  # the model's resolved device (its config may say auto)
    dtype = choose_precision(precision, device).dtype  # type: ignore[arg-type]
    autocast = (torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if dtype == "bfloat16"
                else contextlib.nullcontext())
    with StageProgress(f"evaluate {examples[0].kind}", len(examples), "example", log=get_run_logger().info) as bar, \
            autocast:
        evaluation = evaluate_model(model, examples, batch_size=batch_size, closed_book=closed_book,
                                    max_new_tokens=max_new_tokens, mode=mode, progress=bar.update)
    name, value = evaluation.headline
    get_run_logger().info("%s on %d %s %s examples: %s %.4f (%.2f s/example)", "closed-book" if closed_book
                          else f"index {evaluation.index_version}", len(examples), evaluation.kind, split, name, value,
                          evaluation.seconds_per_example)
    return evaluation


@task
def record_evaluation(tracking_uri: str, run_id: str, evaluation: Evaluation, prefix: str = "dev",
                      step: int | None = None) -> dict[str, float]:
    """Metrics as ``<prefix>_<name>``, and the predictions and scores as the run's artifacts under ``prefix/``."""
    logger = MlflowRunLogger.open(tracking_uri, run_id)
    metrics = {f"{prefix}_{k}": v for k, v in evaluation.scores.items()}
    metrics[f"{prefix}_seconds_per_example"] = evaluation.seconds_per_example
    logger.log_metrics(metrics, step=step)
    metrics = {metric_name(k): v for k, v in metrics.items()}  # the names as MLflow keeps them
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "predictions.jsonl").write_bytes(predictions_jsonl(evaluation))
        (Path(tmp) / "scores.json").write_text(json.dumps(
            {"kind": evaluation.kind, "index_version": evaluation.index_version, **evaluation.scores}, indent=1))
        for name in ("predictions.jsonl", "scores.json"):
            logger.log_artifact(Path(tmp) / name, prefix)
    return metrics
