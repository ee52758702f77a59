"""The Great Expectations gates, run for real on real and on broken passages."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.passages import PageCounts, passages_from_pages
from tasks.quality import report_markdown, validate_counts, validate_passages, validate_unique_pages
from tests.conftest import SAMPLE_BZ2


@pytest.fixture(scope="module")
def sample_passages(wiki: Path):
    return passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))))


def test_real_passages_pass(sample_passages) -> None:
    passages, _, counts = sample_passages
    assert validate_passages(passages, 100, 0.01).success
    assert validate_counts(counts, len(set(passages["page_id"].to_pylist())), passages.num_rows).success
    assert validate_unique_pages(passages.filter(pc.equal(passages["chunk"], 0))["page_id"].to_numpy()).success


def test_broken_passages_fail_with_a_useful_report(sample_passages) -> None:
    frame = sample_passages[0].to_pandas().head(200).copy()
    frame.loc[1, "passage_id"] = frame.loc[0, "passage_id"]  # duplicate id
    frame.loc[2, "title"] = None
    frame.loc[3, "n_words"] = 101
    frame.loc[4, "text"] = ""
    frame.loc[5:10, "text"] = "leftover {{cite web|url=x}} markup"  # 6 of 200 rows: 3% > 1%
    result = validate_passages(frame, 100, 0.01)
    assert not result.success
    failed = {(f.expectation, f.column): f for f in result.failures}
    assert failed[("expect_column_values_to_be_unique", "passage_id")].unexpected == 2
    assert failed[("expect_column_values_to_not_be_null", "title")].unexpected == 1
    assert failed[("expect_column_values_to_be_between", "n_words")].examples == ["101"]
    residue = failed[("expect_column_values_to_not_match_regex", "text")]
    assert residue.unexpected == 6 and "{{cite web" in residue.examples[0]
    report = report_markdown("Passages gate", [result])
    assert "FAILED" in report and "| expect_column_values_to_be_unique | passage_id | 2 of 200 |" in report


def test_residue_below_the_threshold_passes(sample_passages) -> None:
    frame = sample_passages[0].to_pandas().head(200).copy()
    frame.loc[0, "text"] = "one passage with [[residue]]"  # 0.5%
    assert validate_passages(frame, 100, 0.01).success
    assert not validate_passages(frame, 100, 0.0).success


def test_counts_that_do_not_add_up_fail() -> None:
    counts = PageCounts(pages=10, redirects=2, other_namespace=1, articles=6, chunked=5, disambiguation=1, passages=9)
    result = validate_counts(counts, distinct_pages=4, n_passages=9)
    assert not result.success
    assert {f.column for f in result.failures} == {"pages = redirects_other_articles", "chunked = pages_in_passages"}


def test_an_article_in_two_parts_fails_the_cross_part_gate(sample_passages) -> None:
    import numpy as np

    passages = sample_passages[0]
    first = passages.filter(pc.equal(passages["chunk"], 0))["page_id"].to_numpy()
    assert validate_unique_pages(first).success
    result = validate_unique_pages(np.concatenate([first, first[:3]]))
    assert not result.success and result.failures[0].unexpected == 6
