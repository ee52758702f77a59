"""Timed probes' verdicts, kept per machine in the user's cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rag_core.perf.probes import cached_probe, kept_probe, probe_cache_path


def test_a_probe_is_timed_once_per_machine_and_kept_in_the_users_cache(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    timed: list[str] = []

    def probe(value: float):
        return lambda: timed.append(f"{value}") or value

    assert cached_probe("matmul", probe(1.7)) == 1.7
    assert cached_probe("matmul", probe(9.9)) == 1.7  # read back, not timed again
    assert cached_probe("linear", probe(0.8)) == 0.8  # another probe: its own verdict
    assert timed == ["1.7", "0.8"]
    assert (kept_probe("matmul"), kept_probe("never timed")) == (1.7, None)
    kept = json.loads(probe_cache_path().read_text())
    assert probe_cache_path() == tmp_path / "wikirag" / "probes.json"
    assert sorted((e["probe"], e["value"]) for e in kept.values()) == [("linear", 0.8), ("matmul", 1.7)]
    # The same CPU with its kernels held to another instruction set measures differently: a machine of its own.
    # (SSE41: a limit that no run of this suite sets, where CI itself holds oneDNN to AVX2.)
    held = os.environ.get("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")
    assert cached_probe("matmul", probe(0.02)) == 0.02
    if held is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", held)
    assert cached_probe("matmul", probe(9.9)) == 1.7
    assert timed == ["1.7", "0.8", "0.02"]


def test_a_damaged_or_unwritable_probe_cache_costs_only_the_measurement(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = probe_cache_path()
    path.parent.mkdir(parents=True)
    path.write_text("{torn")
    assert cached_probe("matmul", lambda: 2.0) == 2.0
    assert cached_probe("matmul", lambda: 3.0) == 2.0  # the torn file was replaced by a whole one
    entries = json.loads(path.read_text())
    path.write_text(json.dumps({k: {**e, "value": "fast"} for k, e in entries.items()}))
    assert cached_probe("matmul", lambda: 4.0) == 4.0  # a verdict that is not a number is measured again
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # nothing can be read or written under it
    assert cached_probe("matmul", lambda: 5.0) == 5.0
    assert cached_probe("matmul", lambda: 6.0) == 6.0
