"""Q-BLEU-1 on hand-worked cases: the paper's formula with its SQuAD weights."""

from __future__ import annotations

import pytest

from rag_core.evaluate import QBleuWeights, answerability, bleu1, qbleu1, score
from rag_core.evaluate.qbleu import word_classes, words
from rag_core.train import load_task
from tests.rag_core.train.qafiles import qa_file


def test_word_classes() -> None:
    tokens = words("Which river flows through Paris?")
    assert tokens == ["Which", "river", "flows", "through", "Paris"]  # 13a tokens, punctuation dropped
    assert word_classes(tokens) == {"ne": ["paris"], "qt": ["which", "river"], "re": ["flows"], "fw": ["through"]}
    clue = word_classes(words("In 1963, this company served its billionth burger"))
    assert clue == {"ne": [], "qt": [], "re": ["1963", "company", "served", "billionth", "burger"],
                    "fw": ["in", "this", "its"]}


def test_hand_worked_qbleu1() -> None:
    reference = "Which river flows through Paris?"
    generated = "Which river flows through Rome?"
    # qt: which, river matched 2/2; re: flows 1/1; fw: through 1/1; ne: rome vs paris 0/1.
    # P = R = 0.2*1 + 0.1*1 + 0.1*1 + 0.6*0 = 0.4, so answerability = 0.4; BLEU-1 = 4/5 (same length).
    assert answerability(generated, reference) == pytest.approx(0.4)
    assert qbleu1(generated, [reference]) == pytest.approx(0.7 * 0.4 + 0.3 * 0.8)


def test_precision_and_recall_differ_with_lengths() -> None:
    # generated: ne [paris], re [river]; reference: qt [which, river], re [flows], fw [through], ne [paris].
    # h: ne 1, re 0 ("river" is a qt word in the reference), qt 0, fw 0.
    # P = 0.6 * 1/1 + 0.1 * 0/1 = 0.6; R = 0.6 * 1/1 = 0.6 (qt, re, fw present, unmatched).
    assert answerability("Paris river", "Which river flows through Paris?") == pytest.approx(0.6)
    # generated has two entities, one right: P_ne = 1/2, R_ne = 1/1 -> P = 0.3, R = 0.6, F = 0.4.
    assert answerability("Paris Rome", "Paris") == pytest.approx(2 * 0.3 * 0.6 / 0.9)


def test_entities_weigh_more_than_bleu_does() -> None:
    reference = "this man's theory got Galileo arrested"
    right_entity = "Galileo theory"  # few shared words, the entity right
    wrong_entity = "this man's theory got Newton arrested"  # many shared words, the entity wrong
    assert bleu1([right_entity], [[reference]]) < bleu1([wrong_entity], [[reference]])
    assert qbleu1(right_entity, [reference]) > qbleu1(wrong_entity, [reference])


def test_a_perfect_clue_without_question_words_scores_one_minus_the_qt_share() -> None:
    clue = "For the last 8 years of his life, Galileo was under house arrest"
    assert qbleu1(clue, [clue]) == pytest.approx(1 - 0.7 * 0.2)
    assert qbleu1("Which river flows through Paris?", ["Which river flows through Paris?"]) == pytest.approx(1.0)
    assert qbleu1("", [clue]) == 0.0 and qbleu1(clue, ["?"]) == 0.0
    assert qbleu1(clue, [clue], QBleuWeights(ne=0.3, qt=0.0, re=0.4, delta=0.5)) == pytest.approx(1.0)


def test_jeopardy_score_on_the_real_clues() -> None:
    examples = load_task("jeopardy", str(qa_file("searchqa/jeopardy_tiny.json")))
    perfect = score("jeopardy", examples, [e.targets[0] for e in examples])
    assert perfect["qbleu1"] == pytest.approx(0.86) and perfect["bleu1"] == pytest.approx(1.0)
    answers_only = score("jeopardy", examples, [e.input for e in examples])  # "Copernicus" as its own clue
    assert 0 < answers_only["qbleu1"] < 0.2
