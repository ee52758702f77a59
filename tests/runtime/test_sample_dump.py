"""The real sample comes from the gensim wheel on PyPI, verified by sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from runtime.sample_dump import SAMPLE_NAME, SAMPLE_SHA256, fetch_sample

pytestmark = pytest.mark.slow


def test_fetch_verifies_and_replaces_a_damaged_copy(tmp_path: Path) -> None:
    path = fetch_sample(tmp_path)
    assert path == tmp_path / SAMPLE_NAME
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SAMPLE_SHA256
    stamp = path.stat().st_mtime_ns
    assert fetch_sample(tmp_path).stat().st_mtime_ns == stamp  # kept, not downloaded again

    path.write_bytes(path.read_bytes()[:1000])  # a damaged copy is fetched anew
    assert hashlib.sha256(fetch_sample(tmp_path).read_bytes()).hexdigest() == SAMPLE_SHA256
    assert [p.name for p in tmp_path.iterdir()] == [SAMPLE_NAME]  # no leftovers
