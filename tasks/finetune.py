"""Prefect tasks of fine-tuning: task files, the torchrun job, the models before and after, the registry."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from rag_core.index.versions import read_index_manifest
from rag_core.storage import Store
from rag_core.train.cloze import ClozeConfig, cloze_task
from rag_core.train.examples import examples_jsonl
from rag_core.train.recipe import initial_model
from rag_core.train.train_config import TrainConfig, TrainResult
from tasks.adapters.torchrun_launcher import launch_training
from tasks.retry_policy import retry_unless_bad_input

CLOZE_DIR = "tasks/cloze"  # on the store: one folder per passage set and cloze config


@task
def resolve_index(store: Store, index_version: str | None) -> str:
    """The version every task of one run trains on: ``index_version``, or LATEST now (not when each job starts)."""
    return read_index_manifest(store, index_version).version


@task(retries=1, retry_condition_fn=retry_unless_bad_input)
def cloze_files(store: Store, index_version: str, config: ClozeConfig) -> tuple[str, str]:
    """``(train_url, dev_url)``: cloze questions on the passages behind ``index_version``, drawn once per passage set
    and config (a rerun reads the files written before; dev questions come from held-out articles)."""
    manifest = read_index_manifest(store, index_version)
    if not manifest.dump_id:
        raise ValueError(f"index {index_version} names no passage set to draw cloze questions from; rebuild it")
    key = hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:12]
    folder = store.child(CLOZE_DIR, f"{manifest.dump_id}-{key}")
    if not (folder.exists("train.jsonl") and folder.exists("dev.jsonl")):
        drawn = cloze_task(store, manifest.dump_id, config)
        get_run_logger().info("cloze task from passage set %s: %d train, %d dev questions (%s)", manifest.dump_id,
                              len(drawn.train), len(drawn.dev), dict(drawn.counts))
        folder.write_bytes(examples_jsonl(drawn.dev), "dev.jsonl")
        folder.write_bytes(examples_jsonl(drawn.train), "train.jsonl")  # last: its presence means both exist
    return folder.url_of("train.jsonl"), folder.url_of("dev.jsonl")


FINGERPRINT_TAG = "wikirag.fingerprint"
# The revision of the promotion rule of `wikirag finetune` (tasks.adapters.mlflow_registry.gate): 2 = a version
# must also beat its own zero-shot start; 3 = by dev answers gained and lost beyond chance. Raise it when gate()
# places such a version differently, so versions placed by the old rule are not reused. (wikirag-qa's gate has its
# own, tasks.qa_gate.RULE.)
GATE_RULE = 3


def fingerprint(config: TrainConfig, evaluation: str, margin: float) -> str:
    """What decides a registered model and its alias: the recipe (files, index version, generator, seed...), its
    evaluation, and the gate that placed it (:data:`GATE_RULE`, ``margin``). A rerun with another margin, or
    after the rule changed, trains and gates anew instead of reusing a decision the gate would not make now."""
    key = f"{config.model_dump_json()}|{evaluation}|gate {GATE_RULE}, margin {float(margin)!r}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@task
def registered_with(tracking_uri: str, task_kind: str, print_: str) -> dict[str, Any] | None:
    """The registered ``wikirag-<task>`` version made from the same fingerprint, if any (a rerun then reuses it)."""
    from mlflow import MlflowClient

    from tasks.adapters.mlflow_registry import alias_now, model_name
    from tasks.adapters.mlflow_tracking import check_reachable

    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    found = [v for v in client.search_model_versions(f"name='{model_name(task_kind)}'")
             if v.tags.get(FINGERPRINT_TAG) == print_]
    if not found:
        return None
    version = max(found, key=lambda v: int(v.version))
    run = client.get_run(version.run_id)
    metric = version.tags["dev_metric"]
    return {"run_id": version.run_id, "metric": metric, "fine_tuned": float(version.tags["dev_metric_value"]),
            "zero_shot": run.data.metrics.get(f"zero_shot_{metric}", float("nan")),
            **{side: int(run.data.metrics[key]) for side, key in (("gained", "dev_answers_gained"),
                                                                   ("lost", "dev_answers_lost"))
               if key in run.data.metrics},
            "model_version": str(version.version), "alias": alias_now(client, version.name, version.version),
            "reason": f"reused: same recipe, data, index and margin as v{version.version}",
            "steps": int(run.data.params.get("max_steps", 0))}


@task
def zero_shot_model(config: TrainConfig, store: Store) -> Any:
    """The model training starts from, for the baseline evaluation."""
    from rag_core.model.retriever import IndexRetriever

    return initial_model(config, IndexRetriever.load(store, config.index_version))


@task(retries=1, retry_delay_seconds=10)
def train(config: TrainConfig, nproc: int, store_url: str, tracking_uri: str, run_id: str,
          dask_address: str | None = None) -> TrainResult:
    """The torchrun job (``nproc`` processes; rank 0 logs into ``run_id``; with ``dask_address`` the ranks retrieve
    through the index that cluster holds once). A retry resumes from its checkpoint."""
    result = launch_training(config, nproc, tracking_uri, run_id, store_url=store_url, dask_address=dask_address,
                             env=dict(os.environ))
    get_run_logger().info("trained %d steps on %d process(es): final loss %.4f, %.1f examples/s", result.final_step,
                          result.world_size, result.final_loss or float("nan"), result.examples_per_s or 0.0)
    return result


@task
def trained_model(store: Store, result: TrainResult, local_dir: str) -> Any:
    """The saved model of ``result``, copied to ``local_dir``, retrieving from the version it trained on."""
    from rag_core.model.retriever import IndexRetriever
    from rag_core.train.checkpoints import load_model

    model_store = Store(result.model_url, store.options)
    return load_model(model_store, IndexRetriever.load(store, result.index_version), local_dir)


def scratch_dir(prefix: str) -> str:
    """A local folder for a model's files during a flow run (the registry copies them into MLflow)."""
    return tempfile.mkdtemp(prefix=prefix)


def remove_dir(path: str) -> None:
    import shutil

    shutil.rmtree(Path(path), ignore_errors=True)
