"""Registering against one MLflow store leaves the process's tracking URI as it found it: a later command in the
same process (or a child) reads the store its own settings name, not the last one registered to."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pytest

from tasks.adapters.mlflow_registry import _tracking


def test_the_exported_uri_is_put_back_and_nothing_is_left_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine, other = f"sqlite:///{tmp_path / 'mine.db'}", f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mine)
    for _ in range(2):  # a second use must not find the first one's leftovers
        with _tracking(other):
            assert mlflow.get_tracking_uri() == other and os.environ["MLFLOW_TRACKING_URI"] == other
        assert os.environ["MLFLOW_TRACKING_URI"] == mine and mlflow.get_tracking_uri() == mine

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with _tracking(other):
        pass
    assert "MLFLOW_TRACKING_URI" not in os.environ and mlflow.get_tracking_uri() != other
