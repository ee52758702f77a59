"""The dataset gate with real Great Expectations: real task files pass, each broken property fails on its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rag_core.errors import GateError
from rag_core.storage import Store
from rag_core.train import Example, load_task
from tasks.dataset_quality import REPORTS, gate_dataset, validate_dataset
from tests.rag_core.train.qafiles import qa_file


@pytest.fixture(scope="module")
def nq() -> tuple[list[Example], list[Example]]:
    """NQ-open's EfficientQA dev questions as train and its dev file as dev (no question in both)."""
    return (load_task("nq", str(qa_file("nq_open/NQ-open.efficientqa.dev.1.1.jsonl")))[:300],
            load_task("nq", str(qa_file("nq_open/NQ-open.dev.jsonl")))[:200])


@pytest.fixture(scope="module")
def fever() -> tuple[list[Example], list[Example]]:
    examples = load_task("fever3", str(qa_file("fever/paper_dev.jsonl")))
    return examples[:300], examples[300:450]


def _failures(kind: str, train: list[Example], dev: list[Example]) -> set[tuple[str, str, str]]:
    return {(r.name, f.expectation, f.column) for r in validate_dataset(kind, train, dev) for f in r.failures}


def test_real_datasets_pass(nq, fever) -> None:
    for kind, (train, dev) in (("nq", nq), ("fever3", fever)):
        results = validate_dataset(kind, train, dev)
        assert all(r.success for r in results), [r.summary() for r in results if not r.success]
        assert {r.name: r.rows for r in results}["dataset-train"] == len(train)
    trec = load_task("curatedtrec", str(qa_file("curatedtrec/large2180-train.tsv")))
    assert all(r.success for r in validate_dataset("curatedtrec", trec[:400], load_task(
        "curatedtrec", str(qa_file("curatedtrec/large2180-test.tsv")))[:100]))


def _broken(examples: list[Example], i: int, **changes) -> list[Example]:
    out = list(examples)
    out[i] = dataclasses.replace(out[i], **changes)
    return out


@pytest.mark.parametrize(("split", "changes", "failure"), [
    ("train", {"id": None}, ("expect_column_values_to_not_be_null", "id")),
    ("dev", {"input": None}, ("expect_column_values_to_not_be_null", "input")),
    ("train", {"input": "   "}, ("expect_column_value_lengths_to_be_between", "input")),
    ("dev", {"targets": ()}, ("expect_column_values_to_be_between", "targets")),
    ("train", {"targets": ("Paris", " ")}, ("expect_column_values_to_be_between", "shortest_target")),
    ("dev", {"kind": "triviaqa"}, ("expect_column_values_to_be_in_set", "kind")),
])
def test_each_expectation_fails_on_its_own(nq, split: str, changes: dict, failure: tuple[str, str]) -> None:
    train, dev = nq
    if split == "train":
        train = _broken(train, 5, **changes)
    else:
        dev = _broken(dev, 5, **changes)
    assert _failures("nq", train, dev) == {(f"dataset-{split}", *failure)}


def test_duplicate_ids_fail(nq) -> None:
    train, dev = nq
    assert _failures("nq", _broken(train, 7, id=train[3].id), dev) == {
        ("dataset-train", "expect_column_values_to_be_unique", "id")}


def test_unknown_or_missing_fever_labels_fail(fever) -> None:
    train, dev = fever
    assert _failures("fever3", _broken(train, 2, label="MAYBE"), dev) == {
        ("dataset-train", "expect_column_values_to_be_in_set", "label")}
    assert _failures("fever3", train, _broken(dev, 2, label=None)) == {
        ("dataset-dev", "expect_column_values_to_not_be_null", "label")}
    nei = next(e for e in train if e.label == "NOT ENOUGH INFO")  # a 2-way dataset has no NEI
    two_way = [dataclasses.replace(e, kind="fever2") for e in train if e.label != "NOT ENOUGH INFO"]
    assert _failures("fever2", [*two_way, dataclasses.replace(nei, kind="fever2")],
                     [dataclasses.replace(e, kind="fever2") for e in dev if e.label != "NOT ENOUGH INFO"]) == {
        ("dataset-train", "expect_column_values_to_be_in_set", "label")}


