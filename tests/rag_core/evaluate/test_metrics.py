"""Each metric against known values: SQuAD's official script, hand-worked BLEU/ROUGE, and the libraries' own outputs."""

from __future__ import annotations

import pytest
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from rag_core.evaluate import (
    HEADLINE,
    EvaluationError,
    bleu1,
    exact_match,
    f1_score,
    headline_each,
    label_match,
    normalize_answer,
    regex_match,
    rouge_l,
    score,
)
from rag_core.train import TASK_KINDS, Example, load_task
from tests.rag_core.train.qafiles import qa_file

# (prediction, gold answers, EM, F1, normalised prediction) as printed by the normalize_answer,
# exact_match_score, f1_score and metric_max_over_ground_truths functions of SQuAD's evaluate-v1.1.py.
SQUAD_OFFICIAL = [
    ("The Cat", ["the cat"], 1.0, 1.0, "cat"),
    ("Barack Obama was president", ["Obama", "Barack Obama"], 0.0, 0.6666666666666666, "barack obama was president"),
    ("a cat, the hat!", ["cat hat"], 1.0, 1.0, "cat hat"),
    ("14 December 1972 UTC", ["December 1972"], 0.0, 0.6666666666666666, "14 december 1972 utc"),
    ("", ["anything"], 0.0, 0.0, ""),
    ("the the", ["the"], 1.0, 0.0, ""),  # both normalise to nothing: equal, but no token in common
    ("Señor López", ["senor lopez"], 0.0, 0.0, "señor lópez"),  # accents are kept
    ("U.S.A.", ["USA"], 1.0, 1.0, "usa"),
    ("rock 'n' roll", ["rock and roll"], 0.0, 0.6666666666666666, "rock n roll"),
    ("Theodore  Roosevelt's", ["theodore roosevelts"], 1.0, 1.0, "theodore roosevelts"),
    ("an apple a day", ["apple day keeps"], 0.0, 0.8, "apple day"),
]


@pytest.mark.parametrize(("prediction", "golds", "em", "f1", "normalised"), SQUAD_OFFICIAL)
def test_em_f1_and_normalisation_equal_squads_official_script(prediction, golds, em, f1, normalised) -> None:
    assert normalize_answer(prediction) == normalised
    assert exact_match(prediction, golds) == em
    assert f1_score(prediction, golds) == pytest.approx(f1, abs=1e-12)


def test_regex_match_is_drqas_anchored_case_blind_match() -> None:
    assert regex_match("1897", "189[6789]") == 1.0
    assert regex_match("White Sands, New Mexico", "White Sands|New Mexico") == 1.0
    assert regex_match("white sands", "White Sands") == 1.0  # case-blind
    assert regex_match("in 1897", "189[6789]") == 0.0  # anchored at the start, as DrQA's regex_match_score
    assert regex_match("September", "Sept?(ember)?|Feb(ruary)?") == 1.0
    assert regex_match("Sepember", "Sept(ember)?") == 0.0


def test_label_accuracy_ignores_case_and_spacing_only() -> None:
    assert label_match(" supports. ", "SUPPORTS") == 1.0
    assert label_match("not  enough info", "NOT ENOUGH INFO") == 1.0
    assert label_match("REFUTE", "REFUTES") == 0.0


def test_bleu1_hand_worked_and_equal_to_sacrebleu() -> None:
    # 5 of 6 unigrams match ("the" twice, cat, on, mat); same length, so no brevity penalty: 5/6.
    assert bleu1(["the cat sat on the mat"], [["the cat is on the mat"]]) == pytest.approx(5 / 6)
    # Two predictions, references of unequal number: 5 of 5 unigrams match; closest reference lengths 3 + 3 = 6,
    # predictions 3 + 2 = 5 words, brevity penalty exp(1 - 6/5).
    value = bleu1(["the cat sat", "A dog"], [["the cat sat", "a dog ran"], ["a dog ran"]])
    assert value == pytest.approx(2.718281828459045 ** (1 - 6 / 5))
    library = BLEU(max_ngram_order=1, lowercase=True, smooth_method="none").corpus_score(
        ["the cat sat", "A dog"], [["the cat sat", "a dog ran"], ["a dog ran", None]]).score / 100
    assert value == pytest.approx(library)
    assert bleu1(["x y"], [["a b"]]) == 0.0  # no smoothing: nothing in common is zero


def test_rouge_l_hand_worked_and_equal_to_rouge_score() -> None:
    # LCS("the cat was under the bed", "the cat was found under the bed") = 6 words:
    # precision 6/6, recall 6/7, F = 12/13.
    assert rouge_l(["the cat was under the bed"], [["the cat was found under the bed"]]) == pytest.approx(12 / 13)
    # The best reference counts, and examples are averaged.
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    refs = [["a cat", "the cat was under the bed"], ["nothing here"]]
    preds = ["the cat under the bed", "something else"]
    expected = (max(scorer.score(r, preds[0])["rougeL"].fmeasure for r in refs[0]) + 0.0) / 2
    assert rouge_l(preds, refs) == pytest.approx(expected)


