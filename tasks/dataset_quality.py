"""The Great Expectations gate on a task's train and dev examples, before any training starts.

Per split: required fields present (id, input, at least one target; the regex for CuratedTrec, the
label for FEVER), ids unique, inputs and every target non-empty, the kind the run asked for, known
labels for FEVER. Across splits: no dev input is also a train input once both are normalised (SQuAD's
answer normalisation), or the dev metric would measure memory rather than the model. A failure keeps a
report (a Prefect artifact, and a file when a store is given) and stops the run before it trains.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact

from rag_core.errors import GateError
from rag_core.evaluate.normalize import normalize_answer
from rag_core.storage import Store
from rag_core.train.examples import Example
from rag_core.train.loaders import task_kind
from tasks.quality import GateResult, _validate, artifact_key, combine, report_markdown

REPORTS = ("datasets", "_reports")


def examples_frame(examples: Sequence[Example]) -> pd.DataFrame:
    """One row per example: what the expectations look at (inputs trimmed, targets counted and measured)."""
    return pd.DataFrame({
        "id": [e.id for e in examples],
        "kind": [e.kind for e in examples],
        "input": [e.input.strip() if isinstance(e.input, str) else None for e in examples],
        "targets": [len(e.targets) for e in examples],
        # None where there is no target at all: "no target" is the targets column's failure, not this one's
        "shortest_target": [min((len(t.strip()) for t in e.targets), default=None) for e in examples],
        "label": [e.label for e in examples],
        "answer_regex": [e.answer_regex for e in examples],
    }).astype({"shortest_target": "Int64"})


def split_expectations(kind: str) -> list[Any]:
    import great_expectations.expectations as gxe

    expectations = [
        gxe.ExpectColumnValuesToNotBeNull(column="id"),
        gxe.ExpectColumnValuesToBeUnique(column="id"),
        gxe.ExpectColumnValuesToNotBeNull(column="input"),
        gxe.ExpectColumnValueLengthsToBeBetween(column="input", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="targets", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="shortest_target", min_value=1),
        gxe.ExpectColumnValuesToBeInSet(column="kind", value_set=[kind]),
    ]
    labels = task_kind(kind).labels
    if labels is not None:
        expectations += [gxe.ExpectColumnValuesToNotBeNull(column="label"),
                         gxe.ExpectColumnValuesToBeInSet(column="label", value_set=list(labels))]
    if kind == "curatedtrec":
        expectations.append(gxe.ExpectColumnValuesToNotBeNull(column="answer_regex"))
    return expectations


def validate_split(kind: str, split: str, examples: Sequence[Example]) -> GateResult:
    """The per-split expectations on one split's examples."""
    return _validate(f"dataset-{split}", examples_frame(examples), split_expectations(kind))


def validate_overlap(train: Sequence[Example], dev: Sequence[Example]) -> GateResult:
    """No normalised input in both splits: the distinct inputs of each, stacked, must be unique."""
    import great_expectations.expectations as gxe

    distinct = [sorted({normalize_answer(e.input) for e in split if isinstance(e.input, str)}) for split in (train, dev)]
    frame = pd.DataFrame({"normalised_input": distinct[0] + distinct[1],
                          "split": ["train"] * len(distinct[0]) + ["dev"] * len(distinct[1])})
    return _validate("dataset-train-dev-overlap", frame, [gxe.ExpectColumnValuesToBeUnique(column="normalised_input")])


def validate_dataset(kind: str, train: Sequence[Example], dev: Sequence[Example]) -> list[GateResult]:
    """Every expectation of the dataset gate: train, dev, and their overlap."""
    return [validate_split(kind, "train", train), validate_split(kind, "dev", dev), validate_overlap(train, dev)]


@task
def gate_dataset(kind: str, train: list[Example], dev: list[Example], reports: Store | None = None) -> str:
    """The dataset gate before training: the report's markdown, or GateError (with a report) if any expectation fails."""
    results = validate_dataset(kind, train, dev)
    markdown = report_markdown(f"Dataset gate ({kind}: {len(train):,} train, {len(dev):,} dev)", results)
    if all(r.success for r in results):
        return markdown
    where = ""
    if reports is not None:
        name = f"{kind}-{time.strftime('%Y%m%dT%H%M%S')}.md"
        reports.child(*REPORTS).write_bytes(markdown.encode(), name)
        where = f"; report: {reports.child(*REPORTS).url_of(name)}"
    create_markdown_artifact(markdown=markdown, key=artifact_key(f"dataset-gate-{kind}"), description="failed gate")
    failed = "; ".join(r.summary() for r in combine(results) if not r.success)
    raise GateError(f"{failed}; training not started{where}")


def predictions_frame(examples: Sequence[Example], predictions: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """One row per dev example with its prediction, then one per prediction whose id no dev example has."""
    by_id: dict[str, list[Any]] = {}
    for record in predictions:
        by_id.setdefault(str(record.get("id")), []).append(record.get("prediction"))
    ids = [e.id for e in examples]
    strays = [i for i in by_id if i not in set(ids)]
    fever = {e.id for e in examples if e.kind in ("fever3", "fever2")}
    first = [(by_id.get(i) or [None])[0] for i in ids]
    return pd.DataFrame({
        "id": ids + strays,
        "known_id": [True] * len(ids) + [False] * len(strays),
        "predictions": [len(by_id.get(i, [])) for i in ids] + [len(by_id[i]) for i in strays],
        "prediction": first + [by_id[i][0] for i in strays],
        # FEVER labels as label_match reads them: case, spacing and a final full stop aside
        "label": [" ".join(str(p).upper().split()).rstrip(".") if i in fever and p is not None else None
                  for i, p in zip(ids, first)] + [None] * len(strays),
    })


def prediction_expectations(kind: str) -> list[Any]:
    import great_expectations.expectations as gxe

    expectations = [
        gxe.ExpectColumnValuesToBeInSet(column="known_id", value_set=[True]),  # no prediction for an unknown id
        gxe.ExpectColumnValuesToBeBetween(column="predictions", min_value=1, max_value=1),  # one per dev example
        gxe.ExpectColumnValuesToNotBeNull(column="prediction"),
        gxe.ExpectColumnValueLengthsToBeBetween(column="prediction", min_value=1),
    ]
    labels = task_kind(kind).labels
    if labels is not None:  # a generated label must be one the task knows
        expectations.append(gxe.ExpectColumnValuesToBeInSet(column="label", value_set=sorted(labels)))
    return expectations


def validate_predictions(kind: str, examples: Sequence[Example], predictions: Sequence[dict[str, Any]]) -> GateResult:
    """The predictions gate: one non-empty prediction per dev example (known labels for FEVER), none extra."""
    return _validate("predictions", predictions_frame(examples, predictions), prediction_expectations(kind))


@task
def gate_predictions(kind: str, examples: list[Example], predictions: list[dict[str, Any]]) -> str:
    """The predictions gate after evaluation: its markdown, or GateError (and an artifact) when it fails."""
    result = validate_predictions(kind, examples, predictions)
    markdown = report_markdown(f"Predictions gate ({kind}: {len(examples):,} dev examples)", [result])
    if result.success:
        return markdown
    create_markdown_artifact(markdown=markdown, key=artifact_key(f"predictions-gate-{kind}"), description="failed gate")
    raise GateError(f"{result.summary()}; the model is not registered")
