"""`wikirag finetune` on a real NQ-open file: 2 DDP processes, tracked in MLflow, evaluated before and after,
registered with its index pinned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.retention import holders
from rag_core.storage import Store
from runtime.process_groups import die_with_parent
from tests.conftest import SHARED_DATA
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.generatorfiles import save_tiny_llama
from tests.helpers.passagefiles import publish_small_index, sample_passages

ROOT = Path(__file__).resolve().parents[2]
NQ_DEV = SHARED_DATA / "qa" / "nq_open" / "NQ-open.dev.jsonl"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.wikirag", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900, preexec_fn=die_with_parent)


@pytest.mark.slow
def test_finetune_trains_with_two_processes_evaluates_and_registers(wiki: Path, tmp_path: Path,
                                                                   prefect_server: str) -> None:
    """A real NQ-open file; the cloze task (questions from the index) runs in the main job's test."""
    if not NQ_DEV.exists():
        pytest.skip(f"real NQ-open file not found at {NQ_DEV}")
    home = tmp_path / "home"
    store = Store(str(home / "store"))
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(tmp_path / "encoder")), dtype="float32"))
    version = publish_small_index(store, "d1", sample_passages().slice(0, 300), encoder, shards=2)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "WIKIRAG_HOME": str(home), "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT),
           "PREFECT_API_URL": prefect_server}
    train, dev = tmp_path / "nq-train.jsonl", tmp_path / "nq-dev.jsonl"
    lines = NQ_DEV.read_text().splitlines()
    train.write_text("\n".join(lines[:16]) + "\n")
    dev.write_text("\n".join(lines[16:22]) + "\n")

    tuned = _cli(env, "finetune", "--task", "nq", "--train", str(train), "--dev", str(dev), "--generator",
                 str(save_tiny_llama(tmp_path / "llama")), "--nproc", "2", "--max-steps", "3", "--batch-size", "4",
                 "--n-docs", "2", "--eval-examples", "6")
    assert tuned.returncode == 0, tuned.stderr[-4000:]
    outcome = json.loads(tuned.stdout.strip().splitlines()[-1])
    assert outcome["task"] == "nq" and outcome["steps"] == 3
    # A random tiny generator answers none of these 6 NQ questions before or after 3 steps: a tie, so the first
    # version of wikirag-nq does not beat its zero-shot start and is registered as challenger, not champion.
    assert outcome["zero_shot"] == outcome["fine_tuned"] == 0.0 and outcome["alias"] == "challenger"
    assert outcome["reason"] == "em 0.0000 does not beat its zero-shot start's 0.0000: kept as challenger"
    assert (outcome["gained"], outcome["lost"]) == (0, 0)  # no dev answer changed
    assert outcome["index_version"] == version

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(outcome["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["world_size"] == "2"
    assert {"zero_shot_em", "dev_em", "dev_f1", "zero_shot_f1", "final_loss"} <= set(run.data.metrics)
    assert (run.data.metrics["dev_answers_gained"], run.data.metrics["dev_answers_lost"]) == (0.0, 0.0)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [1, 2, 3]
    assert {"dev", "zero_shot", "plots", "promotion.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    assert [v.run_id for v in client.search_model_versions("name='wikirag-nq'")] == [run.info.run_id]
    assert run.data.tags["wikirag.index_version"] == version
    assert holders(store, version) == ["LATEST", "pin 'mlflow:wikirag-nq/1'"]  # the model's index cannot be deleted
    assert client.get_model_version("wikirag-nq", "1").aliases == ["challenger"]
    assert "champion" not in client.get_registered_model("wikirag-nq").aliases

    # Another recipe on the same index trains in a folder of its own (it used to meet the first run's checkpoint
    # and fail with "config differs"); --train-layers reaches the recipe.
    partial = _cli(env, "finetune", "--task", "nq", "--train", str(train), "--dev", str(dev), "--generator",
                   str(tmp_path / "llama"), "--nproc", "2", "--max-steps", "3", "--batch-size", "4",
                   "--n-docs", "2", "--eval-examples", "5", "--train-layers", "1")
    assert partial.returncode == 0, partial.stderr[-4000:]
    # 5 dev examples: no gate on them can tell a fine-tune from chance, and the run says so; 6 can
    assert "nq: gated on 5 dev example(s): on fewer than 6 no fine-tune can be promoted" in partial.stderr
    assert "gated on 6 dev example(s)" not in tuned.stderr
    second = json.loads(partial.stdout.strip().splitlines()[-1])
    assert second["run_id"] != outcome["run_id"] and second["model_version"] == "2" and second["steps"] == 3
    params = client.get_run(second["run_id"]).data.params
    assert params["train_generator_layers"] == "1"
    assert int(params["trainable_parameters"]) < int(run.data.params["trainable_parameters"])
    assert "training its last 1 of 2 decoder blocks" in partial.stderr


def test_finetune_refuses_a_task_without_files(tmp_path: Path) -> None:
    env = {**os.environ, "WIKIRAG_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    result = _cli(env, "finetune", "--task", "nq", "--generator", str(tmp_path))
    assert result.returncode == 2
    assert "--task nq needs --train FILE and --dev FILE" in result.stderr and "Traceback" not in result.stderr


def test_every_evaluation_of_finetune_is_bounded_by_eval_examples(tmp_path: Path) -> None:
    """The recipe's dev-loss passes read at most --eval-examples dev examples, as the flow's evaluations do."""
    from cli.wikirag import build_parser
    from cli.train import finetune_request
    from runtime.settings import Settings

    generator = save_tiny_llama(tmp_path / "llama")
    args = build_parser().parse_args(["finetune", "--task", "cloze", "--generator", str(generator),
                                      "--eval-examples", "4"])
    request = finetune_request(args, Settings(home=tmp_path / "home"))
    assert request["eval_examples"] == 4 and request["recipe"]["max_dev_examples"] == 4
    assert request["decoding"] == "fast" and request["eval_precision"] == "auto"  # as the main job evaluates
    from rag_core.train.jobs import FinetuneRequest

    assert FinetuneRequest.model_validate(request).eval_examples == 4  # the flow takes the request as built
