"""Guarantee: ``wikirag search --questions FILE --json`` answers 2,000 real questions, one line each, in input order.

The questions are NQ-open's dev set (../shared/data, read in place at test
time); the index is the small published one of the shared fixture.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.process_groups import die_with_parent
from tests.conftest import SHARED_DATA
from tests.flows.conftest import PublishedIndex

NQ_DEV = SHARED_DATA / "qa" / "nq_open" / "NQ-open.dev.jsonl"
REPO = Path(__file__).resolve().parents[2]


def nq_questions(n: int) -> list[str]:
    """The first ``n`` questions of NQ-open dev (skipped where ../shared/data is absent)."""
    if not NQ_DEV.exists():
        pytest.skip(f"NQ-open dev questions not found at {NQ_DEV} (they live beside the repo in ../shared)")
    with NQ_DEV.open(encoding="utf-8") as f:
        questions = [json.loads(line)["question"].strip() for line, _ in zip(f, range(n))]
    assert len(questions) == n
    return questions


@pytest.mark.slow
def test_2000_questions_come_back_as_2000_lines_in_input_order(published_index: PublishedIndex, tmp_path: Path,
                                                               home: Path) -> None:
    questions = nq_questions(2000)
    path = tmp_path / "questions.txt"
    path.write_text("\n".join(questions) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "cli.wikirag", "search", "--questions", str(path), "--json", "-k", "3",
                           "--store", str(published_index.store)], cwd=REPO, capture_output=True, text=True,
                          timeout=900, check=False, preexec_fn=die_with_parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2000
    answers = [json.loads(line) for line in lines]
    assert [a["question"] for a in answers] == questions
    assert all(len(a["results"]) == 3 for a in answers)
    # Each line answers its own question: the same question asked alone gets the same passages.
    alone = subprocess.run([sys.executable, "-m", "cli.wikirag", "search", questions[1234], "--json", "-k", "3",
                            "--store", str(published_index.store)], cwd=REPO, capture_output=True, text=True,
                           timeout=300, check=True, preexec_fn=die_with_parent)
    expected = [r["passage_id"] for r in json.loads(alone.stdout)["results"]]
    assert [r["passage_id"] for r in answers[1234]["results"]] == expected
