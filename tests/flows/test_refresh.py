"""The ``refresh`` flow on real components: a champion registered against one index version (a real SQLite MLflow
store, real FAISS versions of real passages from two dumps differing in one fact, a tiny real model) refreshed
onto the newer version in a real Prefect flow run; rollback; a refusal beyond the tolerance; and the
``wikirag.index.published`` event reaching a real Prefect server and triggering the ``refresh`` deployment."""

from __future__ import annotations

import json
import time
from pathlib import Path
from uuid import UUID

import pytest
import yaml
from mlflow import MlflowClient

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from rag_core.index.retention import version_pins
from rag_core.wiki.ingest import read_passages
from runtime.settings import StoreAccess
from tasks.adapters.mlflow_registry import CHAMPION, PREVIOUS_TAG, REFRESHED_FROM_TAG, model_name, pin_name, rollback
from tasks.change_reports import EXPERIMENT, artifact_key
from tasks.evaluation import load_registered_model
from tasks.index_events import INDEX_PUBLISHED, announce_published
from tests.helpers.refreshfiles import NEW_FACT, register_trained, two_versions

ROOT = Path(__file__).resolve().parents[2]
# The refresh deployment's trigger, as prefect.yaml declares it (`prefect deploy` validates and creates it the same way)
TRIGGERS = yaml.safe_load("""
triggers:
  - type: event
    enabled: true
    match:
      prefect.resource.id: wikirag.index.*
    expect:
      - wikirag.index.published
    parameters:
      index_version: "{{ event.payload.version }}"
""")["triggers"]


@pytest.mark.slow
def test_refresh_rebinds_within_tolerance_rollback_restores_and_beyond_tolerance_keeps_the_binding(
        wiki: Path, tmp_path: Path, prefect_server: str) -> None:
    from flows.refresh import refresh

    versions = two_versions(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, name = MlflowClient(tracking_uri=uri), model_name("cloze")
    assert register_trained(uri, versions, versions.old, 0.0) == "1"
    store = StoreAccess(url=versions.store.url)

    [decision] = refresh(uri, store, tolerance=100.0)  # LATEST: the newer version
    assert decision.rebound and (decision.version, decision.new_version) == ("1", "2")
    assert (decision.bound_index, decision.new_index, decision.metric) == (versions.old, versions.new, "em")
    assert decision.compared == len(versions.dev) - 1 and decision.unidentified == 0
    [changed] = decision.changed  # the question whose fact the new dump edited, set apart with both answers
    assert changed.id == versions.dev[0].id and changed.gold == versions.dev[0].provenance[0].passage_id
    assert versions.fact in changed.old_passage and NEW_FACT in changed.new_passage
    assert isinstance(changed.old_answer, str) and isinstance(changed.new_answer, str)

    champion = client.get_model_version_by_alias(name, CHAMPION)
    assert str(champion.version) == "2"
    tags = champion.tags
    assert (tags["index_version"], tags[REFRESHED_FROM_TAG], tags[PREVIOUS_TAG]) == (versions.new, "1", "1")
    assert tags["index_pin"] == pin_name(name, "2") and float(tags["dev_metric_value"]) == decision.new_value
    assert [p for p in version_pins(versions.store, versions.new) if p.startswith("mlflow:")] == [pin_name(name, "2")]
    assert pin_name(name, "1") in version_pins(versions.store, versions.old)
    assert load_registered_model(f"models:/{name}@{CHAMPION}", uri).index_version == versions.new  # its binding
    run = client.get_run(decision.run_id)
    assert champion.run_id == decision.run_id and run.data.tags["wikirag.dev"] == versions.dev_url
    assert run.data.metrics["bound_em"] == decision.bound_value and run.data.metrics["new_em"] == decision.new_value
    assert run.data.metrics["refresh_rebound"] == 1 and run.data.metrics["refresh_changed_gold"] == 1
    assert run.data.tags["refresh"] == decision.reason and "re-bound to" in decision.reason
    recorded = json.loads(Path(client.download_artifacts(decision.run_id, "refresh.json", str(tmp_path))).read_text())
    assert recorded["changed"][0]["new_passage"] == changed.new_passage and recorded["rebound"] is True

    # the change report: the edited page, the one passage encoded again, the changed question's answers
    changes = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id],
                                 f"tags.`wikirag.index_version` = '{versions.new}'")
    assert len(changes) == 1 and changes[0].data.tags[f"refresh_run.{name}"] == decision.run_id
    counts = changes[0].data.metrics
    edited_title = versions.dev[0].provenance[0].title
    old_texts = {r["text"] for r in read_passages(versions.store, "d1").to_pylist()}
    fresh = [r for r in read_passages(versions.store, "d2").to_pylist() if r["text"] not in old_texts]
    assert (counts["pages_added"], counts["pages_changed"], counts["pages_removed"]) == (0, 1, 0)
    assert (counts["passages_encoded"], counts["passages_reused"]) == (len(fresh), counts["passages"] - len(fresh))
    assert counts["dev_gold_changed"] == 1 and counts["dev_answers_changed"] == len(decision.answers)
    report = json.loads(Path(client.download_artifacts(changes[0].info.run_id, "change_report.json",
                                                       str(tmp_path / "report"))).read_text())
    assert report["pages"]["changed"] == [edited_title] and report["previous"] == versions.old
    [model] = report["models"]
    assert model["changed_gold"] == [changed.id] and model["rebound"] is True
    assert all(a["old_answer"] != a["new_answer"] for a in model["answers"])
    assert {a["id"] for a in model["answers"] if a["gold_changed"]} <= {changed.id}
    with get_client(sync_client=True) as prefect:
        [artifact] = prefect.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[artifact_key(versions.new)])))
    assert f"Changed: {edited_title}." in artifact.data and "| 0 | 1 | 0 |" in artifact.data

    done = rollback(uri, name, lambda url: versions.store)
    assert (done.from_version, done.to_version) == ("2", "1")
    assert load_registered_model(f"models:/{name}@{CHAMPION}", uri).index_version == versions.old

    # the same questions score the same (deterministic model): a tolerance one point short of the drop refuses
    drop = round((decision.bound_value - decision.new_value) * 100, 6)
    [refused] = refresh(uri, store, model=name, tolerance=drop - 1, index_version=versions.new)
    assert not refused.rebound and refused.new_version is None
    assert (refused.bound_value, refused.new_value) == (decision.bound_value, decision.new_value)
    assert "beyond the tolerance" in refused.reason and f"kept on {versions.old}" in refused.reason
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == "1"
    assert len(client.search_model_versions(f"name='{name}'")) == 2  # nothing registered
    assert [p for p in version_pins(versions.store, versions.new) if p.startswith("mlflow:")] == [pin_name(name, "2")]
    kept = client.get_run(refused.run_id)
    assert kept.data.tags["refresh"] == refused.reason and kept.data.metrics["refresh_rebound"] == 0
    assert kept.data.metrics["new_em"] == refused.new_value


