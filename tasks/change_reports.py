"""The change report of a newly published index version, as a Prefect artifact and an MLflow run.

The numbers are rag_core.evaluate.change_report's; the refresh flow (flows/refresh.py) adds each
champion's part and publishes it: a markdown artifact keyed ``change-report-<version>`` and one run
of experiment ``wikirag-index-changes`` per version (metrics, ``change_report.json``,
``change_report.md``, tagged with the version and each champion's refresh run).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from rag_core.evaluate.change_report import ChangeReport, ModelChanges, previous_version, to_markdown, version_changes
from rag_core.index.versions import list_versions
from rag_core.storage import Store
from tasks.adapters.mlflow_tracking import tracked_run
from tasks.refresh import RefreshDecision
from tasks.retry_policy import retry_unless_bad_input

EXPERIMENT = "wikirag-index-changes"


def artifact_key(version: str) -> str:
    """``change-report-<version>`` in the characters Prefect accepts in a key (lowercase, digits, dashes)."""
    return "change-report-" + re.sub(r"[^a-z0-9-]+", "-", version.lower()).strip("-")


@task(retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_bad_input)
def version_report(store: Store, version: str) -> ChangeReport:
    """Pages and passages of ``version`` against the version published before it on ``store``."""
    return version_changes(store, version, previous_version(list_versions(store), version))


def model_changes(decision: RefreshDecision) -> ModelChanges:
    """A champion's part of the report, from its refresh decision."""
    return ModelChanges(name=decision.name, version=decision.version, bound_index=decision.bound_index,
                        rebound=decision.rebound, reason=decision.reason,
                        changed_gold=[c.id for c in decision.changed], answers=decision.answers)


@task
def publish_change_report(tracking_uri: str, report: ChangeReport, decisions: list[RefreshDecision]) -> str:
    """The report with each champion's part: a Prefect markdown artifact and an MLflow run; returns the run's id."""
    report = report.model_copy(update={"models": [model_changes(d) for d in decisions]})
    markdown = to_markdown(report)
    create_markdown_artifact(markdown, key=artifact_key(report.version),
                             description=f"What index version {report.version} changed")
    tags = {"wikirag.index_version": report.version, "wikirag.previous_index_version": str(report.previous),
            **{f"refresh_run.{d.name}": d.run_id for d in decisions if d.run_id}}
    with tracked_run(tracking_uri, EXPERIMENT, f"changes in {report.version}", tags) as run:
        run.log_metrics(report.metrics())
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in (("change_report.json", report.model_dump_json(indent=1)),
                               ("change_report.md", markdown)):
                (Path(tmp) / name).write_text(text)
                run.log_artifact(Path(tmp) / name)
        get_run_logger().info("%s: %d pages added, %d changed, %d removed; %d passages encoded, %d reused",
                              report.version, len(report.pages.added), len(report.pages.changed),
                              len(report.pages.removed), report.encoded, report.reused)
        return run.run_id