def test_curatedtrec_needs_its_regex() -> None:
    trec = load_task("curatedtrec", str(qa_file("curatedtrec/large2180-train.tsv")))[:60]
    assert _failures("curatedtrec", _broken(trec[:40], 0, answer_regex=None), trec[40:]) == {
        ("dataset-train", "expect_column_values_to_not_be_null", "answer_regex")}


def test_a_dev_question_also_in_train_fails_by_normalised_input(nq) -> None:
    train, dev = nq
    leaked = dataclasses.replace(dev[9], id="leak", input=f"  The {dev[9].input.upper()}?! ")
    results = validate_dataset("nq", [*train, leaked], dev)
    failed = {(r.name, f.expectation, f.column): f for r in results for f in r.failures}
    assert set(failed) == {("dataset-train-dev-overlap", "expect_column_values_to_be_unique", "normalised_input")}
    overlap = failed[("dataset-train-dev-overlap", "expect_column_values_to_be_unique", "normalised_input")]
    assert overlap.unexpected == 2  # the same input once in each split
    # Repeats inside one split are not an overlap.
    assert all(r.success for r in validate_dataset("nq", [*train, dataclasses.replace(train[0], id="again")], dev))


def test_the_task_stops_the_run_with_a_report(nq, prefect_server: str, tmp_path: Path) -> None:
    from prefect import flow

    train, dev = nq

    @flow
    def check(train: list[Example], dev: list[Example]) -> str:
        return gate_dataset("nq", train, dev, reports=Store(str(tmp_path)))

    assert "Dataset gate (nq: 300 train, 200 dev): passed" in check(train, dev)
    with pytest.raises(GateError, match=r"expect_column_values_to_be_unique\(normalised_input\): 2 rows; "
                                        r"training not started; report: "):
        check([*train, dev[0]], dev)
    (report,) = Store(str(tmp_path)).child(*REPORTS).list()
    text = Store(str(tmp_path)).child(*REPORTS).read_bytes(report).decode()
    assert "FAILED" in text and "| expect_column_values_to_be_unique | normalised_input | 2 of" in text


def test_predictions_gate_wants_one_nonempty_prediction_per_dev_example_and_known_labels() -> None:
    from rag_core.train.examples import Example
    from tasks.dataset_quality import validate_predictions

    dev = [Example(id=str(i), input=f"q{i}", targets=("a",), kind="nq") for i in range(3)]
    good = [{"id": str(i), "prediction": "an answer"} for i in range(3)]
    assert validate_predictions("nq", dev, good).success
    failing = [  # each breaks exactly the expectation it names
        ("expect_column_values_to_be_between", "predictions", [*good, {"id": "0", "prediction": "again"}]),
        ("expect_column_value_lengths_to_be_between", "prediction", [*good[:2], {"id": "2", "prediction": ""}]),
        ("expect_column_values_to_be_in_set", "known_id", [*good, {"id": "9", "prediction": "stray"}]),
    ]
    for expectation, column, predictions in failing:
        result = validate_predictions("nq", dev, predictions)
        assert [(f.expectation, f.column) for f in result.failures] == [(expectation, column)], result.summary()
    missing = validate_predictions("nq", dev, good[:2])
    assert {(f.expectation, f.column) for f in missing.failures} == {
        ("expect_column_values_to_be_between", "predictions"), ("expect_column_values_to_not_be_null", "prediction")}
    fever = [Example(id="c1", input="claim", targets=("SUPPORTS",), kind="fever3", label="SUPPORTS")]
    assert validate_predictions("fever3", fever, [{"id": "c1", "prediction": "Supports."}]).success
    assert not validate_predictions("fever3", fever, [{"id": "c1", "prediction": "maybe"}]).success