@pytest.mark.slow
def test_a_published_event_reaches_the_server_and_triggers_the_refresh_deployment(prefect_server: str) -> None:
    from prefect import flow
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.events import DeploymentTriggerTypes
    from prefect.events.filters import EventFilter, EventIDFilter, EventNameFilter
    from pydantic import TypeAdapter

    from flows.refresh import deployed_refresh

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    declared = next((d for d in spec["deployments"] if d["name"] == "refresh"), None)
    if declared is not None:  # once prefect.yaml declares it, the deployment uses exactly this trigger
        assert declared["triggers"] == TRIGGERS and declared["entrypoint"] == "flows/refresh.py:deployed_refresh"
    triggers = [TypeAdapter(DeploymentTriggerTypes).validate_python(dict(t)) for t in TRIGGERS]
    deployment_id = deployed_refresh.to_deployment(name="refresh-under-test", triggers=triggers).apply()
    version = "20991231T000000.000Z-0e0e0e0e"

    @flow(name="publishing")
    def publishing() -> str | None:
        return announce_published(version, "file:///store", "d2")

    try:
        event_id = publishing()
        assert event_id is not None
        with get_client(sync_client=True) as client:
            deadline, found, runs = time.monotonic() + 90, [], []
            while time.monotonic() < deadline and not (found and runs):
                found = client.read_events(EventFilter(event=EventNameFilter(name=[INDEX_PUBLISHED]),
                                                       id=EventIDFilter(id=[UUID(event_id)])), limit=50).events
                runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
                    id=DeploymentFilterId(any_=[deployment_id])))
                time.sleep(1)
            assert [e.payload for e in found] == [{"version": version, "store": "file:///store", "dump_id": "d2"}]
            assert found[0].resource.id == f"wikirag.index.{version}"
            assert [r.parameters.get("index_version") for r in runs] == [version]  # the trigger ran the deployment
    finally:
        with get_client(sync_client=True) as client:  # the session's server serves other tests' publishes too
            client.delete_resource_owned_automations(f"prefect.deployment.{deployment_id}")
            client.delete_deployment(deployment_id)
