"""tasks.adapters.mlflow_tracking against a real MLflow store (SQLite): runs, parameters, metrics, artifacts,
failures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rag_core.train.tracking import MemoryLogger, NullLogger, RunLogger
from tasks.adapters.mlflow_tracking import tracked_run


def test_a_run_records_flat_params_step_metrics_and_artifacts_beside_the_store(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # artifacts must not land in the working directory
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    note = tmp_path / "predictions.jsonl"
    note.write_text('{"id": 1}\n')
    with tracked_run(uri, "wikirag-nq", "finetune", tags={"task": "nq"}) as run:
        assert isinstance(run, RunLogger)
        run.log_params({"train": {"lr": 3e-5, "n_docs": 5}, "aws_secret_access_key": "do-not-log",
                        "store": {"key": "AKIA-do-not-log"}, "index_version": "v1"})
        for step, loss in enumerate([3.0, 2.0, 1.5]):
            run.log_metrics({"loss": loss}, step=step)
        run.log_artifact(note, "predictions")
    client = MlflowClient(tracking_uri=uri)
    data = client.get_run(run.run_id)
    assert data.info.status == "FINISHED"
    assert data.data.params == {"train.lr": "3e-05", "train.n_docs": "5", "index_version": "v1"}
    assert [(m.step, m.value) for m in client.get_metric_history(run.run_id, "loss")] == [(0, 3.0), (1, 2.0), (2, 1.5)]
    assert data.data.tags["task"] == "nq"
    assert [f.path for f in client.list_artifacts(run.run_id, "predictions")] == ["predictions/predictions.jsonl"]
    assert data.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())
    assert not os.listdir(work), "artifacts leaked into the working directory"


def test_a_failing_block_marks_the_run_failed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(RuntimeError), tracked_run(uri, "wikirag-cloze", "finetune") as run:
        raise RuntimeError("diverged")
    assert MlflowClient(tracking_uri=uri).get_run(run.run_id).info.status == "FAILED"


def test_unreachable_tracking_is_one_clear_error(tmp_path: Path) -> None:
    from tasks.adapters.mlflow_tracking import TrackingError

    with pytest.raises(TrackingError, match="http://127.0.0.1:9/.*MLFLOW_TRACKING_URI"), \
            tracked_run("http://127.0.0.1:9/", "wikirag-nq", "x"):
        pass


def test_memory_and_null_loggers_follow_the_interface() -> None:
    memory = MemoryLogger()
    for logger in (memory, NullLogger()):
        assert isinstance(logger, RunLogger)
        logger.log_params({"a": 1})
        logger.log_metrics({"loss": 2.0}, step=3)
        logger.set_tags({"t": "x"})
    assert memory.metrics == {"loss": [(3, 2.0)]} and memory.params == {"a": 1}
    assert not isinstance(object(), RunLogger)
