"""The main job's gate on real questions: ``wikirag-qa`` is promoted only if it beats its zero-shot start by more
than chance.

The held-out questions (rag_core.evaluate.real_questions: the project's written questions, plus
NQ-open, WebQuestions and CuratedTrec questions answerable from the index when their folder is
given) are written to the store as a dev and a test file, which the generated-QA stage is
filtered against. On the test split, the fine-tuned model, the same generator and index before
fine-tuning (zero-shot) and that generator alone (closed-book) are scored: EM, token F1 and
answer-in-output. The fine-tuned model is then registered as ``wikirag-qa`` with its test EM, and
becomes champion only when that beats the zero-shot EM by more than chance (tasks.adapters.mlflow_registry.gate):
the test questions it answers exactly and its start does not, against the reverse, must be a split that two
equally good models give less than 5% of the time (rag_core.evaluate.paired). On a few dozen questions a
point or two comes and goes with a bf16 rounding or a host's kernels; consumers loading @champion should get a
model that is better, not one that was lucky. A model gated before on the same test questions, settings and
rule (:data:`RULE`) is not evaluated or registered again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from rag_core.evaluate.metrics import exact_match
from rag_core.evaluate.paired import beyond_chance, gained_lost, sign_test
from rag_core.evaluate.real_questions import SPLITS, answer_in_output, real_questions
from rag_core.index.versions import read_index_manifest
from rag_core.storage import Store
from rag_core.train.loaders import load_task
from rag_core.wiki.ingest import read_passages
from tasks.adapters.mlflow_registry import CHAMPION, alias_now, model_name, register
from tasks.adapters.mlflow_tracking import MlflowRunLogger
from tasks.evaluation import evaluate, load_registered_model
from tasks.retry_policy import retry_unless_bad_input

QA_TASK = "qa"  # registered as wikirag-qa
KEY_TAG, REPORT_TAG = "qa_gate_key", "qa_gate"
# the gate's rule, part of its reuse key and of each report: after a change, a rerun gates its model again and a
# champion placed under an earlier rule is judged again (rejudge_champion). 2: a lead beyond chance
RULE = 2
MODELS = ("zero-shot", "fine-tuned", "closed-book")


class RealQuestions(BaseModel):
    """The held-out real questions of one index version, as files on the store."""

    dev: str  # URL of the dev questions (NQ-open jsonl, with their article)
    test: str
    counts: dict[str, dict[str, int]]  # source -> split -> questions
    notes: list[str] = Field(default_factory=list)

    @property
    def test_size(self) -> int:
        return sum(c.get("test", 0) for c in self.counts.values())


class ModelScores(BaseModel):
    em: float
    f1: float
    answer_in_output: float
    examples: int


class QAGate(BaseModel):
    """What the gate measured on the test questions and decided."""

    test_questions: int
    sources: dict[str, int]  # test questions per source
    scores: dict[str, ModelScores]  # zero-shot, fine-tuned, closed-book (empty with no test question)
    name: str
    version: str
    alias: str  # champion or challenger, as the gate decided
    reason: str
    reused: bool = False
    # test questions the fine-tune answers exactly and its zero-shot start does not, and the reverse (None: a
    # report made before they were counted)
    gained: int | None = None
    lost: int | None = None
    rule: int = 1  # the gate rule (RULE) that placed it; reports made before the rule was counted are rule 1

    @property
    def beat_zero_shot(self) -> bool:
        return bool(self.scores) and self.scores["fine-tuned"].em > self.scores["zero-shot"].em

    @property
    def lead_beyond_chance(self) -> bool:
        """Whether the answers that changed against the zero-shot start say the fine-tune is better (True for a
        report made before they were counted, which cannot tell)."""
        return self.gained is None or self.lost is None or beyond_chance(self.gained, self.lost)


@task(retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_bad_input)
def real_question_files(store: Store, index_version: str, qa_dir: str | None) -> RealQuestions:
    """The real questions answerable from ``index_version``'s articles, split, written once under
    ``tasks/real-questions/<version>/<digest>/`` on the store."""
    passages = read_passages(store, read_index_manifest(store, index_version).dump_id, columns=["title", "text"])
    texts: dict[str, list[str]] = {}
    for title, text in zip(passages.column("title").to_pylist(), passages.column("text").to_pylist()):
        texts.setdefault(title, []).append(text or "")
    items, notes = real_questions({t: " ".join(parts) for t, parts in texts.items()},
                                  Path(qa_dir) if qa_dir else None)
    files = {split: "".join(json.dumps({"id": f"{i['source']}-{n}", "question": i["question"], "answer": i["answers"],
                                        "article": i["article"]}) + "\n"
                            for n, i in enumerate(items) if i["split"] == split)
             for split in SPLITS}  # the id names the source
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    urls = {}
    for split, text in files.items():
        parts = ("tasks", "real-questions", index_version, digest, f"{split}.jsonl")
        if not store.exists(*parts):
            store.write_bytes(text.encode(), *parts)
        urls[split] = store.url_of(*parts)
    counts: dict[str, dict[str, int]] = {}
    for (source, split), n in Counter((i["source"], i["split"]) for i in items).items():
        counts.setdefault(source, {})[split] = n
    return RealQuestions(dev=urls["dev"], test=urls["test"], counts=counts, notes=notes)


def _scores(evaluation: Any) -> ModelScores:
    found = [answer_in_output(r["prediction"], r["targets"]) for r in evaluation.predictions]
    return ModelScores(em=evaluation.scores["em"], f1=evaluation.scores["f1"],
                       answer_in_output=sum(found) / max(1, len(found)), examples=len(found))


def _exact(evaluation: Any) -> list[float]:
    """Per test question, in order: 1 when the prediction is an exact match."""
    return [exact_match(r["prediction"], r["targets"]) for r in evaluation.predictions]


def _gated_before(client: MlflowClient, key: str) -> Any | None:
    try:
        versions = client.search_model_versions(f"name='{model_name(QA_TASK)}'")
    except MlflowException:
        return None
    return next((v for v in versions if v.tags.get(KEY_TAG) == key), None)


@task(cache_policy=NO_CACHE)
def qa_gate(tracking_uri: str, store: Store, index_version: str, questions: RealQuestions, source_task: str,
            source_version: str, run_id: str, zero_shot: Any, settings: dict[str, Any], limit: int | None = None
            ) -> QAGate:
    """Score the fine-tuned ``wikirag-<source_task>`` v``source_version``, ``zero_shot`` and closed-book on the test
    questions, log the scores into the fine-tune's run ``run_id`` and register the model as ``wikirag-qa`` with
    its test EM, against the zero-shot EM (module docstring); ``settings``: evaluate()'s decoding settings;
    ``limit``: the first test questions scored (all when None)."""
    log = get_run_logger()
    client = MlflowClient(tracking_uri=tracking_uri)
    rejudge_champion(client, log)
    source = client.get_model_version(model_name(source_task), source_version)
    test = _test_examples(questions, store)[:limit]
    key = hashlib.sha256(json.dumps([source.run_id, questions.test, settings, limit, RULE], sort_keys=True).encode()
                         ).hexdigest()
    if (done := _gated_before(client, key)) is not None:
        report = QAGate.model_validate_json(done.tags[REPORT_TAG])
        log.info("%s v%s: gated before on the same %d test questions; reusing its scores", done.name, done.version,
                 report.test_questions)
        return report.model_copy(update={"alias": alias_now(client, done.name, done.version), "reused": True})
    sources = dict(Counter(e.id.rsplit("-", 1)[0] for e in test))
    if not test:
        return QAGate(test_questions=0, sources={}, scores={}, name=model_name(QA_TASK), version="",
                      alias="not registered", reason="no held-out real question is answerable from this index")
    fine_tuned = load_registered_model(f"models:/{source.name}/{source.version}", tracking_uri)
    runs = {"zero-shot": evaluate(zero_shot, test, split="test", **settings),
            "fine-tuned": evaluate(fine_tuned, test, split="test", **settings),
            "closed-book": evaluate(zero_shot, test, closed_book=True, split="test", **settings)}
    scores = {m: _scores(run) for m, run in runs.items()}
    gained, lost = gained_lost(_exact(runs["zero-shot"]), _exact(runs["fine-tuned"]))
    MlflowRunLogger.open(tracking_uri, run_id).log_metrics(
        {**{f"test_{m.replace('-', '_')}_{k}": float(v) for m, s in scores.items() for k, v in s.model_dump().items()},
         "test_fine_tuned_gained": float(gained), "test_fine_tuned_lost": float(lost)})
    promotion = register(tracking_uri, source.source, QA_TASK, run_id=run_id, metric="test_em",
                         value=scores["fine-tuned"].em, margin=0.0, store=store, index_version=index_version,
                         baseline=scores["zero-shot"].em, changed=(gained, lost))
    report = QAGate(test_questions=len(test), sources=sources, scores=scores, name=promotion.name,
                    version=promotion.version, alias=promotion.alias, reason=promotion.reason, gained=gained,
                    lost=lost, rule=RULE)
    client.set_model_version_tag(promotion.name, promotion.version, REPORT_TAG, report.model_dump_json())
    client.set_model_version_tag(promotion.name, promotion.version, KEY_TAG, key)
    return report


def rejudge_champion(client: MlflowClient, log: Any = None) -> None:
    """Judge the ``wikirag-qa`` champion again when an earlier gate rule placed it: one whose stored lead over its
    zero-shot start is within chance loses the alias (tagged and logged), so consumers get the zero-shot model's
    answers in the summary and no lucky champion from ``@champion``; ``log``: a logger (default this module's)."""
    name = model_name(QA_TASK)
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return
    if REPORT_TAG not in champion.tags:
        return
    report = QAGate.model_validate_json(champion.tags[REPORT_TAG])
    if report.rule >= RULE or report.lead_beyond_chance:
        return
    reason = (f"champion under gate rule {report.rule}; its lead over its zero-shot start ({report.gained} answers "
              f"gained, {report.lost} lost, two-sided sign test p = {sign_test(report.gained, report.lost):.3f}) is "
              f"within chance, which rule {RULE} does not promote")
    client.delete_registered_model_alias(name, CHAMPION)
    client.set_model_version_tag(name, champion.version, "promotion", f"demoted: {reason}")
    client.set_model_version_tag(name, champion.version, REPORT_TAG,
                                 report.model_copy(update={"alias": "none", "reason": reason}).model_dump_json())
    (log or logging.getLogger(__name__)).warning("%s v%s is no longer champion: %s", name, champion.version, reason)


def _test_examples(questions: RealQuestions, store: Store) -> list[Any]:
    return list(load_task("nq", questions.test, store.options)) if questions.test_size else []


@task(cache_policy=NO_CACHE)
def qa_answers(tracking_uri: str, zero_shot: Any, questions: list[str]) -> tuple[str, list[dict]]:
    """``(who, answers)``: the ``wikirag-qa`` champion's answers with provenance, loaded by name as a consumer
    would; the zero-shot model's when there is no champion (who says which), those each with ``weak_match``:
    ask's note when its top passage is a weak match, else None (rag_core.model.answers.weak_match_note)."""
    from rag_core.model.answers import answer, weak_match_note

    client = MlflowClient(tracking_uri=tracking_uri)
    name = model_name(QA_TASK)
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:  # as `wikirag ask` answers, weak matches marked as it marks them
        return "zero-shot", [{**item, "weak_match": weak_match_note(zero_shot, item)}
                             for item in answer(zero_shot, questions)]
    model = load_registered_model(f"models:/{name}@{CHAMPION}", tracking_uri)
    # as `wikirag ask --model` answers: the weak-match threshold was measured on the index's own question encoder,
    # which the fine-tune trained
    return f"{name} v{champion.version}", answer(model, questions)
