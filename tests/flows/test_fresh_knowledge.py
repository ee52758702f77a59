"""Fresh knowledge, operated end to end on real services: prefect.yaml's ``index-rebuild-enwiki`` and ``refresh``
deployments (`prefect deploy`) run by a real process worker against a real Prefect server, a loopback dump site in
Wikimedia's layout, SeaweedFS as the store and a real MLflow tracking server (``mlflow server``, its registry in
SQLite, its artifacts served by it).

A new dated dump appears -> the rebuild deployment mirrors it (sha1-verified), rebuilds and publishes -> the
``wikirag.index.published`` event triggers ``refresh`` -> the champion is re-bound to the new version, and
``wikirag ask --model models:/wikirag-cloze@champion`` answers the new fact; ``models rollback`` brings back the
old answer; an unchanged dump parses and embeds nothing; a dump whose published sha1 is wrong publishes nothing.

The champion's generator is the real default one (SmolLM2-135M-Instruct, the ``real_generator`` fixture: fetched
once per run as ``wikirag models fetch`` does). The countries are fictional, and so is the capital every article
names in the older dump (Oldtown): the model has no prior of its own, so its answer is the retrieved passage's fact.
The test checks both the answer and that passage.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from cli.wikirag import main
from rag_core.index.versions import latest_version, list_versions, read_index_manifest
from rag_core.storage import Store
from runtime.process_groups import stop_process_group
from tests.conftest import S3Server
from tests.helpers.dumpsite import COUNTRIES, EDITED, NEW, OLD, OLD_CAPITAL, RUNNING, serve_site
from tests.helpers.mlflow_server import mlflow_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EDITED_PAGE = 17
QUESTION = f"What is the capital of {COUNTRIES[EDITED_PAGE]}?"


def _deploy(env: dict[str, str]) -> None:
    """prefect.yaml's rebuild and refresh deployments as it declares them (work pool and triggers included)."""
    done = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", "index-rebuild-enwiki",
                           "--name", "refresh"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _runs(client, deployment_id) -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def _refresh_of(client, deployment_id, version: str, timeout: float = 240):
    """The refresh run the publish of ``version`` triggered, once it is final."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [r for r in _runs(client, deployment_id) if r.parameters.get("index_version") == version]
        if runs and runs[0].state.is_final():
            return runs[0]
        time.sleep(2)
    raise AssertionError(f"no finished refresh run for {version} in {timeout:.0f} s")


def _rebuild(client, site_config: dict, embed: dict, wiki: str = "enwiki"):
    from prefect.deployments import run_deployment

    return run_deployment("index_rebuild-deployment/index-rebuild-enwiki", timeout=400, poll_interval=2,
                          parameters={"dump_site": {**site_config, "wiki": wiki}, "embed": embed,
                                      "index": {"factory": "Flat"}})


def _ask(capsys: pytest.CaptureFixture) -> tuple[dict, str]:
    """The champion's answer to QUESTION, and the text of the passage it ranked first."""
    assert main(["ask", QUESTION, "--model", "models:/wikirag-cloze@champion", "--json"]) == 0
    item = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return item, item["provenance"][0]["passage_id"]


@pytest.fixture
def mlflow_url(tmp_path: Path):
    with mlflow_server(tmp_path / "mlflow") as url:
        yield url


