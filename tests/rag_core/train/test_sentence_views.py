"""Rewordings that put a sentence's subject first, and the plain verb forms of "When did X ...?" questions:
hand-worked cases, then sentences of the real sample as the generated-QA stage reads them."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from rag_core.train.generated_qa import candidate_pairs
from rag_core.train.question_rules import questions
from rag_core.train.sentence_views import title_pronoun, views
from rag_core.train.verb_forms import plain_form
from tests.helpers.passagefiles import sample_passages


@pytest.mark.parametrize(("past", "plain"), [
    ("issued", "issue"), ("created", "create"), ("completed", "complete"), ("decided", "decide"),
    ("captured", "capture"), ("acquired", "acquire"), ("changed", "change"), ("waged", "wage"),
    ("settled", "settle"), ("defined", "define"), ("named", "name"), ("escaped", "escape"), ("agreed", "agree"),
    ("married", "marry"), ("planned", "plan"), ("occurred", "occur"), ("added", "add"), ("called", "call"),
    ("passed", "pass"), ("signed", "sign"), ("elected", "elect"), ("opened", "open"), ("visited", "visit"),
    ("entered", "enter"), ("developed", "develop"), ("defeated", "defeat"), ("belonged", "belong"),
    ("became", "become"), ("wrote", "write"), ("died", "die"), ("won", "win"),
])
def test_the_plain_form_of_a_past_tense(past: str, plain: str) -> None:
    assert plain_form(past) == plain


@pytest.mark.parametrize(("sentence", "title", "pronoun", "expected"), [
    # a date first moves to the end, its clause cut at the first comma
    ("In 1972, Tarkovsky completed Solaris, an adaptation of the novel.", "Andrei Tarkovsky", "he",
     [("who-did", "Who completed Solaris in 1972?", "Tarkovsky"),
      ("when-did", "When did Tarkovsky complete Solaris?", "1972")]),
    ("In 1990 Tirana was founded.", "", "it", [("made-when", "When was Tirana founded?", "1990")]),
    ("However, Lincoln won the election in 1860.", "Abraham Lincoln", "he",
     [("who-did", "Who won the election in 1860?", "Lincoln"),
      ("when-did", "When did Lincoln win the election?", "1860")]),
    # a pronoun is the title when the passage speaks of the title so ...
    ("He was elected President in 1860.", "Abraham Lincoln", "he",
     [("made-when", "When was Abraham Lincoln elected President?", "1860")]),
    # ... and not otherwise
    ("He was elected President in 1860.", "Abraham Lincoln", "it", []),
    ("The state has 67 counties.", "Alabama", "it", [("how-many", "How many counties does Alabama have?", "67")]),
    ("The state has 67 counties.", "Alabama", "he", []),
    # the answer would be the title put in for "He": no span of the passage, so no question
    ("He issued the Emancipation Proclamation.", "Abraham Lincoln", "he", []),
])
def test_reworded_sentences_give_questions_whose_answers_are_spans_of_the_sentence(
        sentence: str, title: str, pronoun: str, expected: list[tuple[str, str, str]]) -> None:
    made = list(questions(sentence, title, pronoun))
    assert [(q.rule, q.question, sentence[q.start:q.end]) for q in made] == expected


def test_every_view_maps_its_copied_text_back_to_the_sentence() -> None:
    sentence = "In 1972, he completed Solaris, an adaptation of the novel."
    seen = []
    for view in views(sentence, "Andrei Tarkovsky", "he"):
        seen.append(view.text)
        for start, at, length in view.pieces:
            assert view.text[start:start + length] == sentence[at:at + length]
    assert seen == [sentence, "He completed Solaris in 1972.", "Andrei Tarkovsky completed Solaris in 1972."]


@pytest.fixture(scope="module")
def sample(wiki: Path):
    return sample_passages()


def _passages_of(sample, title: str):
    return sample.filter(pc.equal(sample.column("title"), title))


def test_the_pronoun_of_real_passages_follows_their_subject(sample) -> None:
    def pronouns(title: str) -> set[str]:
        rows = _passages_of(sample, title)
        return {title_pronoun(text, title) for text in rows.column("text").to_pylist()}

    assert "he" in pronouns("Abraham Lincoln") and "he" in pronouns("Andrei Tarkovsky")
    assert pronouns("Alabama") == {"it"} and pronouns("Azerbaijan") == {"it"}  # Aliyev's "he" is no Azerbaijan


@pytest.mark.parametrize(("title", "rule", "question", "answer"), [
    ("Abraham Lincoln", "made-when", "When was Lincoln elected the 16th president of the United States?",
     "November 6, 1860"),  # "On November 6, 1860, Lincoln was elected ..., beating ..."
    ("Andrei Tarkovsky", "when-did", "When did Andrei Tarkovsky complete Solaris?", "1972"),  # "In 1972, he ..."
    ("Aldous Huxley", "life-born", "When was Aldous Leonard Huxley born?", "26 July 1894"),
    ("Aldous Huxley", "life-died", "When did Aldous Leonard Huxley die?", "22 November 1963"),
    ("Alabama", "how-many", "How many counties does Alabama have?", "67"),
])
def test_real_passages_give_the_reworded_questions_with_spans_inside_their_passage(
        sample, title: str, rule: str, question: str, answer: str) -> None:
    rows = _passages_of(sample, title)
    texts = dict(zip(rows.column("passage_id").to_pylist(), rows.column("text").to_pylist(), strict=True))
    pairs = [p for p in candidate_pairs(rows, per_passage=3) if p["question"] == question]
    assert [(p["rule"], p["answer"]) for p in pairs] == [(rule, answer)]
    assert texts[pairs[0]["passage_id"]][pairs[0]["answer_start"]:pairs[0]["answer_end"]] == answer


def test_no_real_question_puts_a_person_pronoun_on_a_place(sample) -> None:
    pairs = candidate_pairs(_passages_of(sample, "Azerbaijan"), per_passage=3)
    assert pairs and not any("Azerbaijan reelected" in p["question"] for p in pairs)
