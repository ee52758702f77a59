"""A self-supervised task from an index's own passages: fill in a masked salient span.

With only a Wikipedia dump a user can still train and evaluate: each example
is one complete sentence of a passage with a date, a number or a capitalised
multi-word name masked, the article title in front (``"Articles of
Confederation: ... presented their results to the Congress on [MASK]."``),
and the span as the target. Link anchors are gone after cleaning, so spans
are found from what the text shows.

- **Retrievable**: the answer is in its passage, which stays in the index
  (held-out articles are held out from *training questions*, not from the
  index); provenance names the page and the passage.
- **Not trivially guessable**: a span that occurs again in its sentence or in
  the title (or, for a name, shares a capitalised word with the rest of the
  sentence) is skipped.
- **Split by page**: an article's questions are all in train or all in dev,
  and a train question whose normalised input equals a dev one is dropped.
- **Deterministic given the seed**: the held-out pages and each passage's
  draw depend on ``seed`` and the ids only, not on the order of the table.
- **Any size**: :func:`cloze_task` streams the passage set in blocks and,
  with ``max_passages``, asks only of a seeded sample of passages.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field

from rag_core.evaluate.normalize import normalize_answer
from rag_core.storage import Store
from rag_core.train.examples import Example, Provenance
from rag_core.wiki.ingest import read_passage_rows, read_passages

SPAN_KINDS = ("date", "number", "name")
_COLUMNS = ("passage_id", "page_id", "title", "text")
_MONTH = "January|February|March|April|May|June|July|August|September|October|November|December"
_DATE = re.compile(
    rf"\b(?:\d{{1,2}} (?:{_MONTH}),? \d{{3,4}}|(?:{_MONTH}) \d{{1,2}}, \d{{3,4}}|(?:{_MONTH}) \d{{3,4}}"
    rf"|(?:{_MONTH}) \d{{1,2}}|\d{{1,2}} (?:{_MONTH}))\b|\b(?:1\d{{3}}|20\d{{2}})\b(?![.,]\d)"
)
_NUMBER = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d{2,})(?![\w,]|\.\d)")
_CAP = r"[A-ZÀ-ÖØ-Þ][\w'’.-]*[\w]|[A-ZÀ-ÖØ-Þ]"
_CONNECTOR = r"of|de|du|da|del|della|der|den|van|von|la|le|al|y"  # not "the", "and": they join two names
_NAME = re.compile(rf"(?<![\w'’-])(?:{_CAP})(?:\s+(?:(?:{_CONNECTOR})\s+)?(?:{_CAP}))+(?![\w'’-])")
# Capitalised words that start sentences or stand alone, not parts of names.
_NOT_NAME = frozenset([
    "a", "an", "the", "in", "on", "at", "by", "for", "from", "to", "of", "and", "or", "but", "as", "after",
    "before", "during", "since", "until", "with", "without", "this", "that", "these", "those", "his", "her", "its",
    "their", "he", "she", "it", "they", "we", "i", "there", "here", "when", "while", "where", "which", "who",
    "what", "how", "although", "though", "if", "many", "some", "most", "several", "other", "another", "one", "two",
    "three", "however", "also"
])
_ABBREVIATIONS = frozenset([
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "no", "vol", "pp", "u.s", "c", "ca",
    "gen", "col", "lt", "sgt", "capt", "prof", "inc", "ltd", "co", "mt", "ft", "fig", "approx"
])
_OPENERS = frozenset(" (\"'“‘$£€")  # what may stand right before a span
_CLOSERS = frozenset(" ,.;)!?\"'”’%")  # and right after it
_POSSESSIVE = re.compile(r"['’]s\b")  # "Hugo's" gives "Hugo" away
_SENTENCE_END = re.compile(r"[.!?][\"')\]]?\s+")


class ClozeConfig(BaseModel):
    """How cloze questions are drawn from a passage set."""

    seed: int = 0  # decides the held-out pages and each passage's span
    dev_fraction: float = Field(0.1, gt=0.0, lt=1.0)  # share of pages (articles) whose questions form the dev set
    per_passage: int = Field(1, ge=1)  # questions drawn from one passage, from different sentences
    min_sentence_words: int = Field(6, ge=3)  # shorter sentences give the question too little context
    span_kinds: tuple[Literal["date", "number", "name"], ...] = SPAN_KINDS  # which salient spans to mask
    mask: str = "[MASK]"  # stands for the span in the input
    max_passages: int | None = Field(None, ge=1)  # draw from a seeded sample of about this many passages; None = all


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: str  # date | number | name


@dataclass
class ClozeTask:
    train: list[Example]
    dev: list[Example]
    dev_pages: set[int] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)  # examples by span kind


def sentences(text: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each complete sentence: starts upper case or with a digit, ends with . ! or ?."""
    start = 0
    for match in _SENTENCE_END.finditer(text):
        before = text[start: match.start()].rsplit(" ", 1)[-1].strip("([\"'.").lower()
        nxt = text[match.end(): match.end() + 1]
        if before in _ABBREVIATIONS or len(before) == 1 or not (nxt.isupper() or nxt.isdigit() or nxt in "\"'("):
            continue  # "St. Louis", "J. Smith", "U.S. forces", "e.g. this"
        yield from _complete(text, start, match.end())
        start = match.end()
    yield from _complete(text, start, len(text))


