"""Prefect tasks of a refresh: a registered champion re-evaluated against a newer index version, with no retraining,
and re-bound to it when its own dev metric holds.

The champion's dev set is the one of the run that registered it (its ``wikirag.dev`` tag, the
first ``max_dev_examples`` questions as that run evaluated). Questions whose gold passage
changed between the two index versions (rag_core.evaluate.gold_passages) are left out of the
comparison and reported apart with the champion's answer on each version; the rest are scored
on the version the champion is bound to and on the new one. When the new score is no more than
``tolerance`` points (hundredths of the metric) below the bound one, the same model is logged
again bound to the new version and registered, pinned first, as the new champion
(tasks.adapters.mlflow_registry.register_rebound); otherwise the binding stays, and the run
records why. Either way one MLflow run of experiment ``wikirag-<task>`` holds both evaluations
(``bound_*`` and ``new_*`` metrics, predictions), the decision and ``refresh.json``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from rag_core.errors import WikiragError
from rag_core.evaluate.change_report import AnswerChange, answer_changes
from rag_core.evaluate.gold_passages import GoldDiff, gold_diff, named_pages, page_texts
from rag_core.evaluate.predictions import Evaluation
from rag_core.evaluate.refresh_policy import TOLERANCE_POINTS
from rag_core.index.version_names import version_created_at
from rag_core.index.versions import read_index_manifest
from rag_core.storage import Store
from rag_core.train.examples import Example
from tasks.adapters.mlflow_registry import CHAMPION, Promotion, log_rag_model, register_rebound
from tasks.adapters.mlflow_tracking import MlflowRunLogger, check_reachable
from tasks.retry_policy import retry_unless_bad_input



class RefreshError(WikiragError):
    """A refresh asked of something the registry does not hold."""


class Champion(BaseModel):
    """A registered model's champion version and what a refresh needs to evaluate it again."""

    name: str
    version: str
    task_kind: str
    index_version: str  # the version it is bound to
    store: str  # the store its index is on (the version's ``store`` tag)
    metric: str  # its headline dev metric (the version's ``dev_metric`` tag)
    dev: str | None  # the dev file of the run that registered it
    max_examples: int | None  # how many dev questions that run evaluated (all when None)


class ChangedQuestion(BaseModel):
    """A dev question whose gold passage changed: its gold, both texts and the champion's answer on each version."""

    id: str
    question: str
    targets: list[str]
    gold: str
    old_passage: str | None
    new_passage: str | None
    old_answer: str = ""
    new_answer: str = ""


class RefreshDecision(BaseModel):
    """What a refresh measured for one champion and decided."""

    name: str
    version: str  # the champion evaluated
    bound_index: str
    new_index: str
    metric: str
    tolerance: float
    rebound: bool
    reason: str
    bound_value: float | None = None
    new_value: float | None = None
    compared: int = 0  # dev questions scored on both versions
    unidentified: int = 0  # of those, questions that name no gold passage or page
    changed: list[ChangedQuestion] = Field(default_factory=list)
    answers: list[AnswerChange] = Field(default_factory=list)  # dev questions answered differently on new_index
    new_version: str | None = None  # the version registered bound to the new index
    run_id: str | None = None


@task(retries=1, retry_delay_seconds=5)
def champions(tracking_uri: str, model: str | None = None) -> list[Champion]:
    """The champion of every registered ``wikirag-*`` model, or of ``model`` alone (refused when it has none)."""
    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    names = [model] if model else sorted(m.name for m in client.search_registered_models()
                                         if m.name.startswith("wikirag-"))
    out = []
    for name in names:
        try:
            version = client.get_model_version_by_alias(name, CHAMPION)
        except MlflowException:
            if model:
                raise RefreshError(f"{name}: no {CHAMPION} in MLflow at {tracking_uri}; check the name "
                                   "(registered models are wikirag-<task>) or register one") from None
            continue
        run = client.get_run(version.run_id) if version.run_id else None
        tags, params = (run.data.tags, run.data.params) if run else ({}, {})
        limit = params.get("max_dev_examples")
        out.append(Champion(name=name, version=str(version.version),
                            task_kind=tags.get("wikirag.task", name.removeprefix("wikirag-")),
                            index_version=version.tags["index_version"], store=version.tags["store"],
                            metric=version.tags.get("dev_metric", ""), dev=tags.get("wikirag.dev"),
                            max_examples=int(limit) if limit and limit.isdigit() else None))
    return out


@task(retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_bad_input)
def compare_gold(store: Store, bound_index: str, new_index: str, examples: list[Example]) -> GoldDiff:
    """The dev questions split by whether their gold passage reads the same in both index versions' passages."""
    pages, titles = named_pages(examples)
    old, new = (page_texts(store, read_index_manifest(store, v).dump_id, pages, titles)
                for v in (bound_index, new_index))
    return gold_diff(examples, old, new)


