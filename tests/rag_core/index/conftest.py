"""Fixtures shared by the index tests."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.vectors import clustered_vectors, exact_topk


@pytest.fixture(scope="module")
def overlapping() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8k vectors in 20 overlapping clusters (32-d), where approximate search needs a wide setting, and 300
    fresh queries from the same clusters with their exact top-10."""
    x = clustered_vectors(8_300, 32, seed=5, clusters=20, spread=1.0)
    return x[:8_000], x[8_000:], exact_topk(x[:8_000], x[8_000:], 10)