def test_a_new_dump_reaches_the_champion_through_the_deployments_and_rollback_restores_it(
        prefect_server: str, s3_server: S3Server, real_generator: Path, mlflow_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    from rag_core.index.encoders import EncoderConfig, packaged_model_path
    from rag_core.model.generators import GeneratorConfig
    from rag_core.model.rag_model import RagConfig, RagModel
    from rag_core.model.retriever import IndexRetriever
    from rag_core.train.examples import Example, Provenance, write_examples
    from rag_core.wiki.ingest import read_passages
    from tests.helpers.refreshfiles import register_champion

    store_url = f"s3://{s3_server.bucket}/fresh-{uuid.uuid4().hex[:8]}"
    store = Store(store_url, s3_server.options())
    tracking = mlflow_url
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WIKIRAG_", "MLFLOW_TRACKING"))},
           **s3_server.env(), "PREFECT_API_URL": prefect_server, "WIKIRAG_HOME": str(tmp_path / "home"),
           "WIKIRAG_STORE": store_url, "MLFLOW_TRACKING_URI": tracking, "WIKIRAG_REPO": str(ROOT),
           "WIKIRAG_WORKERS": "1", "PYTHONPATH": str(ROOT)}
    for key in ("WIKIRAG_HOME", "WIKIRAG_STORE", "MLFLOW_TRACKING_URI", *s3_server.env()):
        monkeypatch.setenv(key, env[key])
    embed = {"encoder": EncoderConfig(path=str(packaged_model_path()), dtype="float32").model_dump(), "shards": 1}

    with serve_site(tmp_path / "site") as site, get_client(sync_client=True) as client:
        held = tmp_path / "held"
        (site.root / "enwiki" / NEW).rename(held)  # only the older dump is out yet
        site_config = {"site": site.url, "connections": 2, "piece_bytes": 16 << 10, "backoff_s": 0.05}
        pool = yaml.safe_load((ROOT / "prefect.yaml").read_text())["definitions"]["work_pools"]["process"]["name"]
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"), overwrite=True)
        _deploy(env)
        rebuild_id = client.read_deployment_by_name("index_rebuild-deployment/index-rebuild-enwiki").id
        refresh_id = client.read_deployment_by_name("refresh-deployment/refresh").id
        log = (tmp_path / "worker.log").open("wb")
        worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool,
                                   "--type", "process"], env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            # the older dump: mirrored, built, published; its refresh finds no champion yet
            first = _rebuild(client, site_config, embed)
            assert first.state.is_completed(), (tmp_path / "worker.log").read_text()[-5000:]
            old = latest_version(store)
            assert read_index_manifest(store, old).dump["url"].endswith(f"/dumps/enwiki/{OLD}/"
                                                                         f"enwiki-{OLD}-pages-articles-multistream.xml.bz2")
            assert _refresh_of(client, refresh_id, old).state.is_completed()

            # the champion: a RAG model (the index's MiniLM question encoder, the real generator) bound to it; its
            # dev set asks some articles' capital, the gold their first passage (three of them the next dump edits)
            old_dump = read_index_manifest(store, old).dump_id
            firsts = [r for r in read_passages(store, old_dump).to_pylist() if r["chunk"] == 0]
            dev = [Example(id=f"capital-{r['page_id']}", input=f"What is the capital of {r['title']}?",
                           targets=(OLD_CAPITAL,), kind="cloze",
                           provenance=(Provenance(title=r["title"], passage_id=r["passage_id"]),))
                   for r in firsts if r["title"] in COUNTRIES.values() or r["page_id"] % 20 == 0]
            dev_url = write_examples(dev, str(tmp_path / "dev.jsonl"))
            config = RagConfig(n_docs=2, question_encoder=EncoderConfig(path=str(packaged_model_path()),
                                                                        dtype="float32"),
                               generator=GeneratorConfig(path=str(real_generator), dtype="auto"))
            model_dir = RagModel.create(config, IndexRetriever.load(store, old)).save_pretrained(tmp_path / "rag")
            assert register_champion(tracking, store, model_dir, dev_url, len(dev), old) == "1"
            assert list((tmp_path / "mlflow" / "artifacts").rglob("MLmodel"))  # logged through the server's proxy
            # dtype auto: refresh and ask only decode, so rag_core.perf.precision's inference rule applies (bf16 where
            # it is native and faster, halving the saved copies); the registry holds its own copy of the folder
            shutil.rmtree(model_dir)
            asked, passage = _ask(capsys)
            assert asked["provenance"][0]["title"] == COUNTRIES[EDITED_PAGE]
            texts = dict(zip(*read_passages(store, old_dump, ["passage_id", "text"]).to_pydict().values()))
            assert f"The capital is {OLD_CAPITAL}." in texts[passage] and OLD_CAPITAL in asked["answer"], asked

            # a new dated dump appears: the deployment mirrors, verifies, rebuilds and publishes; the event
            # triggers refresh, which re-binds the champion
            held.rename(site.root / "enwiki" / NEW)
            second = _rebuild(client, site_config, embed)
            assert second.state.is_completed(), (tmp_path / "worker.log").read_text()[-5000:]
            new = latest_version(store)
            new_dump = read_index_manifest(store, new).dump_id
            assert new != old and NEW in read_index_manifest(store, new).dump["url"]
            refreshed = _refresh_of(client, refresh_id, new)
            assert refreshed.state.is_completed(), (tmp_path / "worker.log").read_text()[-5000:]
            from mlflow import MlflowClient

            champion = MlflowClient(tracking_uri=tracking).get_model_version_by_alias("wikirag-cloze", "champion")
            assert (str(champion.version), champion.tags["index_version"]) == ("2", new)

            asked, passage = _ask(capsys)  # the same registered name, the new knowledge
            texts = dict(zip(*read_passages(store, new_dump, ["passage_id", "text"]).to_pydict().values()))
            assert asked["provenance"][0]["title"] == COUNTRIES[EDITED_PAGE]
            assert f"The capital is {EDITED[EDITED_PAGE]}." in texts[passage] and OLD_CAPITAL not in texts[passage]
            assert EDITED[EDITED_PAGE] in asked["answer"] and OLD_CAPITAL not in asked["answer"], asked

            assert main(["models", "rollback", "wikirag-cloze"]) == 0
            capsys.readouterr()
            asked, passage = _ask(capsys)
            old_texts = dict(zip(*read_passages(store, old_dump, ["passage_id", "text"]).to_pydict().values()))
            assert f"The capital is {OLD_CAPITAL}." in old_texts[passage]
            assert OLD_CAPITAL in asked["answer"] and EDITED[EDITED_PAGE] not in asked["answer"], asked

            # the same dump again: one request to the site, no parsing, no embedding, nothing published
            shutil.rmtree(site.root / "enwiki" / RUNNING)  # no run in progress either: exactly one request
            # published names only (a "_" name is staging or reports): an emptied passages/_staging was listed before
            # this no-op run and gone after it in one CI run on SeaweedFS
            def published() -> dict[str, list[str]]:
                return {d: [n for n in store.list(d) if not n.startswith("_")] for d in ("passages", "embeddings",
                                                                                          "indexes")}

            listed = published()
            asked_before = len(site.log)
            third = _rebuild(client, site_config, embed)
            assert third.state.is_completed()
            assert [r.path for r in site.log[asked_before:]] == ["/enwiki/"]
            children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[third.id])))
            assert [client.read_flow(r.flow_id).name for r in children] == ["mirror_dump"]
            assert published() == listed and latest_version(store) == new

            # a dump whose published sha1 is wrong: the run fails, nothing is kept or published, no refresh runs
            refreshes = len(_runs(client, refresh_id))
            fourth = _rebuild(client, site_config, embed, wiki="dewiki")
            assert fourth.state.is_failed()
            assert "sha1" in (tmp_path / "worker.log").read_text()
            assert list_versions(store) == [old, new] and latest_version(store) == new
            assert not store.exists("dumps", "dewiki", OLD, f"dewiki-{OLD}-pages-articles-multistream.xml.bz2")
            time.sleep(5)  # a triggered run would be created within a second or two of the event
            assert len(_runs(client, refresh_id)) == refreshes
        finally:
            stop_process_group(worker.pid)  # its own session: the worker and the flow runs it started
            log.close()
            for deployment_id in (rebuild_id, refresh_id):  # the session's server serves other tests' publishes
                client.delete_resource_owned_automations(f"prefect.deployment.{deployment_id}")
                client.delete_deployment(deployment_id)