def _perfect(examples: list[Example]) -> list[str]:
    return [e.targets[0] for e in examples]


@pytest.mark.parametrize(("kind", "relative"), [
    ("nq", "nq_open/NQ-open.efficientqa.dev.1.1.jsonl"),
    ("triviaqa", "triviaqa/web-dev-sample.json"),
    ("webquestions", "webquestions/main_val.json"),
    ("curatedtrec", "curatedtrec/large2180-test.tsv"),
    ("msmarco", "msmarco/dev_v1.1-sample.jsonl"),
    ("fever3", "fever/paper_dev.jsonl"),
    ("fever2", "fever/paper_dev.jsonl"),
    ("kilt", "kilt/nq-dev-kilt.jsonl"),
])
def test_score_on_real_dev_files(kind: str, relative: str) -> None:
    examples = load_task(kind, str(qa_file(relative)))
    perfect = score(kind, examples, _perfect(examples))
    assert perfect[HEADLINE[kind]] == pytest.approx(1.0) and perfect["examples"] == len(examples)
    wrong = score(kind, examples, ["zzz"] * len(examples))
    assert wrong[HEADLINE[kind]] == 0.0
    # the per-example headline a gate pairs two models by: 1 where the answer is the gold one, 0 where it is
    # nonsense, and its mean is the headline score() reports
    mixed = [p if i % 2 else "zzz" for i, p in enumerate(_perfect(examples))]
    each = headline_each(kind, examples, mixed)
    assert each == pytest.approx([float(i % 2) for i in range(len(examples))])
    assert sum(each) / len(each) == pytest.approx(score(kind, examples, mixed)[HEADLINE[kind]])


def test_the_per_example_headline_is_graded_where_the_metric_is() -> None:
    example = Example("1", "q", ("the cat was found under the bed",), "msmarco")
    # ROUGE-L worked by hand above: 12/13 for the near miss
    assert headline_each("msmarco", [example] * 2, ["the cat was under the bed", "the cat was found under the bed"]
                         ) == pytest.approx([12 / 13, 1.0])
    (trec,) = [e for e in load_task("curatedtrec", str(qa_file("curatedtrec/large2180-train.tsv"))) if e.id == "1756"]
    assert headline_each("curatedtrec", [trec], ["Sept"]) == [1.0]  # the regex, not the derived text
    with pytest.raises(EvaluationError, match="2 predictions for 1 nq examples"):
        headline_each("nq", [Example("1", "q", ("a",), "nq")], ["a", "b"])


def test_fever_accuracy_counts_labels() -> None:
    examples = load_task("fever3", str(qa_file("fever/paper_dev.jsonl")))
    assert score("fever3", examples, ["supports"] * len(examples))["accuracy"] == pytest.approx(1 / 3)
    two = load_task("fever2", str(qa_file("fever/paper_dev.jsonl")))
    assert score("fever2", two, ["REFUTES"] * len(two))["accuracy"] == pytest.approx(1 / 2)


def test_curatedtrec_scores_the_regex_not_the_derived_text() -> None:
    (example,) = [e for e in load_task("curatedtrec", str(qa_file("curatedtrec/large2180-train.tsv")))
                  if e.id == "1756"]
    result = score("curatedtrec", [example], ["Sept"])  # the regex accepts it; no target string equals it
    assert result["regex_match"] == 1.0 and result["em"] == 0.0


def test_every_kind_has_a_headline_metric_that_score_reports() -> None:
    assert set(HEADLINE) == set(TASK_KINDS)
    for kind in TASK_KINDS:
        example = Example("1", "q", ("SUPPORTS",), kind, answer_regex="SUPPORTS" if kind == "curatedtrec" else None,
                          label="SUPPORTS" if kind.startswith("fever") else None)
        assert HEADLINE[kind] in score(kind, [example], ["SUPPORTS"])


def test_predictions_that_do_not_line_up_are_refused() -> None:
    example = Example("1", "q", ("a",), "nq")
    with pytest.raises(EvaluationError, match="2 predictions for 1 nq examples"):
        score("nq", [example], ["a", "b"])
    with pytest.raises(EvaluationError, match="of kind 'nq', not 'triviaqa'"):
        score("triviaqa", [example], ["a"])
    with pytest.raises(EvaluationError, match="unknown task kind 'squad'"):
        score("squad", [example], ["a"])
    with pytest.raises(EvaluationError, match="retrieved passages for 0 questions"):
        score("nq", [example], ["a"], retrieved=[])
