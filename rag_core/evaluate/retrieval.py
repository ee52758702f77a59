"""Retrieval metrics: is the answer, the page, or the passage among a question's top-k passages?

- ``answer_recall@k``: a gold answer occurs in the text of one of the top k
  passages, as a run of lower-cased words (DPR's "has answer"); for
  CuratedTrec the answer regex is searched in the raw text instead, as DPR does.
- ``page_recall@k``: one of the top k passages comes from a page named in the
  example's provenance (KILT's wikipedia ids or titles, FEVER's evidence
  pages, the cloze passage's page); only examples with provenance count.
- ``passage_recall@k``: the exact passage is among the top k (cloze questions
  know theirs).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rag_core.train.examples import Example

_WORD = re.compile(r"[^\W_]+")  # letters and digits, any script
_ARTICLES = frozenset({"a", "an", "the"})
_PASSAGE_ID = re.compile(r"^(\d+)-\d+-\d+$")  # "{page_id}-{revision_id}-{chunk}" (rag_core.wiki.passages)


@dataclass(frozen=True)
class RetrievedPassage:
    passage_id: str
    title: str
    text: str

    @property
    def page_id(self) -> str | None:
        match = _PASSAGE_ID.match(self.passage_id)
        return match.group(1) if match else None


def retrieved_passages(passage_ids: Sequence[Sequence[str]], titles: Sequence[Sequence[str]],
                       texts: Sequence[Sequence[str]]) -> list[list[RetrievedPassage]]:
    """Per question, its passages best first, from the ``[b][n_docs]`` lists a retriever returns."""
    return [[RetrievedPassage(*row) for row in zip(ids, tt, tx, strict=True)]
            for ids, tt, tx in zip(passage_ids, titles, texts, strict=True)]


def page_title(title: str) -> str:
    """A title as Wikipedia resolves it: underscores are spaces, the first letter is case-blind."""
    title = " ".join(title.replace("_", " ").split())
    return title[:1].upper() + title[1:]


def _words(text: str) -> str:
    # DPR's has_answer compares runs of letters and digits, so "US$861,542" holds "861,542" and
    # "€15.4" holds "15.4"; articles go as SQuAD's normalisation drops them.
    return " ".join(w for w in _WORD.findall(text.lower()) if w not in _ARTICLES)


def has_answer(example: Example, text: str) -> bool:
    """The example's answer shows in ``text``: its regex (CuratedTrec), else a target's words in a row."""
    if example.answer_regex is not None:
        return re.search(example.answer_regex, text, re.IGNORECASE | re.UNICODE | re.MULTILINE) is not None
    words = f" {_words(text)} "
    return any(f" {answer} " in words for answer in map(_words, example.targets) if answer)


def _from_page(example: Example, passage: RetrievedPassage) -> bool:
    ids = {p.wikipedia_id for p in example.provenance if p.wikipedia_id}
    titles = {page_title(p.title) for p in example.provenance if p.title}
    return (passage.page_id is not None and passage.page_id in ids) or page_title(passage.title) in titles


def _is_passage(example: Example, passage: RetrievedPassage) -> bool:
    return any(p.passage_id == passage.passage_id for p in example.provenance)


def _recall(examples: Sequence[Example], retrieved: Sequence[Sequence[RetrievedPassage]], k: int,
            hit: Callable[[Example, RetrievedPassage], bool]) -> float:
    if not examples:
        return 0.0
    return sum(any(hit(e, p) for p in passages[:k]) for e, passages in zip(examples, retrieved, strict=True)) / len(
        examples)


def retrieval_scores(examples: Sequence[Example], retrieved: Sequence[Sequence[RetrievedPassage]],
                     ks: Sequence[int], *, answers: bool) -> dict[str, float]:
    """``answer_recall@k`` (when ``answers``), ``page_recall@k`` and ``passage_recall@k`` where provenance allows.

    k runs over ``ks`` up to the most passages any question got (that count itself when ``ks`` has none).
    """
    longest = max((len(p) for p in retrieved), default=0)
    if longest == 0:
        return {}
    ks = sorted({k for k in ks if 0 < k <= longest}) or [longest]
    with_pages = [(e, p) for e, p in zip(examples, retrieved, strict=True)
                  if any(x.wikipedia_id or x.title for x in e.provenance)]
    with_passage = [(e, p) for e, p in zip(examples, retrieved, strict=True)
                    if any(x.passage_id for x in e.provenance)]
    out: dict[str, float] = {}
    for k in ks:
        if answers:
            out[f"answer_recall@{k}"] = _recall(examples, retrieved, k, lambda e, p: has_answer(e, p.text))
        if with_pages:
            out[f"page_recall@{k}"] = _recall(*zip(*with_pages), k, _from_page)
        if with_passage:
            out[f"passage_recall@{k}"] = _recall(*zip(*with_passage), k, _is_passage)
    return out
