"""`wikirag evaluate` and `wikirag ask --model`: a registered model, its index swapped without retraining."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.model.generators import GeneratorConfig
from rag_core.model.rag_model import RagConfig, RagModel
from rag_core.model.retriever import IndexRetriever
from rag_core.storage import Store
from rag_core.train.cloze import ClozeConfig, cloze_examples
from rag_core.train.examples import write_examples
from runtime.process_groups import die_with_parent
from tasks.adapters.mlflow_registry import log_rag_model, register
from tasks.adapters.mlflow_tracking import tracked_run
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.generatorfiles import save_tiny_llama
from tests.helpers.passagefiles import publish_small_index, sample_passages

ROOT = Path(__file__).resolve().parents[2]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.wikirag", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600, preexec_fn=die_with_parent)


@pytest.mark.slow
def test_a_registered_model_is_evaluated_on_another_index_version_without_retraining(
        wiki: Path, home: Path, tmp_path: Path, prefect_server: str) -> None:
    passages = sample_passages().slice(0, 160)
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(tmp_path / "encoder")), dtype="float32"))
    store = Store(str(home / "store"))
    v1 = publish_small_index(store, "d1", passages, encoder, shards=2)
    v2 = publish_small_index(store, "d2", passages.slice(0, 120), encoder, shards=3)  # a later "dump": fewer pages
    config = RagConfig(n_docs=2, question_encoder=encoder.config,
                       generator=GeneratorConfig(path=str(save_tiny_llama(tmp_path / "llama"))))
    model_dir = RagModel.create(config, IndexRetriever.load(store, v1)).save_pretrained(tmp_path / "rag")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with tracked_run(uri, "wikirag-cloze", "finetune") as run:
        model_uri = log_rag_model(uri, run.run_id, model_dir, store_url=store.url, index_version=v1)
        register(uri, model_uri, "cloze", run_id=run.run_id, metric="em", value=0.0, margin=0.0, store=store,
                 index_version=v1)
    dev = write_examples(cloze_examples(passages, ClozeConfig(seed=0)).dev[:6], str(tmp_path / "dev.jsonl"))

    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": prefect_server}
    champion = "models:/wikirag-cloze@champion"
    for index in (None, v2):
        proc = _cli(env, "evaluate", "--model", champion, "--task", "cloze", "--dev", dev,
                    *(["--index", index] if index else []))
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics = json.loads(proc.stdout.strip().splitlines()[-1])
        assert metrics["dev_examples"] == 6 and 0 <= metrics["dev_em"] <= 1 and "dev_passage_recall_at_1" in metrics

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("wikirag-cloze")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.info.run_name.startswith("evaluate")]
    assert sorted(r.data.tags["index_version"] for r in runs) == sorted([v1, v2])
    assert {r.data.tags["trained_index_version"] for r in runs} == {v1}
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.metrics["dev_examples"] == 6
        assert {f.path for f in client.list_artifacts(r.info.run_id, "dev")} == {"dev/predictions.jsonl",
                                                                               "dev/scores.json"}

    asked = _cli(env, "ask", "--model", champion, "--index", v2, "--json", "Who was Alexander the Great?")
    assert asked.returncode == 0, asked.stderr[-3000:]
    record = json.loads(asked.stdout.strip().splitlines()[-1])
    assert record["question"] == "Who was Alexander the Great?" and len(record["provenance"]) == 2
    kept = {p["passage_id"] for p in record["provenance"]}
    assert kept <= set(passages.slice(0, 120).column("passage_id").to_pylist())  # read from v2's passages
