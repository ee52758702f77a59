"""Task data: the paper's tasks in their original formats, the cloze task from passages, one example type."""

from rag_core.train.cloze import ClozeConfig, ClozeTask, cloze_examples, cloze_task
from rag_core.train.examples import Example, Provenance, TaskDataError, examples_jsonl, write_examples
from rag_core.train.loaders import FEVER_LABELS, TASK_KINDS, TaskKind, load_task, task_kind

__all__ = [
    "FEVER_LABELS",
    "TASK_KINDS",
    "ClozeConfig",
    "ClozeTask",
    "Example",
    "Provenance",
    "TaskDataError",
    "TaskKind",
    "cloze_examples",
    "cloze_task",
    "examples_jsonl",
    "load_task",
    "task_kind",
    "write_examples",
]
