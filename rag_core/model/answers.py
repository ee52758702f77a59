"""Answers with provenance: what `wikirag ask`, the evaluation and the registered MLflow model return.

One record per question, in input order::

    {"question": ..., "answer": ..., "provenance": [{"passage_id", "title", "score", "similarity"}, ...]}

``score`` is p(z|x), the softmax of the model's doc_scores, and provenance is
in the model's own order of it (highest first); closed-book answers have none.
``similarity`` is the doc score itself, question vector . passage vector (a
cosine for a normalising encoder such as the default MiniLM). Over a model's
few passages p(z|x) stays near uniform (about 0.5 / 0.5 for two), so it says
little about whether the index holds an answer at all; the similarity does
(bench/weak_match.py): :func:`weak_match` compares the top one with the
threshold measured for the encoder, where there is one.
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
    """The one-line refusal of ``question`` (``which``: "question 3", "questions.txt line 7") when it is longer
    than a question, else None."""
    if len(question) <= MAX_QUESTION_CHARS:
        return None
    return (f"{which} is {len(question):,} characters ({question[:40]!r}...); a question is at most "
            f"{MAX_QUESTION_CHARS:,}: ask the question itself, without the text it is about")


# Below this top-passage similarity, a question is one the index likely does not answer (per encoder name: a
# cosine's spread depends on the model). Picked on dev by bench/weak_match.py, which reports test beside it.
WEAK_MATCH = {"all-MiniLM-L6-v2": 0.50}


def weak_match_note(model: Any, record: dict[str, Any]) -> str | None:
    """What ``ask`` and the main job's summary print under an answer whose top passage is a weak match
    (:func:`weak_match`), else None."""
    threshold = weak_match(model, record)
    if threshold is None:
        return None
    best = max(hit["similarity"] for hit in record["provenance"])
    return (f"weak match: the closest passage's similarity is {best:.3f}, under {threshold:.2f}: the index likely "
            "does not hold this answer")


def provenance(batch: Any, row: int) -> list[dict[str, Any]]:
    """Question ``row``'s passages as ``{passage_id, title, score=p(z|x), similarity}``, most probable first."""
    if not batch.passage_ids[row]:
        return []
    scores = batch.doc_scores[row].detach().float()  # [n_docs]
    weights = torch.softmax(scores, dim=0)  # p(z|x)
    return [{"passage_id": batch.passage_ids[row][z], "title": batch.titles[row][z],
             "score": round(float(weights[z]), 4), "similarity": round(float(scores[z]), 4)}
            for z in weights.argsort(descending=True, stable=True).tolist()]


def weak_match(model: Any, record: dict[str, Any]) -> float | None:
    """The threshold that ``record``'s top similarity falls below, when the model's encoder has one measured and
    it does (the index likely holds no answer: the reply is the generator's guess); else None."""
    encoder = getattr(getattr(model, "question_encoder", None), "base_fingerprint", {}).get("name")
    threshold = WEAK_MATCH.get(encoder)
    if threshold is None or not record["provenance"]:
        return None
    return threshold if max(hit["similarity"] for hit in record["provenance"]) < threshold else None


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
