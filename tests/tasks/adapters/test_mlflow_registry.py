"""The model registry on a real MLflow store: logging with the index binding, pinning, the promotion gate,
and consumers loading ``models:/wikirag-<task>@champion`` in a fresh process and over HTTP."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from cli.wikirag import main
from rag_core.errors import WikiragError
from rag_core.index.retention import delete_version, version_pins
from rag_core.index.version_names import IndexVersionError
from rag_core.storage import Store
from tasks.adapters.mlflow_registry import (
    CHALLENGER,
    CHAMPION,
    log_rag_model,
    model_name,
    pin_name,
    register,
    registered_versions,
)
from tasks.adapters.mlflow_tracking import tracked_run

ROOT = Path(__file__).resolve().parents[3]


def _registered(uri: str, store: Store, version: str, model_dir: Path, value: float, margin: float = 0.01):
    with tracked_run(uri, "wikirag-cloze", "finetune") as run:
        model_uri = log_rag_model(uri, run.run_id, model_dir, store_url=store.url, index_version=version)
        return register(uri, model_uri, "cloze", run_id=run.run_id, metric="em", value=value, margin=margin,
                        store=store, index_version=version)


def test_promotion_gate_both_ways_with_the_index_pinned(bound_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture) -> None:
    store, version, model_dir = bound_model
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    first = _registered(uri, store, version, model_dir, 0.30)
    assert (first.alias, first.version, first.champion_version) == (CHAMPION, "1", None)
    worse = _registered(uri, store, version, model_dir, 0.305)  # better, but not by the margin
    assert (worse.alias, worse.champion_value) == (CHALLENGER, 0.30) and "kept as challenger" in worse.reason
    better = _registered(uri, store, version, model_dir, 0.40)
    assert (better.alias, better.champion_version) == (CHAMPION, "1") and "promoted" in better.reason
    name = model_name("cloze")
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == "3"
    assert str(client.get_model_version_by_alias(name, CHALLENGER).version) == "2"
    tags = client.get_model_version(name, "2").tags
    assert (tags["index_version"], tags["dev_metric"], float(tags["dev_metric_value"])) == (version, "em", 0.305)
    run = client.get_run(tags["run_id"])
    assert "kept as challenger" in run.data.tags["promotion"]
    pins = [client.get_model_version(name, v).tags["index_pin"] for v in ("1", "2", "3")]
    assert pins == [pin_name(name, v) for v in ("1", "2", "3")]
    assert [p for p in version_pins(store, version) if p.startswith("mlflow:")] == pins  # no pending pin is left
    with pytest.raises(IndexVersionError, match=re.escape(pin_name(name, "1"))):
        delete_version(store, version, force=True)

    # what a consumer can load, and under which alias: v1 lost the champion alias to v3
    rows = registered_versions(uri)
    assert [(r["name"], r["version"], r["aliases"], r["value"]) for r in rows] == [
        (name, "1", [], 0.30), (name, "2", [CHALLENGER], 0.305), (name, "3", [CHAMPION], 0.40)]
    assert rows[1]["index_version"] == version and "kept as challenger" in rows[1]["promotion"]
    assert registered_versions(uri, "wikirag-nq") == []
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["models", "registered"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{name}\tv1\t-\tem 0.300\tindex {version}",
                     f"{name}\tv2\tchallenger\tem 0.305\tindex {version}",
                     f"{name}\tv3\tchampion\tem 0.400\tindex {version}"]
    client.set_model_version_tag(name, "1", "dev_metric_value", "not a number")  # tags are text anyone can set
    assert [r["value"] for r in registered_versions(uri, name)] == [None, 0.305, 0.40]


def test_a_fine_tune_whose_dev_lead_is_within_chance_is_registered_as_challenger(bound_model, tmp_path: Path) -> None:
    """wikirag finetune's registration step: a higher dev mean from 3 answers gained and 1 lost is chance (sign
    test p = 0.625), so the first version stays challenger; 6 gained and none lost (p = 0.031) promotes the next."""
    from flows.finetune import register_model
    from rag_core.model.rag_model import RagModel
    from rag_core.model.retriever import IndexRetriever
    from runtime.settings import StoreAccess

    store, version, model_dir = bound_model
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    model = RagModel.from_pretrained(model_dir, IndexRetriever.load(store, version))
    decisions = []
    for changed in ((3, 1), (6, 0)):
        with tracked_run(uri, "wikirag-cloze", "finetune") as run:
            decisions.append(register_model.fn(uri, run.run_id, model, StoreAccess(url=store.url), "cloze", "em",
                                               0.5, 0.0, "print", 0.3, changed))
        metrics = client.get_run(run.run_id).data.metrics
        assert (metrics["dev_answers_gained"], metrics["dev_answers_lost"]) == changed
    first, second = decisions
    assert first.alias == CHALLENGER and "3 answers gained and 1 lost, within chance" in first.reason
    assert "p = 0.625" in first.reason
    assert second.alias == CHAMPION and second.version == "2"


@pytest.mark.parametrize("failure", ["index version missing", "store refuses the pin"])
def test_a_failed_pin_leaves_no_registered_version(bound_model, tmp_path: Path, failure: str) -> None:
    store, version, model_dir = bound_model
    target = version
    if failure == "index version missing":
        target = "20991231T000000.000Z-0badc0de"  # never published (or deleted meanwhile)
    else:  # a copy of the store in which the version's pins folder cannot be created
        shutil.copytree(Path(store.url), tmp_path / "store")
        shutil.rmtree(tmp_path / "store" / "indexes" / version / "pins", ignore_errors=True)
        (tmp_path / "store" / "indexes" / version / "pins").write_text("not a folder")
        store = Store(str(tmp_path / "store"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with tracked_run(uri, "wikirag-cloze", "finetune") as run:
        model_uri = log_rag_model(uri, run.run_id, model_dir, store_url=store.url, index_version=target)
        with pytest.raises(WikiragError) as caught:
            register(uri, model_uri, "cloze", run_id=run.run_id, metric="em", value=0.5, margin=0.0, store=store,
                     index_version=target)
    assert "\n" not in str(caught.value) and target in str(caught.value)
    client = MlflowClient(tracking_uri=uri)
    assert client.search_model_versions(f"name='{model_name('cloze')}'") == []
    assert client.search_registered_models() == []
    if failure == "store refuses the pin":
        assert (tmp_path / "store" / "indexes" / version / "pins").read_text() == "not a folder"


def _fresh_python(code: str, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_consumers_load_the_champion_in_a_fresh_process_and_over_http(bound_model, tmp_path: Path) -> None:
    store, version, model_dir = bound_model
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _registered(uri, store, version, model_dir, 0.5)
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    questions = ["Who was the teacher of Alexander the Great?", "What is anarchism?"]
    code = ("import json, mlflow; m = mlflow.pyfunc.load_model('models:/wikirag-cloze@champion'); "
            f"print(json.dumps(m.predict({questions!r})))")
    proc = _fresh_python(code, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [a["question"] for a in answers] == questions
    for item in answers:
        assert isinstance(item["answer"], str) and len(item["provenance"]) == 2
        scores = [p["score"] for p in item["provenance"]]
        assert scores == sorted(scores, reverse=True) and abs(sum(scores) - 1) < 1e-3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/wikirag-cloze@champion",
                               "--host", "127.0.0.1", "--port", str(port), "--env-manager", "local"],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        body = json.dumps({"dataframe_records": [{"question": q} for q in questions]}).encode()
        deadline = time.monotonic() + 180
        while True:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=60) as resp:
                    served = json.load(resp)["predictions"]
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"mlflow models serve did not answer: {server.stdout.read()[-3000:]!r}")
                time.sleep(1)
        assert [s["answer"] for s in served] == [a["answer"] for a in answers]  # the same model, the same answers
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