def skip_reason(champion: Champion, new_index: str) -> str | None:
    """Why ``champion`` is not evaluated at all, or None."""
    if champion.index_version == new_index:
        return f"already bound to {new_index}"
    bound_at, new_at = version_created_at(champion.index_version), version_created_at(new_index)
    if bound_at and new_at and new_at < bound_at:  # an event of an older build, delivered late: never move back
        return f"bound to {champion.index_version}, newer than {new_index}; kept"
    if champion.dev is None:
        return f"no dev set recorded (no wikirag.dev tag on the run of v{champion.version}); kept on " \
               f"{champion.index_version}: register it with wikirag finetune"
    return None


def score_of(evaluation: Evaluation, metric: str) -> tuple[str, float]:
    """(name, value) of ``metric`` in ``evaluation`` (a ``dev_``/``test_`` prefix dropped), else its headline."""
    for name in (metric, metric.removeprefix("dev_").removeprefix("test_")):
        if name in evaluation.scores:
            return name, evaluation.scores[name]
    return evaluation.headline


def decide(metric: str, bound: float, new: float, tolerance: float, bound_index: str, new_index: str,
           compared: int) -> tuple[bool, str]:
    """(re-bind?, why): the new score may be at most ``tolerance`` points (hundredths) below the bound one."""
    if compared == 0:
        return False, (f"no dev question with an unchanged gold passage to compare; kept on {bound_index} "
                       "(check the champion's dev set)")
    drop = round((bound - new) * 100, 6)
    numbers = f"{metric} {new:.4f} on {new_index} vs {bound:.4f} on {bound_index} ({compared} questions)"
    if drop <= tolerance:
        return True, f"{numbers}: within {tolerance:g} points: re-bound to {new_index}"
    return False, f"{numbers}: {drop:.2f} points worse, beyond the tolerance of {tolerance:g}: kept on {bound_index}"


def changed_questions(diff: GoldDiff, old: Evaluation | None, new: Evaluation | None) -> list[ChangedQuestion]:
    """The changed questions with the champion's answers on the bound (``old``) and the new version."""
    answers = {name: {r["id"]: r["prediction"] for r in e.predictions} if e else {}
               for name, e in (("old", old), ("new", new))}
    return [ChangedQuestion(id=c.example_id, question=c.question, targets=list(c.targets), gold=c.gold,
                            old_passage=c.old_text, new_passage=c.new_text,
                            old_answer=answers["old"].get(c.example_id, ""),
                            new_answer=answers["new"].get(c.example_id, "")) for c in diff.changed]


def changed_answers(diff: GoldDiff, bound: Evaluation | None, new: Evaluation | None, old_left_out: Evaluation | None,
                    new_left_out: Evaluation | None) -> list[AnswerChange]:
    """Every dev question the champion answers differently on the new version: those compared (``bound`` vs
    ``new``) and those whose gold passage changed (``old_left_out`` vs ``new_left_out``)."""
    examples = [*diff.kept, *diff.left_out]
    questions, targets = {e.id: e.input for e in examples}, {e.id: e.targets for e in examples}
    out = []
    for before, after, gold in ((bound, new, ()), (old_left_out, new_left_out, [c.example_id for c in diff.changed])):
        if before is not None and after is not None:
            out += answer_changes(before.predictions, after.predictions, questions, targets, gold)
    return out


@task
def record_refresh(tracking_uri: str, run_id: str, decision: RefreshDecision) -> None:
    """The decision's numbers as metrics, its reason as the run's ``refresh`` tag, the whole as ``refresh.json``."""
    logger = MlflowRunLogger.open(tracking_uri, run_id)
    logger.log_metrics({"refresh_rebound": float(decision.rebound), "refresh_compared": decision.compared,
                        "refresh_changed_gold": len(decision.changed),
                        "refresh_unidentified_gold": decision.unidentified,
                        "refresh_answers_changed": len(decision.answers),
                        "refresh_tolerance_points": decision.tolerance})
    logger.set_tags({"refresh": decision.reason, "refresh.rebound": str(decision.rebound).lower()})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "refresh.json"
        path.write_text(json.dumps(decision.model_dump(), indent=1))
        logger.log_artifact(path)
    get_run_logger().info("%s v%s: %s", decision.name, decision.version, decision.reason)


@task(cache_policy=NO_CACHE)  # a model is no cache key: Prefect would warn on every call
def rebind(tracking_uri: str, run_id: str, model: Any, champion: Champion, store: Store, new_index: str,
           metric: str, value: float, reason: str) -> Promotion:
    """Log ``model`` (the champion, retrieving from ``new_index``) bound to ``new_index`` into run ``run_id`` and
    register it, pinned first, as ``champion.name``'s new champion."""
    with tempfile.TemporaryDirectory(prefix="wikirag-refresh-") as folder:
        model.save_pretrained(folder)
        uri = log_rag_model(tracking_uri, run_id, folder, store_url=store.url, index_version=new_index)
    return register_rebound(tracking_uri, uri, champion.name, run_id=run_id, metric=metric, value=value,
                            store=store, index_version=new_index, source_version=champion.version, reason=reason)
