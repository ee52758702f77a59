"""The reader's answer extraction (rag_core.model.extract.short_answer) on hand-worked replies.

Each case is a reply a small instruction-tuned generator gave (or gives in that shape) and the span a
person marking a quiz would accept, worked out by hand from the rules in the module's docstring.
"""

from __future__ import annotations

import pytest

from rag_core.model.extract import grounded_choice, is_grounded, short_answer

CASES = [
    # a sentence that restates the question around a copula
    ("The capital of Algeria is Algiers.", "What is the capital of Algeria?", "Algiers"),
    ("The film director Allan Dwan was born in Canada.", "In which country was the film director Allan Dwan born?",
     "Canada"),
    ("The Articles of Confederation were ratified in 1781.",
     "In what year were the Articles of Confederation ratified?", "1781"),
    ("Achilles was killed by the hero Paris.", "Who killed Achilles?", "the hero Paris"),
    # the question's verb inflected ("land" / "landed"), no copula: two content words and a preposition
    ("Apollo 11 landed on the Moon in 1969.", "In what year did Apollo 11 land on the Moon?", "1969"),
    # lead-ins, and a second sentence after the answer
    ("The answer is: 1969", "In what year did Apollo 11 land on the Moon?", "1969"),
    ("The answer is 1969. Apollo 11 was the first crewed landing.", "In what year did Apollo 11 land on the Moon?",
     "1969"),
    ("Answer: Aristotle", "Who was the teacher of Alexander the Great?", "Aristotle"),
    ("According to the passage, the capital is Kabul.", "What is the capital of Afghanistan?", "Kabul"),
    # the restatement at the back, then the parenthesis
    ("The Treaty of Paris (1783) ended the American Revolutionary War.",
     "Which treaty ended the American Revolutionary War?", "The Treaty of Paris"),
    # a label that restates the question, then a colon
    ("Alkali metal: lithium.", "Which alkali metal is the lightest?", "lithium"),
    # a "who" question answered with "... by Name"
    ("An American in Paris is a jazz-influenced symphony by George Gershwin.",
     "Who composed An American in Paris?", "George Gershwin"),
    # a clause after a comma goes, a date's comma stays
    ("Saint Petersburg, Russia", "In which city was Ayn Rand born?", "Saint Petersburg"),
    ("July 16, 1969, in the Moon's orbit.", "When did Apollo 11 land on the Moon?", "July 16, 1969"),
    # the parenthesis holds the answer when the rest restates the question
    ("International Atomic Time (TAI)", "What is the abbreviation of International Atomic Time?", "TAI"),
    # a "who" question: the name after a description and a comma
    ("The word altruism was coined by the founder of sociology, Auguste Comte, but it was also used before.",
     "Who coined the word altruism?", "Auguste Comte"),
    ("The primary election was won by the incumbent Republican Governor, Kay Ivey.",
     "who won the alabama governors race in the primary election", "Kay Ivey"),
    # a "who" question answered by a name and what it was: the name (links inside it stay, a pronoun is no name)
    ("Aristotle was the first genuine scientist in history", "Who tutored Alexander the Great?", "Aristotle"),
    ("Leonardo da Vinci was an Italian polymath.", "Who painted the Mona Lisa?", "Leonardo da Vinci"),
    ("He was a Greek philosopher.", "Who tutored Alexander the Great?", "He was a Greek philosopher"),
    # ... and not a sentence that merely starts with a capital
    ("Scientists are unsure who tutored him", "Who tutored Alexander the Great?",
     "Scientists are unsure who tutored him"),
    ("Nobody is known to have tutored him", "Who tutored Alexander the Great?", "Nobody is known to have tutored him"),
    ("Greek Philosophers were his tutors", "Who tutored Alexander the Great?", "Greek Philosophers were his tutors"),
    ("Alexander the Great was a king", "Who was Alexander the Great?", "a king"),
    # a reply cut at the token limit: the dangling copula and article go, titles that end in such words stay
    ("The Treaty of Paris (1783) was the", "Which treaty ended the American Revolutionary War?", "The Treaty of Paris"),
    ("The capital of Algeria is Algiers, a city on the", "What is the capital of Algeria?", "Algiers"),
    ("Let It Be", "Which was the last album the Beatles released?", "Let It Be"),
    ("The Who", "Which band released Tommy in 1969?", "The Who"),
    # short answers stay as they are: abbreviations, quotes around the whole, words that start like a lead-in
    ("Algiers", "What is the capital of Algeria?", "Algiers"),
    ("St. Petersburg", "In which city was Ayn Rand born?", "St. Petersburg"),
    ('"The Fountainhead"', "Which novel did Ayn Rand publish in 1943?", "The Fountainhead"),
    ("Answers in Genesis", "Which ministry did Ken Ham found?", "Answers in Genesis"),
    # all restatement: nothing would be left, so the reply comes back whole
    ("An American in Paris", "Who composed An American in Paris?", "An American in Paris"),
    # the answer is the subject and only the question's words follow: the subject stays
    ("Paris killed Achilles.", "Who killed Achilles?", "Paris"),
    # an answer whose first word is the question's is not cut at a preposition without a copula
    ("The Treaty of Paris", "Which treaty ended the American Revolutionary War?", "The Treaty of Paris"),
    ("", "Who killed Achilles?", ""),
]


