"""The ``refresh`` flow: every registered champion re-evaluated against a newly published index version and re-bound
to it within a tolerance of its own metric, with no retraining (tasks/refresh.py).

index version (LATEST by default) -> each ``wikirag-*`` champion (or the one named) -> its dev
questions, those whose gold passage changed set apart -> the champion scored on the rest against
the version it is bound to and against the new one -> within ``tolerance`` points: a new version
bound to the new index, pinned, becomes champion; otherwise the binding stays -> both scores, the
changed questions and the decision in one MLflow run. The version's change report (pages added, changed and
removed, passages re-embedded vs reused, each champion's changed gold passages and answers:
tasks/change_reports.py) becomes a Prefect artifact and an MLflow run of its own. The ``refresh`` deployment
runs it when the index-rebuild flow announces a publish (the ``wikirag.index.published`` event,
tasks/index_events.py).
"""

from __future__ import annotations

from prefect import flow, task

from flows.evaluate import finish_run, load_model
from rag_core.index.version_names import IndexVersionError
from rag_core.index.versions import latest_version
from runtime.process_tuning import start_process
from runtime.settings import Settings, StoreAccess, quiet_environment
from tasks.adapters.mlflow_tracking import MlflowRunLogger, closing_run, open_run
from tasks.change_reports import publish_change_report, version_report
from tasks.dataset_quality import gate_predictions
from tasks.evaluation import evaluate, load_examples, record_evaluation
from tasks.refresh import (
    TOLERANCE_POINTS,
    Champion,
    RefreshDecision,
    champions,
    changed_answers,
    changed_questions,
    compare_gold,
    decide,
    rebind,
    record_refresh,
    score_of,
    skip_reason,
)

quiet_environment()


@task
def new_index_version(store: StoreAccess, index_version: str | None) -> str:
    """``index_version``, or the one LATEST names."""
    found = index_version or latest_version(store.store())
    if found is None:
        raise IndexVersionError(f"{store.url}: no index has been published here; publish one (wikirag index-rebuild) "
                                "or name a version")
    return found


@task
def start_run(tracking_uri: str, champion: Champion, new_index: str) -> str:
    """The refresh's MLflow run, tagged so that a later refresh of the version it may register finds its dev set."""
    tags = {"wikirag.task": champion.task_kind, "wikirag.dev": str(champion.dev), "wikirag.index_version": new_index,
            "model_uri": f"models:/{champion.name}/{champion.version}", "trained_index_version": champion.index_version}
    run_id = open_run(tracking_uri, champion.name, f"refresh onto index {new_index}", tags)
    if champion.max_examples is not None:
        MlflowRunLogger.open(tracking_uri, run_id).log_params({"max_dev_examples": champion.max_examples})
    return run_id


@flow(name="refresh-model", validate_parameters=True)
def refresh_model(champion: Champion, new_index: str, tolerance: float, tracking_uri: str,
                  store: StoreAccess) -> RefreshDecision:
    """One champion: evaluated on both versions, re-bound or kept (module docstring)."""
    decision = RefreshDecision(name=champion.name, version=champion.version, bound_index=champion.index_version,
                               new_index=new_index, metric=champion.metric, tolerance=tolerance, rebound=False,
                               reason="")
    if champion.store != store.url:
        return decision.model_copy(update={"reason": f"bound to an index on {champion.store}, not on {store.url}; "
                                                     "kept: refresh it against its own store"})
    if (why := skip_reason(champion, new_index)) is not None:
        return decision.model_copy(update={"reason": why})
    target = store.store()
    examples = load_examples(champion.task_kind, champion.dev, store.options(champion.dev))[:champion.max_examples]
    diff = compare_gold(target, champion.index_version, new_index, examples)
    model_uri = f"models:/{champion.name}/{champion.version}"
    bound_model = load_model(model_uri, tracking_uri, None)
    new_model = load_model(model_uri, tracking_uri, new_index)
    run_id = start_run(tracking_uri, champion, new_index)
    with closing_run(tracking_uri, run_id, finish_run):
        old_answers = evaluate(bound_model, diff.left_out) if diff.left_out else None
        new_answers = evaluate(new_model, diff.left_out) if diff.left_out else None
        decision.changed = changed_questions(diff, old_answers, new_answers)
        decision.compared, decision.unidentified, decision.run_id = len(diff.kept), len(diff.unidentified), run_id
        bound = new = None
        if diff.kept:
            bound = evaluate(bound_model, diff.kept)
            new = evaluate(new_model, diff.kept)
            gate_predictions(champion.task_kind, diff.kept, new.predictions)
            record_evaluation(tracking_uri, run_id, bound, prefix="bound")
            record_evaluation(tracking_uri, run_id, new, prefix="new")
            decision.metric, decision.bound_value = score_of(bound, champion.metric)
            decision.new_value = score_of(new, champion.metric)[1]
        decision.answers = changed_answers(diff, bound, new, old_answers, new_answers)
        decision.rebound, decision.reason = decide(decision.metric, decision.bound_value or 0.0,
                                                   decision.new_value or 0.0, tolerance, champion.index_version,
                                                   new_index, len(diff.kept))
        if decision.rebound:
            decision.new_version = rebind(tracking_uri, run_id, new_model, champion, target, new_index,
                                          decision.metric, decision.new_value, decision.reason).version
        record_refresh(tracking_uri, run_id, decision)
    return decision


@flow(name="refresh", validate_parameters=True)
def refresh(tracking_uri: str, store: StoreAccess, model: str | None = None, tolerance: float = TOLERANCE_POINTS,
            index_version: str | None = None) -> list[RefreshDecision]:
    """Each registered champion (or ``model``'s) against ``index_version`` (default LATEST); one decision each."""
    new_index = new_index_version(store, index_version)
    report = version_report(store.store(), new_index)
    decisions = [refresh_model(c, new_index, tolerance, tracking_uri, store) for c in champions(tracking_uri, model)]
    publish_change_report(tracking_uri, report, decisions)
    return decisions


@flow(name="refresh-deployment", validate_parameters=True)
def deployed_refresh(model: str | None = None, tolerance: float = TOLERANCE_POINTS,
                     index_version: str | None = None) -> list[RefreshDecision]:
    """The deployment's entry point (triggered by ``wikirag.index.published``): the worker's settings, read once."""
    settings = Settings()
    start_process(settings)  # the deployment's process: the same switches as a command's
    return refresh(settings.tracking_uri, settings.store_access(), model, tolerance, index_version)
