"""The short answer inside a generated reply: what a reader returns for a factual question.

A small instruction-tuned generator often answers in a sentence that restates the question
("The capital of Algeria is Algiers."), behind a lead-in ("The answer is: 1969"), or with a
second sentence after the answer. :func:`short_answer` cuts the reply down to the answer span
by rules that read only the reply and the question, in this order:

1. the first sentence (a full stop, ! or ? followed by a capital letter; "St." and "U.S." stay);
2. lead-ins: "The answer is", "Answer:", "According to the passage," and the like, and the articles,
   prepositions and copulas a reply cut at its token limit ends with ("The Treaty of Paris was the");
3. a restated question at the front: the longest leading run of words that are all the
   question's own words or function words, when it holds a copula ("The capital of Algeria
   is") or two of the question's content words and ends in a preposition or a colon
   ("Apollo 11 landed on the Moon in", "Alkane:");
4. a restated question at the back: a trailing run of such words that holds two of the
   question's content words ("[The Treaty of Paris] ended the American Revolutionary War");
5. for a "who" question, the capitalised name after the last "by" ("a symphony by George Gershwin"),
   or the one the reply starts with when "is"/"was" and an article follow it and it is not the
   question's own ("Aristotle was the first genuine scientist in history");
6. a parenthesis (its content, when all that is outside restates the question: "International Atomic
   Time (TAI)"), a clause after a comma (not a date's "16, 1969"; for a "who" question, a name that
   follows a description: "the founder of sociology, Auguste Comte"), a final full stop, and quotes
   around the whole answer.

:func:`grounded_choice` is the reader's last step for RAG-Sequence: of the candidates ranked by
p(y|x), the best whose short answer occurs, whole words after SQuAD normalisation, in one of the
passages the question retrieved and is not made of the question's own words (:func:`is_grounded`);
the best overall when none does. When none does and ``RagConfig.grounded`` is set (the default), the
reader answers with whichever of that reply and the passages' :func:`passage_spans` the generator finds
likeliest (:func:`rag_core.model.causal_decoding.causal_span_scores`). A small generator's likelihoods
favour short, fluent replies whatever the passages say ("Djokovic" over a sentence naming the player
the passage names); the text of the passages does not.

A word is the question's own when one is a prefix of the other and the shorter has 4 letters
or more ("land" / "landed"), or when they are equal. A step that would leave nothing is skipped,
so a reply that is all restatement comes back whole. A reply that is already short comes back as
it is, apart from the lead-in and the final full stop: the function is idempotent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rag_core.evaluate.normalize import normalize_answer

_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]\"']{2})[.!?]\s+(?=[A-Z\"'(])")
_LEAD_IN = re.compile(
    r"^(?:(?:the\s+)?(?:correct\s+|final\s+|short\s+|right\s+)?answer\b(?:\s+(?:is|would\s+be|to\s+the\s+question\s+is)\b)?"
    r"\s*[:\-]?\s*|(?:according\s+to|based\s+on)\s+the\s+(?:passage|text|context)\b\s*,?\s*|a\s*:\s*)", re.IGNORECASE)
_PARENTHESIS = re.compile(r"\s*\([^()]*\)")
_COMMA_CLAUSE = re.compile(r",\s+(?!\d)")
_QUOTES = "\"“”'‘’"
_WORD_EDGES = "\"'“”‘’.,;:!?()[]"
COPULAS = frozenset("is was were are be been being has have had does did do 's".split())
PREPOSITIONS = frozenset("of in on at by to from for with as into during than after before about".split())
# what a reply cut mid-sentence ends with; "be" and "who" stay, as titles end with them ("Let It Be", "The Who")
DANGLING = PREPOSITIONS | frozenset("the a an and or is was were are".split())
FUNCTION_WORDS = COPULAS | PREPOSITIONS | frozenset(
    "the a an and or it its his her their this that these those which who whom whose what when where why how "
    "not also known called named located situated".split())


def _bare(word: str) -> str:
    word = word.strip(_WORD_EDGES).lower()
    return word[:-2] if word.endswith(("'s", "’s")) else word


def _same(a: str, b: str) -> bool:
    if a == b:
        return True
    short, long_ = sorted((a, b), key=len)
    return len(short) >= 4 and long_.startswith(short)


class _Question:
    """The question's content words, and which reply words restate it."""

    def __init__(self, question: str) -> None:
        self.words = {w for w in map(_bare, question.split()) if w and w not in FUNCTION_WORDS}
        self.asks_who = bool(re.match(r"\s*(?:who|whom|by whom)\b", question, re.IGNORECASE))

    def echoes(self, word: str) -> bool:
        bare = _bare(word)
        return any(_same(bare, w) for w in self.words)

    def restates(self, word: str) -> bool:
        return _bare(word) in FUNCTION_WORDS or self.echoes(word)


