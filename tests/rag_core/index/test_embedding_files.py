"""Sharding a passage set and hashing passages (the files themselves: tests/rag_core/index/test_incremental_embedding.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rag_core.index.embedding_files import (
    EmbedConfig,
    passage_shard,
    text_hash,
)


def test_shards_cover_every_row_once() -> None:
    for n in (0, 1, 7, 40, 1001):
        t = pa.table({"passage_id": [str(i) for i in range(n)]})
        for k in (1, 2, 3, 7, 50):
            parts = [passage_shard(t, s, k) for s in range(k)]
            assert [i for p in parts for i in p.column("passage_id").to_pylist()] == t.column("passage_id").to_pylist()
            assert max(p.num_rows for p in parts) - min(p.num_rows for p in parts) <= 1
            assert passage_shard(t, k - 1, k).equals(parts[-1])  # pure: same answer every time
    with pytest.raises(ValueError, match="0 <= shard_id < num_shards"):
        passage_shard(pa.table({"passage_id": ["a"]}), 3, 3)
    assert EmbedConfig(passages_per_shard=10).num_shards(41) == 5 and EmbedConfig(shards=3).num_shards(41) == 3
    assert text_hash("a", "b") != text_hash("a\nb", "") and len(text_hash("a", "b")) == 16
