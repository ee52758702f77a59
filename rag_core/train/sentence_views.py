"""Rewordings of one sentence that put its subject first, so the clause rules of question_rules can read it.

Wikipedia's sentences often open with a date, an adverb or a pronoun instead of the clause's subject:

| view | sentence | read as |
|---|---|---|
| date first | In 1972, Tarkovsky completed Solaris, a film. | Tarkovsky completed Solaris in 1972. |
| adverb first | However, Lincoln won the election. | Lincoln won the election. |
| pronoun | He was elected President in 1860. | Abraham Lincoln was elected President in 1860. |
| generic noun | The state has 67 counties. | Alabama has 67 counties. |

A pronoun or generic noun ("the state") is read as the article's title only when the passage's own
pronouns say the title is its subject: "he"/"she" when the passage speaks of a person, "it" and the
generic nouns when it does not (:func:`title_pronoun`). Each view keeps where its text came from, so an
answer span found in a view maps back to the sentence; an answer that lies in reworded text (the title
put in for "He") has no place in the passage and is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from rag_core.train.cloze import _DATE

_DATE_FIRST = re.compile(rf"^(?P<prep>In|On) (?P<date>{_DATE.pattern}),?\s+(?P<body>\S.*?)"
                         r"(?P<stop>[.!?])$")
_ADVERB_FIRST = re.compile(r"^(?:However|Later|Eventually|Subsequently|Meanwhile|Today|Currently|Thus|Therefore|"
                           r"Finally|Initially|Originally|Additionally|Consequently|Nevertheless|Ultimately|"
                           r"In addition|In particular|At the time|At that time|In the end|As a result),\s+"
                           r"(?P<body>\S.*)$")
_PERSON = re.compile(r"^(?P<word>He|She)\s")
_THING = re.compile(r"^(?P<word>It|The (?:city|town|village|state|country|nation|province|region|island|river|"
                    r"lake|mountain|company|band|group|film|album|song|novel|book|game|language|species|genus|"
                    r"party|university|mission|spacecraft|ship|team|club|organization|organisation|territory|"
                    r"county|park|airport|school|church|building|empire|kingdom|republic|war|battle|treaty))\s")
_NOT_PERSON = frozenset("war battle city state kingdom republic empire river university party mission language "
                        "languages economy history culture geography act treaty".split())
_PRONOUNS = {"he": re.compile(r"\b(?:he|him|his)\b", re.I), "she": re.compile(r"\b(?:she|her|hers)\b", re.I),
             "it": re.compile(r"\b(?:it|its)\b", re.I)}


@dataclass(frozen=True)
class View:
    """A rewording of a sentence; ``pieces`` are the ``(view_start, sentence_start, length)`` of its copied text."""

    text: str
    pieces: tuple[tuple[int, int, int], ...]

    def in_sentence(self, start: int, end: int) -> tuple[int, int] | None:
        """Where ``text[start:end]`` is in the sentence, or None when it is not copied text (or spans two pieces)."""
        for view_start, sentence_start, length in self.pieces:
            if view_start <= start and end <= view_start + length:
                return sentence_start + start - view_start, sentence_start + end - view_start
        return None


def title_pronoun(text: str, title: str = "") -> str:
    """The pronoun a passage uses for its subject: "he" or "she" when it speaks of a person and the title
    names one, else "it"."""
    counts = {word: len(pattern.findall(text)) for word, pattern in _PRONOUNS.items()}
    person = max(("he", "she"), key=counts.__getitem__)
    return person if counts[person] >= 2 and counts[person] > counts["it"] and _names_a_person(title, text) else "it"


def _names_a_person(title: str, text: str) -> bool:
    """A full name ("Abraham Lincoln"), or a one-word title the passage makes a subject and never a place
    ("Apollo was", not "in Azerbaijan")."""
    words = title.split()
    if not words or any(not w[0].isupper() or w[0].isdigit() or w.lower() in _NOT_PERSON for w in words):
        return False
    if re.search(rf"\b(?:in|of the) {re.escape(title)}\b", text):
        return False
    return len(words) >= 2 or re.search(rf"\b{re.escape(title)}(?:'s| was| is| had| has)\b", text) is not None


def _copied(text: str, at: int) -> View:
    return View(text, ((0, at, len(text)),))


def _body_first(sentence: str) -> Iterator[View]:
    match = _DATE_FIRST.match(sentence)
    if match:
        # the clause up to its first comma: "On November 6, 1860, Lincoln was elected ..., beating ..."
        body, date, prep = match.group("body").split(", ")[0], match.group("date"), match.group("prep").lower()
        if body[0].islower():  # "In 1972, he ..." -> "He ...": the capital letter is no copy of the sentence
            head = body[0].upper()
            text = f"{head}{body[1:]} {prep} {date}{match.group('stop')}"
            yield View(text, ((1, match.start("body") + 1, len(body) - 1),
                              (len(body) + len(prep) + 2, match.start("date"), len(date))))
        else:
            text = f"{body} {prep} {date}{match.group('stop')}"
            yield View(text, ((0, match.start("body"), len(body)),
                              (len(body) + len(prep) + 2, match.start("date"), len(date))))
    match = _ADVERB_FIRST.match(sentence)
    if match and match.group("body")[0].isupper():
        yield _copied(match.group("body"), match.start("body"))


def _as_title(view: View, title: str, pronoun: str) -> View | None:
    match = (_PERSON if pronoun in ("he", "she") else _THING).match(view.text)
    if match is None or (pronoun != "it" and match.group("word").lower() != pronoun):
        return None
    cut = match.end("word")
    pieces = tuple((len(title), at + cut - start, length - cut + start) if start < cut else
                   (start - cut + len(title), at, length) for start, at, length in view.pieces if start + length > cut)
    return View(title + view.text[cut:], pieces)


def views(sentence: str, title: str = "", pronoun: str = "it") -> Iterator[View]:
    """The sentence itself, then its rewordings (module docstring); ``pronoun`` is the passage's
    :func:`title_pronoun`, and no pronoun is read as the title when ``title`` is empty."""
    own = _copied(sentence, 0)
    yield own
    for view in (own, *_body_first(sentence)):
        if view is not own:
            yield view
        if title and "(" not in title:
            titled = _as_title(view, title, pronoun)
            if titled is not None:
                yield titled