def _strip_lead_in(text: str) -> str:
    while True:
        shorter = _LEAD_IN.sub("", text, count=1).strip()
        if shorter == text or not shorter:
            return text
        text = shorter


def _front(words: list[str], question: _Question) -> list[str]:
    """``words`` without the longest restated-question prefix that qualifies (step 3)."""
    best = 0
    content = copula = 0
    for i, word in enumerate(words[:-1]):
        if not question.restates(word):
            break
        bare = _bare(word)
        content += question.echoes(word) and bare not in FUNCTION_WORDS
        copula += bare in COPULAS
        ends_well = bare in PREPOSITIONS or bare in COPULAS or word.endswith(":")
        if content and ends_well and (copula or content >= 2) or word.endswith(":") and content:
            best = i + 1
    return words[best:]


def _back(words: list[str], question: _Question) -> list[str]:
    """``words`` without a trailing restated-question run of two content words or more (step 4)."""
    cut, content = len(words), 0
    for i in range(len(words) - 1, 0, -1):
        if not question.restates(words[i]):
            break
        content += question.echoes(words[i]) and _bare(words[i]) not in FUNCTION_WORDS
        if content >= 2:
            cut = i
    if all(question.restates(word) for word in words[:cut]):  # the answer would go with the restatement
        return words
    return words[:cut]


def _agent(words: list[str], question: _Question) -> list[str]:
    """For a "who" question, the capitalised name after the last "by" ("a symphony by George Gershwin")."""
    if not question.asks_who or "by" not in words[:-1]:
        return words
    start = len(words) - 1 - words[::-1].index("by") + 1
    name = []
    for word in words[start:]:
        if not word[:1].isupper():
            break
        name.append(word)
        if word[-1:] in ",;:":
            break
    return name or words


def _subject(words: list[str], question: _Question) -> list[str]:
    """For a "who" question, the capitalised name a reply starts with, when "is"/"was" and an article follow it
    and it does not restate the question ("Aristotle was the first genuine scientist in history" -> "Aristotle").
    The article tells a description of someone from a sentence that merely starts with a capital ("Scientists are
    unsure ...", "Nobody is known ...")."""
    if not question.asks_who:
        return words
    name = []
    for at, word in enumerate(words[:5]):
        if _bare(word) in ("is", "was"):
            if at + 1 >= len(words) or _bare(words[at + 1]) not in ("a", "an", "the"):
                return words
            break
        if not word[:1].isupper() and not (name and _bare(word) in _NAME_LINKS) or _bare(word) in _SPAN_STOP:
            return words
        name.append(word)
    else:
        return words
    while name and _bare(name[-1]) in _NAME_LINKS:
        name.pop()
    if not name or all(question.restates(word) for word in name):
        return words
    return name


def _is_name(text: str) -> bool:
    words = text.rstrip(".").split()
    return 1 <= len(words) <= 4 and all(word[:1].isupper() for word in words)


def short_answer(reply: str, question: str) -> str:
    """The answer span of ``reply`` to ``question`` (module docstring); the stripped reply when no rule applies."""
    text = " ".join(reply.split())
    if not text:
        return text
    text = _SENTENCE_END.split(text, maxsplit=1)[0]
    text = _strip_lead_in(text)
    q = _Question(question)
    words = text.split()
    while len(words) > 1 and _bare(words[-1]) in DANGLING and words[-1][-1:].isalpha():  # "was the." ended a sentence
        words.pop()
    words = _front(words, q) or words
    words = _back(words, q) or words
    text = " ".join(_subject(_agent(words, q), q))
    outside = _PARENTHESIS.sub("", text).strip()
    inside = _PARENTHESIS.search(text)
    if inside and outside and all(q.restates(word) for word in outside.split()):  # "International Atomic Time (TAI)"
        text = _COMMA_CLAUSE.split(inside.group(0).strip(" ()"), maxsplit=1)[0]
    else:
        text = outside or text
    pieces = [piece.strip() for piece in _COMMA_CLAUSE.split(text)]
    if q.asks_who and len(pieces) > 1 and pieces[0][:1].islower() and _is_name(pieces[1]):
        text = pieces[1]  # "the founder of sociology, Auguste Comte, ..."
    else:
        text = pieces[0] or text
    text = text.rstrip(".;:, ").strip()
    if len(text) > 2 and text[0] in _QUOTES and text[-1] in _QUOTES:
        text = text[1:-1].strip()
    return text or " ".join(reply.split())