@pytest.mark.parametrize(("reply", "question", "expected"), CASES, ids=[c[0][:40] or "empty" for c in CASES])
def test_short_answer_is_the_span_a_marker_would_accept(reply: str, question: str, expected: str) -> None:
    assert short_answer(reply, question) == expected


@pytest.mark.parametrize(("reply", "question", "expected"), CASES, ids=[c[0][:40] or "empty" for c in CASES])
def test_short_answer_is_idempotent(reply: str, question: str, expected: str) -> None:
    once = short_answer(reply, question)
    assert short_answer(once, question) == once


PASSAGES = ["Andre Agassi. Agassi married Steffi Graf in 2001; they have two children.",
            "Andre Agassi. He won eight Grand Slam titles, the first at Wimbledon in 1992."]


def test_grounded_choice_takes_the_best_answer_its_passages_hold() -> None:
    # best first by p(y|x): a fluent guess the passages do not hold, then the passage's own answer
    assert grounded_choice(["Djokovic", "Steffi Graf", "Wimbledon"], PASSAGES) == 1
    assert grounded_choice(["Wimbledon", "Steffi Graf"], PASSAGES) == 0  # both held: the better one
    assert grounded_choice(["the Steffi Graf"], PASSAGES) == 0  # compared after SQuAD normalisation


def test_grounded_choice_falls_back_to_the_best_when_no_passage_holds_an_answer() -> None:
    assert grounded_choice(["Djokovic", "Federer"], PASSAGES) == 0
    assert grounded_choice(["Federer", "Agas"], PASSAGES) == 0  # whole words: "Agassi" does not hold "Agas"
    assert grounded_choice(["Federer", "Graf Steffi"], PASSAGES) == 0  # in the passage's order
    assert grounded_choice(["Steffi Graf"], []) == 0  # closed book: no passages


def test_an_answer_made_of_the_questions_words_is_not_grounded() -> None:
    question = "Which tennis player did Andre Agassi marry?"
    assert is_grounded("Steffi Graf", PASSAGES, question)
    assert not is_grounded("Andre Agassi", PASSAGES, question)  # in the passage, but the question's own name
    assert not is_grounded("Agassi", PASSAGES, question)
    assert is_grounded("Agassi", PASSAGES)  # without the question, the passage alone decides
    assert not is_grounded("", PASSAGES, question)
    assert grounded_choice(["Agassi", "Steffi Graf"], PASSAGES, question) == 1
