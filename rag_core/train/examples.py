"""The one example type every task becomes, and the examples-jsonl file it round-trips through.

Every loader (NQ, TriviaQA, FEVER, the cloze task, ...) yields :class:`Example`
records, so the recipe, the metrics and the data gate see one shape whatever
the source format. ``targets`` are what the generator is trained to produce;
``answer_regex`` (CuratedTrec) and ``label`` (FEVER) are what some metrics
score against instead; ``provenance`` names the Wikipedia pages (and, for the
cloze task, the passage) that hold the answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rag_core.errors import WikiragError
from rag_core.storage import Store


class TaskDataError(WikiragError):
    """A task file cannot be read as the format its kind promises (the message names the file and line)."""


@dataclass(frozen=True)
class Provenance:
    """A Wikipedia page (and, where known, the passage) that supports an answer."""

    wikipedia_id: str | None = None  # the page id, as KILT and the passages table give it
    title: str | None = None  # the page title, spaces not underscores
    passage_id: str | None = None  # "{page_id}-{revision_id}-{chunk}" when the passage itself is known


@dataclass(frozen=True)
class Example:
    """One question (or claim, or answer to turn into a clue) and what a model should produce for it."""

    id: str  # unique within its file: the dataset's own id, else the record's position
    input: str  # what the question encoder and generator read
    targets: tuple[str, ...]  # generation targets, best first; metrics take the max over them
    kind: str  # the task kind (rag_core.train.loaders.TASK_KINDS)
    answer_regex: str | None = None  # CuratedTrec: the gold answer as a regular expression
    label: str | None = None  # FEVER: SUPPORTS / REFUTES / NOT ENOUGH INFO
    provenance: tuple[Provenance, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "input": self.input, "targets": list(self.targets), "kind": self.kind}
        if self.answer_regex is not None:
            out["answer_regex"] = self.answer_regex
        if self.label is not None:
            out["label"] = self.label
        if self.provenance:
            out["provenance"] = [{k: v for k, v in vars(p).items() if v is not None} for p in self.provenance]
        return out


def provenance_from_json(items: Iterable[Mapping[str, Any]]) -> tuple[Provenance, ...]:
    return tuple(Provenance(**{k: (None if v is None else str(v)) for k, v in item.items()
                               if k in ("wikipedia_id", "title", "passage_id")}) for item in items)


def examples_jsonl(examples: Iterable[Example]) -> bytes:
    """The examples-jsonl format (one :meth:`Example.to_json` per line) that the ``cloze`` kind loads."""
    return "".join(json.dumps(e.to_json(), ensure_ascii=False) + "\n" for e in examples).encode()


def write_examples(examples: Iterable[Example], url: str, options: Mapping[str, Any] | None = None) -> str:
    """Write examples as jsonl to a path or URL, whole or not at all (``Store.write_bytes``); returns the URL."""
    parent, _, name = url.rstrip("/").rpartition("/")
    Store(parent or ".", options or {}).write_bytes(examples_jsonl(examples), name)
    return url
