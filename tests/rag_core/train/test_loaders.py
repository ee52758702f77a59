"""Each task loader on the real files in their original formats."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from rag_core.evaluate.metrics import regex_match
from rag_core.train import FEVER_LABELS, TASK_KINDS, Example, Provenance, load_task
from tests.rag_core.train.qafiles import qa_file


def _load(kind: str, relative: str) -> list[Example]:
    examples = load_task(kind, str(qa_file(relative)))
    assert all(e.kind == kind and e.input.strip() and e.targets and all(t.strip() for t in e.targets)
               for e in examples)
    assert len({e.id for e in examples}) == len(examples), "ids are unique within a file"
    return examples


@pytest.mark.parametrize(("kind", "relative", "count"), [
    ("nq", "nq_open/NQ-open.dev.jsonl", 3610),
    ("nq", "nq_open/NQ-open.efficientqa.dev.1.1.jsonl", 1800),
    ("webquestions", "webquestions/main_trainmodel.json", 2834),
    ("webquestions", "webquestions/main_val.json", 755),
    ("webquestions", "webquestions/main_test.json", 2032),
    ("curatedtrec", "curatedtrec/large2180-train.tsv", 1479),
    ("curatedtrec", "curatedtrec/large2180-test.tsv", 694),
    ("fever3", "fever/paper_dev.jsonl", 9999),
    ("fever2", "fever/paper_dev.jsonl", 6666),
])
def test_record_counts_of_the_real_files(kind: str, relative: str, count: int) -> None:
    assert len(_load(kind, relative)) == count  # the counts shared/data/README.md gives


def test_nq_open() -> None:
    first = _load("nq", "nq_open/NQ-open.dev.jsonl")[0]
    assert first.input == "when was the last time anyone was on the moon"
    assert first.targets == ("14 December 1972 UTC", "December 1972")


def test_triviaqa_value_first_then_aliases() -> None:
    for relative in ("triviaqa/triviaqa_sample.json", "triviaqa/web-dev-sample.json",
                     "triviaqa/wikipedia-dev-sample.json"):
        examples = _load("triviaqa", relative)
        sunset = next(e for e in examples if e.id == "tc_33")
        assert sunset.input == "Which Lloyd Webber musical premiered in the US on 10th December 1993?"
        assert sunset.targets[0] == "Sunset Boulevard" and "West Sunset Boulevard" in sunset.targets
        assert len(set(sunset.targets)) == len(sunset.targets)
    assert [e.id for e in _load("triviaqa", "triviaqa/web-dev-sample.json")][:1] == ["tc_2"]


def test_webquestions() -> None:
    first = _load("webquestions", "webquestions/main_val.json")[0]
    assert (first.id, first.input, first.targets) == ("wqr000004", "what kind of money to take to bahamas?",
                                                      ("Bahamian dollar",))


def test_curatedtrec_keeps_the_regex_and_trains_on_text_it_accepts() -> None:
    examples = _load("curatedtrec", "curatedtrec/large2180-train.tsv") + _load("curatedtrec",
                                                                               "curatedtrec/large2180-test.tsv")
    fashion = next(e for e in examples if e.id == "1756")
    assert fashion.answer_regex == "Sept?(ember)?|Feb(ruary)?" and fashion.targets == ("September", "February")
    # Every target of every real question is accepted by its own regex (the metric would score it right).
    assert all(regex_match(t, e.answer_regex) == 1.0 for e in examples for t in e.targets)
    # One real line has a tab inside its regex: it stays part of the regex.
    curies = next(e for e in examples if e.id == "462")
    assert "\t" in curies.answer_regex and re.compile(curies.answer_regex)


def test_msmarco() -> None:
    (example,) = _load("msmarco", "msmarco/dev_v1.1-sample.jsonl")
    assert (example.id, example.input, example.targets) == ("0", "does human hair stop squirrels", ("Yes",))


def test_jeopardy_generates_the_clue_from_the_answer() -> None:
    examples = _load("jeopardy", "searchqa/jeopardy_tiny.json")
    assert len(examples) == 7
    assert examples[0].input == "Copernicus"
    clue = "For the last 8 years of his life, Galileo was under house arrest for espousing this man's theory"
    assert examples[0].targets == (clue,)  # the dump's surrounding quotes are gone
    assert examples[3].input == "McDonald's"  # the dump writes McDonald\'s


def test_fever_three_and_two_way_labels_as_text() -> None:
    three = _load("fever3", "fever/paper_dev.jsonl")
    two = _load("fever2", "fever/paper_dev.jsonl")
    assert Counter(e.label for e in three) == dict.fromkeys(FEVER_LABELS, 3333)
    assert {e.label for e in two} == {"SUPPORTS", "REFUTES"}
    assert all(e.targets == (e.label,) for e in three + two)
    assert [e.id for e in two] == [e.id for e in three if e.label != "NOT ENOUGH INFO"]
    soul_food = next(e for e in three if e.id == "137334")
    assert Provenance(title="Soul Food (film)") in soul_food.provenance  # from Soul_Food_-LRB-film-RRB-
    assert all(not e.provenance for e in three if e.label == "NOT ENOUGH INFO")


def test_kilt_answers_and_provenance() -> None:
    nq = _load("kilt", "kilt/nq-dev-kilt.jsonl")
    first = nq[0]
    assert first.id == "6915606477668963399" and first.input == "what do the 3 dots mean in math"
    assert first.targets[:2] == ("the therefore sign", "therefore sign")
    assert first.provenance == (Provenance("10593264", "Therefore sign"),)
    fever = _load("kilt", "kilt/fever-dev-kilt.jsonl")
    assert fever[0].targets == ("SUPPORTS",) and fever[0].provenance == (Provenance("1073955", "Soul Food (film)"),)


def test_every_kind_is_registered_with_its_format() -> None:
    assert set(TASK_KINDS) == {"nq", "triviaqa", "webquestions", "curatedtrec", "msmarco", "jeopardy", "fever3",
                               "fever2", "kilt", "cloze", "generated-qa"}
    assert TASK_KINDS["fever2"].labels == ("SUPPORTS", "REFUTES")
    assert TASK_KINDS["fever3"].labels == FEVER_LABELS