def is_grounded(answer: str, passages: Sequence[str], question: str = "") -> bool:
    """Whether ``answer`` occurs, whole words after SQuAD normalisation, in one of ``passages`` and says more than
    ``question`` (an answer all of whose words are the question's, "Angola" to "From which country did Angola
    become independent?", names no answer)."""
    needle = normalize_answer(answer)
    if not needle or set(needle.split()) <= set(normalize_answer(question).split()):
        return False
    return any(f" {needle} " in f" {normalize_answer(passage)} " for passage in passages)


def grounded_choice(answers: Sequence[str], passages: Sequence[str], question: str = "") -> int:
    """Index of the first of ``answers`` (best first) that :func:`is_grounded`; 0 when none is (or none given)."""
    return next((i for i, answer in enumerate(answers) if is_grounded(answer, passages, question)), 0)


# Words an answer span neither starts nor ends with, nor holds (but for the links inside a name).
_SPAN_STOP = FUNCTION_WORDS | frozenset(
    "be been being but by for if into onto over under about after before during while since until between among "
    "such other more most some any all each both one than then there here can could would should will may might "
    "he she they we you i".split())
_NAME_LINKS = frozenset("of de la le del der van von da du the and al y".split())
_SPAN_BREAK = re.compile(r"[.;:!?()\[\]]")


def passage_spans(passage: str, question: str = "", max_words: int = 4) -> list[str]:
    """The answers ``passage`` could give, as its own text, in passage order: runs of up to ``max_words`` words
    within a clause (no full stop, colon or bracket inside) that neither start nor end with a function word
    ("of", "the", "was", ...). A run of capitalised words and numbers may hold a name's links ("Treaty of
    Paris", "July 16, 1969"); any other run is one or two words ("sulfuric acid"). A final "'s" is dropped,
    and a run made only of the question's own words (after SQuAD normalisation) is left out, as in
    :func:`is_grounded`."""
    words = []  # (start, end, core, breaks after)
    for match in re.finditer(r"\S+", passage):
        token = match.group(0)
        core = token.strip(_WORD_EDGES)
        if not core:
            words.append((0, 0, "", True))
            continue
        at = match.start() + token.index(core)
        tail = token[token.index(core) + len(core):]
        words.append((at, at + len(core), core, bool(_SPAN_BREAK.search(tail))))
        if words[-1][2] and _SPAN_BREAK.search(token[: token.index(core)]) and len(words) > 1:
            words[-2] = (*words[-2][:3], True)  # "(born 1809)": the bracket ends the run before it
    asked = set(normalize_answer(question).split())
    found: dict[str, None] = {}
    for i, (start, _, first, _) in enumerate(words):
        if not first or first.lower() in _SPAN_STOP:
            continue
        for j in range(i, min(len(words), i + max_words)):
            if j > i and words[j - 1][3]:
                break
            core = [w[2] for w in words[i:j + 1]]
            if not core[-1] or core[-1].lower() in _SPAN_STOP:
                continue
            name = all(w[0].isupper() or w[0].isdigit() or w.lower() in _NAME_LINKS for w in core)
            if not name and (len(core) > 2 or any(w.lower() in _SPAN_STOP for w in core)):
                continue
            if any(w.lower() in _SPAN_STOP and w.lower() not in _NAME_LINKS for w in core):
                continue
            text = passage[start:words[j][1]]
            text = text[:-2] if text.endswith(("'s", "’s")) else text
            said = normalize_answer(text)
            if said and not set(said.split()) <= asked:
                found.setdefault(text)
    return list(found)
