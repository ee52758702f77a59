"""Answers with provenance: what `wikirag ask`, the evaluation and the registered MLflow model return.

One record per question, in input order::

    {"question": ..., "answer": ..., "provenance": [{"passage_id", "title", "score"}, ...]}

``score`` is p(z|x), the softmax of the model's doc_scores, and provenance is
in the model's own order of it (highest first); closed-book answers have none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

MAX_NEW_TOKENS = 32
# A question is a sentence or two (NQ's are under 100 characters, a Jeopardy clue under 300). A decoder-only
# generator reads it whole in each of its n_docs prompts, so a pasted document would cost time and memory n_docs
# times over, and the question encoder reads only its first 256 tokens anyway.
MAX_QUESTION_CHARS = 1000


def too_long(which: str, question: str) -> str | None:
    """The one-line refusal of ``question`` (``which``: "question 3") when it is longer than a question, else None."""
    if len(question) <= MAX_QUESTION_CHARS:
        return None
    return (f"{which} is {len(question):,} characters ({question[:40]!r}...); a question is at most "
            f"{MAX_QUESTION_CHARS:,}: ask the question itself, without the text it is about")


def provenance(batch: Any, row: int) -> list[dict[str, Any]]:
    """Question ``row``'s passages as ``{passage_id, title, score=p(z|x)}``, most probable first."""
    if not batch.passage_ids[row]:
        return []
    weights = torch.softmax(batch.doc_scores[row].detach().float(), dim=0)  # p(z|x) [n_docs]
    return [{"passage_id": batch.passage_ids[row][z], "title": batch.titles[row][z], "score": round(float(weights[z]), 4)}
            for z in weights.argsort(descending=True, stable=True).tolist()]


def answer(model: Any, questions: Sequence[str], *, n_docs: int | None = None, closed_book: bool = False,
           max_new_tokens: int = MAX_NEW_TOKENS) -> list[dict[str, Any]]:
    """One record per question (module docstring), one question at a time: the latency a user sees, no padding."""
    if isinstance(questions, str):
        raise TypeError("questions must be a list of strings; wrap a single question in a list")
    results = []
    for question in questions:
        with torch.no_grad():
            batch = model.closed_book([question]) if closed_book else model.retrieve([question], n_docs)
        text = model.generate(batch, max_new_tokens=max_new_tokens)[0]
        results.append({"question": question, "answer": text, "provenance": provenance(batch, 0)})
    return results
