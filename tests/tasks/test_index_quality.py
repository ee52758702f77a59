"""The index stage's GX gates, each expectation made to fail on purpose (real GX validations)."""

from __future__ import annotations

import numpy as np
import pytest

from rag_core.index.build import BuiltShard, EmbeddedShard
from tasks.index_quality import (
    NORMALISED_NORMS,
    RAW_NORMS,
    norm_range,
    validate_embedding_shard,
    validate_index_counts,
    validate_recall,
)


def shard(n: int = 50, *, expected: int | None = None, dim: int = 8, norms: np.ndarray | None = None,
          finite: np.ndarray | None = None, matches: np.ndarray | None = None) -> EmbeddedShard:
    return EmbeddedShard(
        shard=0, record={}, expected=n if expected is None else expected, dim=dim,
        norm=np.ones(n) if norms is None else norms,
        finite=np.ones(n, bool) if finite is None else finite,
        matches_passage=np.ones(n, bool) if matches is None else matches,
    )


def failed(result) -> set[tuple[str, str]]:
    return {(f.expectation, f.column) for f in result.failures}


def test_healthy_embeddings_pass() -> None:
    result = validate_embedding_shard(shard(), 8, NORMALISED_NORMS)
    assert result.success and result.checked == 5 and result.rows == 50


@pytest.mark.parametrize(
    ("broken", "expected_failure"),
    [
        (dict(dim=16), ("expect_column_values_to_be_in_set", "dim")),
        (dict(finite=np.r_[np.zeros(1, bool), np.ones(49, bool)], norms=np.r_[np.nan, np.ones(49)]),
         ("expect_column_values_to_be_in_set", "finite")),
        (dict(norms=np.r_[np.full(3, 0.5), np.ones(47)]), ("expect_column_values_to_be_between", "norm")),
        (dict(matches=np.r_[np.ones(49, bool), np.zeros(1, bool)]),
         ("expect_column_values_to_be_in_set", "matches_passage")),
        (dict(expected=51), ("expect_table_row_count_to_equal", "table")),  # a passage without a vector
    ],
)
def test_each_embedding_expectation_fails_alone(broken: dict, expected_failure: tuple[str, str]) -> None:
    result = validate_embedding_shard(shard(**broken), 8, NORMALISED_NORMS)
    assert not result.success and failed(result) == {expected_failure}


def test_norm_range_follows_the_encoder() -> None:
    assert norm_range({"normalize": True}) == NORMALISED_NORMS
    assert norm_range({"normalize": False}) == RAW_NORMS
    dpr_like = shard(norms=np.full(50, 13.7))
    assert validate_embedding_shard(dpr_like, 8, RAW_NORMS).success
    assert not validate_embedding_shard(dpr_like, 8, NORMALISED_NORMS).success


def built(shard_id: int, ntotal: int, expected: int, ids_match: bool = True) -> BuiltShard:
    return BuiltShard(shard_id, None, ntotal, expected, "Flat", np.ones(3), 0.1, ids_match)  # type: ignore[arg-type]


def test_index_counts_gate() -> None:
    assert validate_index_counts([built(0, 10, 10), built(1, 12, 12)], 22).success
    short = validate_index_counts([built(0, 10, 10), built(1, 11, 12)], 22)
    assert failed(short) == {("expect_column_pair_values_to_be_equal", "ntotal = expected"),
                             ("expect_column_sum_to_be_between", "ntotal")}
    assert failed(validate_index_counts([built(0, 10, 10, ids_match=False)], 10)) == {
        ("expect_column_values_to_be_in_set", "ids_match")}


def test_recall_gate_reports_what_it_saw() -> None:
    ok = validate_recall(np.array([1.0, 0.9, 1.0, 1.0]), 0.95)
    assert ok.success and ok.observed["expect_column_mean_to_be_between(recall_at_10)"] == pytest.approx(0.975)
    low = validate_recall(np.array([0.5, 0.7]), 0.95)
    assert not low.success
    assert "observed 0.6" in low.summary() and "recall_at_10" in low.markdown()
