"""The real QA files in ../shared/data/qa (tests skip with the reason where a clone has none)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

QA = SHARED_DATA / "qa"


def qa_file(relative: str) -> Path:
    path = QA / relative
    if not path.exists():
        pytest.skip(f"real QA data not found at {path} (it lives beside the repo in ../shared/data/qa)")
    return path