def _complete(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    sentence = text[start:end].rstrip()
    # A 100-word window cuts sentences at both ends: keep only whole ones.
    if sentence and (sentence[0].isupper() or sentence[0].isdigit()) and sentence.rstrip("\"')]")[-1:] in ".!?":
        yield start, start + len(sentence)


def salient_spans(sentence: str, kinds: Iterable[str] = SPAN_KINDS) -> list[Span]:
    """Dates, numbers and capitalised multi-word names in a sentence, longest first where they overlap."""
    found: list[Span] = [Span(m.start(), m.end(), "date") for m in _DATE.finditer(sentence)]
    found += [Span(m.start(), m.end(), "number") for m in _NUMBER.finditer(sentence)]
    for m in _NAME.finditer(sentence):
        words = list(re.finditer(r"\S+", m.group()))
        if m.start() == 0:  # the first word of a sentence is capitalised whatever it is ("Examples of Lewis")
            words.pop(0)
        while words and (words[0].group().lower() in _NOT_NAME or not words[0].group()[0].isupper()):
            words.pop(0)  # "In World War II" -> "World War II"
        if len([w for w in words if w.group()[0].isupper()]) >= 2:
            found.append(Span(m.start() + words[0].start(), m.start() + words[-1].end(), "name"))
    chosen: list[Span] = []
    for span in sorted(found, key=lambda s: (s.start - s.end, SPAN_KINDS.index(s.kind), s.start)):
        if all(span.end <= c.start or span.start >= c.end for c in chosen):
            chosen.append(span)  # a longer span wins over the parts of it ("14 December 1972" over "1972")
    # Whole tokens only: not "1919" of "1918–1919", "85" of "I-85", "American War" of "Mexican–American War".
    chosen = [s for s in chosen if (s.start == 0 or sentence[s.start - 1] in _OPENERS)
              and (s.end == len(sentence) or sentence[s.end] in _CLOSERS)]
    wanted = set(kinds)
    return sorted((s for s in chosen if s.kind in wanted), key=lambda s: s.start)


def guessable(sentence: str, span: Span, title: str) -> bool:
    """The span (or, for a name, one of its words) shows elsewhere in the sentence, or in the title."""
    answer = normalize_answer(_POSSESSIVE.sub("", sentence[span.start: span.end]))
    rest = f" {normalize_answer(_POSSESSIVE.sub('', sentence[: span.start] + ' ' + sentence[span.end:]))} "
    if not answer or f" {answer} " in rest or f" {answer} " in f" {normalize_answer(title)} ":
        return True
    if span.kind == "name":
        words = [w for w in sentence[span.start: span.end].split() if w[0].isupper()]
        return any(f" {normalize_answer(w)} " in rest for w in words if len(normalize_answer(w)) > 2)
    return False


def _unit(seed: int, key: str) -> float:
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def dev_pages(page_ids: Iterable[int], config: ClozeConfig) -> set[int]:
    """The held-out pages: a seeded hash below ``dev_fraction``; at least one, and never all, of two or more."""
    pages = sorted(set(page_ids))
    held = {p for p in pages if _unit(config.seed, f"page:{p}") < config.dev_fraction}
    if not held and len(pages) >= 2:
        held = {min(pages, key=lambda p: _unit(config.seed, f"page:{p}"))}
    if len(held) == len(pages) and len(pages) >= 2:
        held.discard(max(pages, key=lambda p: _unit(config.seed, f"page:{p}")))
    return held


def passage_questions(passage_id: str, page_id: int, title: str, text: str,
                      config: ClozeConfig) -> list[tuple[str, Example]]:
    """Up to ``per_passage`` cloze questions from one passage with their span kinds, drawn with a seeded generator."""
    rng = random.Random(f"{config.seed}:{passage_id}")
    options: dict[str, list[tuple[int, int, Span]]] = {}
    for start, end in sentences(text):
        sentence = text[start:end]
        if len(sentence.split()) < config.min_sentence_words:
            continue
        for span in salient_spans(sentence, config.span_kinds):
            if not guessable(sentence, span, title):
                options.setdefault(span.kind, []).append((start, end, span))
    out: list[tuple[str, Example]] = []
    used: set[int] = set()
    while options and len(out) < config.per_passage:
        kind = rng.choice(sorted(options))  # kinds equally likely, so numbers do not crowd out names
        start, end, span = options[kind].pop(rng.randrange(len(options[kind])))
        if not options[kind]:
            del options[kind]
        if start in used:
            continue
        used.add(start)
        sentence = text[start:end]
        masked = sentence[: span.start] + config.mask + sentence[span.end:]
        out.append((span.kind, Example(
            id=f"{passage_id}:{start + span.start}", input=f"{title}: {masked}",
            targets=(sentence[span.start: span.end],), kind="cloze",
            provenance=(Provenance(wikipedia_id=str(page_id), title=title, passage_id=passage_id),),
        )))
    return out


def _draw(blocks: Iterable[pa.Table], held: set[int], keep: float, config: ClozeConfig) -> ClozeTask:
    drawn: dict[str, dict[str, tuple[str, Example]]] = {"train": {}, "dev": {}}  # normalised input -> question
    for block in blocks:
        columns = [block.column(name).to_pylist() for name in _COLUMNS]
        for passage_id, page_id, title, text in zip(*columns, strict=True):
            if keep < 1.0 and _unit(config.seed, f"passage:{passage_id}") >= keep:
                continue
            split = drawn["dev" if page_id in held else "train"]
            for kind, example in passage_questions(passage_id, page_id, title, text, config):
                split.setdefault(normalize_answer(example.input), (kind, example))  # a repeated sentence asks once
    # Two articles can share a sentence: such a question must not be in both splits.
    train = [q for key, q in drawn["train"].items() if key not in drawn["dev"]]
    dev = list(drawn["dev"].values())
    counts = Counter(kind for kind, _ in train + dev)
    return ClozeTask([e for _, e in train], [e for _, e in dev], held, counts)


def _keep(n_passages: int, config: ClozeConfig) -> float:
    return 1.0 if config.max_passages is None else min(1.0, config.max_passages / max(n_passages, 1))


def cloze_examples(passages: pa.Table, config: ClozeConfig | None = None) -> ClozeTask:
    """Train and dev cloze questions from a passages table (passage_id, page_id, title, text)."""
    config = config or ClozeConfig()
    held = dev_pages(passages.column("page_id").to_pylist(), config)
    return _draw([passages], held, _keep(passages.num_rows, config), config)


def cloze_task(store: Store, dump_id: str, config: ClozeConfig | None = None, *,
               block_rows: int = 50_000) -> ClozeTask:
    """Cloze questions from a published passage set, read ``block_rows`` passages at a time.

    Only the page ids of the whole set are in memory at once (to choose the held-out pages);
    titles and texts stream through. With ``max_passages`` a seeded sample of passages is read
    for questions, so a full Wikipedia (21M passages) gives a task of a chosen size.
    """
    config = config or ClozeConfig()
    page_ids = read_passages(store, dump_id, columns=["page_id"]).column("page_id")
    held = dev_pages(pc.unique(page_ids).to_pylist(), config)
    n = len(page_ids)
    blocks = (read_passage_rows(store, dump_id, start, min(start + block_rows, n), columns=list(_COLUMNS))
              for start in range(0, n, block_rows))
    return _draw(blocks, held, _keep(n, config), config)
