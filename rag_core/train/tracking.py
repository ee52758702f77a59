"""What a training or evaluation run reports, and to whom: a small interface, implemented outside rag_core.

The recipe talks to a :class:`RunLogger`; ``tasks/adapters/mlflow_tracking.py`` implements it
over MLflow, :class:`MemoryLogger` keeps everything in memory (tests,
notebooks), :class:`NullLogger` drops it (ranks other than 0). rag_core never
imports MLflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class RunLogger(Protocol):
    """A tracked run: parameters once, metrics per step, files, tags."""

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...


class NullLogger:
    """Reports nothing: what every rank but 0 gets."""

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass


@dataclass
class MemoryLogger:
    """Keeps what a run reports, for tests and notebooks."""

    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, list[tuple[int | None, float]]] = field(default_factory=dict)  # name -> [(step, value)]
    artifacts: list[tuple[str, str | None]] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.params.update(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        for name, value in metrics.items():
            self.metrics.setdefault(name, []).append((step, float(value)))

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        self.artifacts.append((str(path), folder))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.tags.update(tags)
