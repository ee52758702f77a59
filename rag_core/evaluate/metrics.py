"""The paper's metrics, one :func:`score` per task kind, and each kind's headline dev metric.

Every value is a fraction in [0, 1] (sacrebleu's 0-100 is divided by 100).

| metric | definition |
|---|---|
| ``em``, ``f1`` | SQuAD v1.1: normalised exact match / token F1, the max over the gold answers |
| ``regex_match`` | CuratedTrec: the answer regex matches the prediction from its start (DrQA's regex_match_score: case-blind) |
| ``bleu1`` | corpus BLEU with unigrams only, sacrebleu (13a tokens, lower-cased, every gold answer a reference) |
| ``rouge_l`` | rouge-score's ROUGE-L F-measure, the max over references, averaged over examples |
| ``qbleu1`` | Q-BLEU-1 (rag_core.evaluate.qbleu), the max over references, averaged |
| ``accuracy`` | FEVER: the predicted label (case and spacing ignored) equals the gold label |
| ``answer_recall@k``, ``page_recall@k``, ``passage_recall@k`` | retrieval (rag_core.evaluate.retrieval) |

:data:`HEADLINE` names the metric a promotion gate compares for each kind.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence

from rag_core.errors import WikiragError
from rag_core.evaluate.normalize import normalize_answer
from rag_core.evaluate.qbleu import SQUAD_WEIGHTS, QBleuWeights, qbleu1
from rag_core.evaluate.retrieval import RetrievedPassage, retrieval_scores
from rag_core.train.examples import Example
from rag_core.train.loaders import TASK_KINDS

# The dev metric each kind is judged by (the RAG paper's tables: EM for open QA, Q-BLEU-1 for Jeopardy!,
# ROUGE-L and BLEU-1 for MS-MARCO, label accuracy for FEVER).
HEADLINE: dict[str, str] = {
    "nq": "em",
    "triviaqa": "em",
    "webquestions": "em",
    "curatedtrec": "regex_match",
    "msmarco": "rouge_l",
    "jeopardy": "qbleu1",
    "fever3": "accuracy",
    "fever2": "accuracy",
    "kilt": "em",
    "cloze": "em",
    "generated-qa": "em",
}
# answers are in passages
_EXTRACTIVE = frozenset({"nq", "triviaqa", "webquestions", "curatedtrec", "kilt", "cloze", "generated-qa"})
DEFAULT_KS = (1, 5, 10, 20)


class EvaluationError(WikiragError):
    """Predictions (or retrieved passages) that do not line up with the examples they score."""


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    guess = normalize_answer(prediction)
    return float(any(guess == normalize_answer(gold) for gold in golds))


def _f1(prediction: str, gold: str) -> float:
    guess, truth = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(guess) & Counter(truth)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(guess), same / len(truth)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    """SQuAD token F1 over normalised words, the best over the gold answers."""
    return max((_f1(prediction, gold) for gold in golds), default=0.0)


def regex_match(prediction: str, pattern: str) -> float:
    """1.0 when ``pattern`` matches ``prediction`` from its start, ignoring case (DrQA's regex_match_score)."""
    return float(re.compile(pattern, re.IGNORECASE | re.UNICODE | re.MULTILINE).match(prediction.strip()) is not None)


def label_match(prediction: str, label: str) -> float:
    """1.0 when the generated label is the gold one, whatever its case, spacing or final full stop."""
    return float(" ".join(prediction.upper().split()).rstrip(".") == label)


@functools.cache
def _bleu1():
    from sacrebleu.metrics import BLEU

    return BLEU(max_ngram_order=1, lowercase=True, smooth_method="none")


def bleu1(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU-1 in [0, 1]; each prediction may have any number of references."""
    if not predictions:
        return 0.0
    width = max(len(refs) for refs in references)
    # sacrebleu takes reference *streams*; a missing reference of a shorter list is None
    streams = [[refs[i] if i < len(refs) else None for refs in references] for i in range(width)]
    return _bleu1().corpus_score(list(predictions), streams).score / 100.0


@functools.cache
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"])


def rouge_l_each(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> list[float]:
    """Per example, the best ROUGE-L F-measure against any of its references (rouge-score)."""
    return [_rouge().score_multi(list(refs), pred)["rougeL"].fmeasure for pred, refs in
            zip(predictions, references, strict=True)]


def rouge_l(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Mean over examples of the best ROUGE-L F-measure against any reference (rouge-score)."""
    return _mean(rouge_l_each(predictions, references))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _check(kind: str, examples: Sequence[Example], predictions: Sequence[str],
           retrieved: Sequence[Sequence[RetrievedPassage]] | None) -> None:
    if kind not in TASK_KINDS:
        raise EvaluationError(f"unknown task kind {kind!r}; choose one of {', '.join(TASK_KINDS)}")
    if len(predictions) != len(examples):
        raise EvaluationError(f"{len(predictions)} predictions for {len(examples)} {kind} examples; "
                              "give one prediction per example, in order")
    if retrieved is not None and len(retrieved) != len(examples):
        raise EvaluationError(f"retrieved passages for {len(retrieved)} questions, but {len(examples)} examples")
    other = next((e for e in examples if e.kind != kind), None)
    if other is not None:
        raise EvaluationError(f"example {other.id!r} is of kind {other.kind!r}, not {kind!r}")
    if any(not isinstance(p, str) for p in predictions):
        raise EvaluationError("predictions must be strings (a generated answer, clue or label each)")


def score(kind: str, examples: Sequence[Example], predictions: Sequence[str],
          retrieved: Sequence[Sequence[RetrievedPassage]] | None = None,
          *, ks: Sequence[int] = DEFAULT_KS, qbleu_weights: QBleuWeights = SQUAD_WEIGHTS) -> dict[str, float]:
    """The task's metrics for ``predictions[i]`` of ``examples[i]`` (and ``retrieved[i]``, best first).

    Always includes ``HEADLINE[kind]`` and ``examples`` (the count).
    """
    _check(kind, examples, predictions, retrieved)
    golds = [e.targets for e in examples]
    out: dict[str, float] = {"examples": float(len(examples)),
                             HEADLINE[kind]: _mean(_headline_each(kind, examples, predictions, qbleu_weights))}
    if kind in ("jeopardy", "msmarco"):
        out["bleu1"] = bleu1(predictions, golds)
        if "rouge_l" not in out:  # jeopardy's: its headline is qbleu1
            out["rouge_l"] = rouge_l(predictions, golds)
    elif kind not in ("fever3", "fever2"):
        if "em" not in out:
            out["em"] = _mean([exact_match(p, g) for p, g in zip(predictions, golds)])
        out["f1"] = _mean([f1_score(p, g) for p, g in zip(predictions, golds)])
    if retrieved is not None:
        out.update(retrieval_metrics(kind, examples, retrieved, ks))
    return out


def headline_each(kind: str, examples: Sequence[Example], predictions: Sequence[str]) -> list[float]:
    """Each example's value of the kind's headline metric (:data:`HEADLINE`), in order: the per-question scores a
    gate compares two models by (rag_core.evaluate.paired), whose mean :func:`score` reports."""
    _check(kind, examples, predictions, None)
    return _headline_each(kind, examples, predictions, SQUAD_WEIGHTS)


def _headline_each(kind: str, examples: Sequence[Example], predictions: Sequence[str],
                   qbleu_weights: QBleuWeights) -> list[float]:
    pairs = list(zip(predictions, examples, strict=True))
    metric = HEADLINE[kind]
    if metric == "accuracy":
        return [label_match(p, e.label or e.targets[0]) for p, e in pairs]
    if metric == "qbleu1":
        return [qbleu1(p, e.targets, qbleu_weights) for p, e in pairs]
    if metric == "rouge_l":
        return rouge_l_each(predictions, [e.targets for e in examples])
    if metric == "regex_match":
        return [regex_match(p, e.answer_regex or re.escape(e.targets[0])) for p, e in pairs]
    return [exact_match(p, e.targets) for p, e in pairs]


def retrieval_metrics(kind: str, examples: Sequence[Example], retrieved: Sequence[Sequence[RetrievedPassage]],
                      ks: Sequence[int] = DEFAULT_KS) -> dict[str, float]:
    """The recall@k metrics a task kind allows (answer recall only where answers are spans of passages)."""
    return retrieval_scores(examples, retrieved, ks, answers=kind in _EXTRACTIVE)
