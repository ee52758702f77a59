"""A RAG model on a task's dev examples: one prediction each, with provenance, and the task's metrics.

:func:`evaluate_model` retrieves and generates in batches (the model's own
``retrieve`` and ``generate``), keeps every prediction with the passages it
read, and scores them with :func:`rag_core.evaluate.metrics.score` (the
task's headline metric, and retrieval recall@k up to ``n_docs``). The
predictions file (:func:`predictions_jsonl`) is what the predictions gate
checks and what a run keeps as an artifact.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rag_core.evaluate.metrics import HEADLINE, score
from rag_core.evaluate.retrieval import retrieved_passages
from rag_core.model.answers import MAX_NEW_TOKENS, provenance
from rag_core.train.examples import Example

Progress = Callable[[int], None]  # called with the number of examples just predicted


@dataclass
class Evaluation:
    """Scores, one prediction record per example (in example order), and what it took."""

    kind: str
    scores: dict[str, float]
    predictions: list[dict[str, Any]]
    seconds: float
    index_version: str | None

    @property
    def headline(self) -> tuple[str, float]:
        """(name, value) of the task's headline dev metric, what a promotion gate compares."""
        name = HEADLINE[self.kind]
        return name, self.scores[name]

    @property
    def seconds_per_example(self) -> float:
        return self.seconds / max(1, len(self.predictions))


def evaluate_model(model: Any, examples: Sequence[Example], *, batch_size: int = 8, closed_book: bool = False,
                   max_new_tokens: int = MAX_NEW_TOKENS, mode: str = "thorough",
                   progress: Progress | None = None) -> Evaluation:
    """Predict every example (in batches of ``batch_size``) and score the predictions for its task kind.

    ``mode``: RAG-Sequence decoding, "thorough" (every candidate scored under every passage) or
    "fast" (the paper's Fast Decoding: candidates scored only under the passages whose beam found them)."""
    if not examples:
        raise ValueError("evaluate_model: no examples; give the dev split of a task")
    kinds = {e.kind for e in examples}
    if len(kinds) != 1:
        raise ValueError(f"evaluate_model: examples of several kinds {sorted(kinds)}; evaluate one task at a time")
    kind = kinds.pop()
    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    retrieved = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        questions = [e.input for e in chunk]
        with torch.no_grad():
            batch = model.closed_book(questions) if closed_book else model.retrieve(questions)
        answers = model.generate(batch, max_new_tokens=max_new_tokens, mode=mode)
        retrieved += retrieved_passages(batch.passage_ids, batch.titles, batch.texts)
        for row, (example, prediction) in enumerate(zip(chunk, answers, strict=True)):
            records.append({"id": example.id, "input": example.input, "prediction": prediction,
                            "targets": list(example.targets), "label": example.label,
                            "provenance": provenance(batch, row)})
        if progress is not None:
            progress(len(chunk))
    predictions = [r["prediction"] for r in records]
    scores = score(kind, examples, predictions, None if closed_book else retrieved)
    return Evaluation(kind, scores, records, time.perf_counter() - started,
                      None if closed_book else getattr(model, "index_version", None))


def predictions_jsonl(evaluation: Evaluation) -> bytes:
    """One JSON line per prediction record, in example order."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in evaluation.predictions).encode()
