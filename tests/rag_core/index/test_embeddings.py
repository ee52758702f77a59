"""Per-shard embedding files: layout, resume after a kill, incremental reuse, S3."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import rag_core
from rag_core.errors import StoreError
from rag_core.index.embeddings import (
    EmbedConfig,
    embed_shard,
    embeddings_store,
    load_reuse_table,
    passage_shard,
    read_shard,
    shard_record,
    text_hash,
)
from rag_core.index.encoders import Encoder, EncoderConfig, EncoderError
from rag_core.storage import Store
from tests.conftest import SAMPLE_BZ2, S3Server


class CountingEncoder:
    """The real encoder, counting the passages it is asked to encode."""

    def __init__(self, inner: Encoder) -> None:
        self.inner = inner
        self.fingerprint, self.fingerprint_id, self.dim = inner.fingerprint, inner.fingerprint_id, inner.dim
        self.calls = 0
        self.encoded = 0

    def encode_passages(self, titles: Sequence[str], texts: Sequence[str], progress=None) -> np.ndarray:
        self.calls += 1
        self.encoded += len(texts)
        return self.inner.encode_passages(titles, texts, progress)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def table(wiki: Path) -> pa.Table:
    """40 real passages from the sample, in published order."""
    passages, _, _ = rag_core.passages_from_pages(rag_core.iter_pages(rag_core.DumpSource(str(SAMPLE_BZ2))))
    return passages.slice(100, 40)


@pytest.fixture(scope="module")
def minilm() -> Encoder:
    return Encoder.load(EncoderConfig(batch_size=16))


@pytest.fixture
def encoder(minilm: Encoder) -> CountingEncoder:
    return CountingEncoder(minilm)


def test_shards_cover_every_row_once() -> None:
    for n in (0, 1, 7, 40, 1001):
        t = pa.table({"passage_id": [str(i) for i in range(n)]})
        for k in (1, 2, 3, 7, 50):
            parts = [passage_shard(t, s, k) for s in range(k)]
            assert sum((p.column("passage_id").to_pylist() for p in parts), []) == t.column("passage_id").to_pylist()
            assert max(p.num_rows for p in parts) - min(p.num_rows for p in parts) <= 1
            assert passage_shard(t, k - 1, k).equals(parts[-1])  # pure: same answer every time
    with pytest.raises(ValueError, match="0 <= shard_id < num_shards"):
        passage_shard(pa.table({"passage_id": ["a"]}), 3, 3)
    assert EmbedConfig(passages_per_shard=10).num_shards(41) == 5 and EmbedConfig(shards=3).num_shards(41) == 3


def test_layout_with_the_json_written_last(tmp_path: Path, table: pa.Table, encoder: CountingEncoder,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(str(tmp_path / "store"))
    written: list[str] = []
    original = Store.write_bytes

    def recording(self: Store, data: bytes, *parts: str) -> None:
        written.append(parts[-1])
        original(self, data, *parts)

    monkeypatch.setattr(Store, "write_bytes", recording)
    small = table.slice(0, 20)
    records = [embed_shard(store, "dump-a", passage_shard(small, s, 2), encoder, s) for s in range(2)]
    assert written == ["shard-00000.npy", "shard-00000.ids.parquet", "shard-00000.json",
                       "shard-00001.npy", "shard-00001.ids.parquet", "shard-00001.json"]
    folder = tmp_path / "store" / "embeddings" / encoder.fingerprint_id / "dump-a"
    assert sorted(p.name for p in folder.iterdir()) == sorted(written)
    assert [r["n"] for r in records] == [10, 10] and all(r["encoded"] == 10 and r["reused"] == 0 for r in records)
    assert records[0]["fingerprint"] == encoder.fingerprint and records[0]["dim"] == 384

    ids, vectors = read_shard(store, encoder.fingerprint_id, "dump-a", 1)
    assert ids == small.column("passage_id").to_pylist()[10:]
    assert vectors.dtype == np.float32 and vectors.shape == (10, 384)
    first = passage_shard(small, 1, 2).to_pylist()[0]
    assert _cosine(vectors[0], encoder.inner.encode_passages([first["title"]], [first["text"]])[0]) > 0.999
    assert np.load(folder / "shard-00001.npy").shape == (10, 384)  # plain np.save format


def test_rerun_skips_a_finished_shard(tmp_path: Path, table: pa.Table, encoder: CountingEncoder) -> None:
    store, small = Store(str(tmp_path)), table.slice(0, 20)
    embed_shard(store, "dump-a", small, encoder, 0)
    npy = tmp_path / "embeddings" / encoder.fingerprint_id / "dump-a" / "shard-00000.npy"
    mtime, calls = npy.stat().st_mtime_ns, encoder.calls
    again = embed_shard(store, "dump-a", small, encoder, 0)
    assert again["skipped"] and encoder.calls == calls and npy.stat().st_mtime_ns == mtime
    # the same shard id over other passages (e.g. another shard count) is not "done"
    redone = embed_shard(store, "dump-a", small.slice(0, 5), encoder, 0)
    assert not redone["skipped"] and redone["n"] == 5 and encoder.calls == calls + 1


def test_a_shard_killed_before_its_json_is_redone(tmp_path: Path, table: pa.Table, encoder: CountingEncoder) -> None:
    store = Store(str(tmp_path))
    shard = passage_shard(table, 0, 4)
    root = embeddings_store(store, encoder.fingerprint_id, "dump-a")
    root.write_bytes(b"half a file", "shard-00000.npy")  # the run died here
    assert shard_record(store, encoder.fingerprint_id, "dump-a", 0) is None
    with pytest.raises(StoreError, match="no finished embeddings; run the embedding stage"):
        read_shard(store, encoder.fingerprint_id, "dump-a", 0)
    record = embed_shard(store, "dump-a", shard, encoder, 0)
    assert not record["skipped"] and encoder.encoded == shard.num_rows
    assert read_shard(store, encoder.fingerprint_id, "dump-a", 0)[1].shape == (shard.num_rows, 384)

    npy = tmp_path / "embeddings" / encoder.fingerprint_id / "dump-a" / "shard-00000.npy"
    npy.write_bytes(npy.read_bytes()[:-4] + b"\0\0\0\1")
    with pytest.raises(StoreError, match=r"corrupt \(sha256 differs from its JSON\)"):
        read_shard(store, encoder.fingerprint_id, "dump-a", 0)


def _new_dump(table: pa.Table) -> tuple[pa.Table, set[int]]:
    """A later dump: 2 passages edited, 1 removed, 1 added (4 of 40 to encode, 10%)."""
    rows = table.to_pylist()
    rows[3]["text"] += " An edit in the new dump."
    rows[17]["title"] = rows[17]["title"] + " (film)"
    del rows[30]
    rows.insert(5, {**rows[0], "passage_id": "999-1-0", "text": "A brand new article about nothing at all."})
    return pa.Table.from_pylist(rows, schema=table.schema), {3, 17 + 1, 5}  # the insert at 5 shifts row 17


def test_incremental_rebuild_encodes_only_new_or_changed(tmp_path: Path, table: pa.Table,
                                                         encoder: CountingEncoder) -> None:
    store = Store(str(tmp_path))
    for s in range(2):
        embed_shard(store, "dump-old", passage_shard(table, s, 2), encoder, s)
    old = [read_shard(store, encoder.fingerprint_id, "dump-old", s) for s in range(2)]
    old_vectors = {pid: v for ids, vectors in old for pid, v in zip(ids, vectors)}
    new, changed = _new_dump(table)
    previous = load_reuse_table(store, encoder.fingerprint_id, "dump-old")
    assert len(previous) == 40

    before = encoder.encoded
    records = [embed_shard(store, "dump-new", passage_shard(new, s, 3), encoder, s, previous=previous)
               for s in range(3)]
    assert encoder.encoded - before == 3 == sum(r["encoded"] for r in records)
    assert sum(r["reused"] for r in records) == 37 and records[0]["reused_from"] == "dump-old"

    ids = sum((read_shard(store, encoder.fingerprint_id, "dump-new", s)[0] for s in range(3)), [])
    vectors = np.concatenate([read_shard(store, encoder.fingerprint_id, "dump-new", s)[1] for s in range(3)])
    assert ids == new.column("passage_id").to_pylist()
    for i, pid in enumerate(ids):
        if i not in changed:
            assert np.array_equal(vectors[i], old_vectors[pid])  # bit for bit
        elif pid in old_vectors:
            assert not np.array_equal(vectors[i], old_vectors[pid])  # re-encoded from the edited passage
    row = new.slice(5, 1).to_pylist()[0]
    assert _cosine(vectors[5], encoder.inner.encode_passages([row["title"]], [row["text"]])[0]) > 0.999
    assert text_hash("a", "b") != text_hash("a\nb", "") and len(text_hash("a", "b")) == 16

    other = CountingEncoder(encoder.inner)
    other.fingerprint_id = "f" * 16  # as an encoder with other settings would have
    with pytest.raises(EncoderError, match="load it with the encoder's fingerprint_id"):
        embed_shard(store, "dump-new", new, other, 0, previous=previous)
    assert len(load_reuse_table(store, "0" * 16, "dump-old")) == 0


def test_s3_store(s3_server: S3Server, table: pa.Table, encoder: CountingEncoder) -> None:
    store = Store(f"s3://{s3_server.bucket}/embeddings-test", s3_server.options())
    shard = passage_shard(table, 1, 4)
    record = embed_shard(store, "dump-a", shard, encoder, 1)
    assert not record["skipped"]
    ids, vectors = read_shard(store, encoder.fingerprint_id, "dump-a", 1)
    assert ids == shard.column("passage_id").to_pylist() and vectors.shape == (10, 384)
    assert embed_shard(store, "dump-a", shard, encoder, 1)["skipped"]
    assert sorted(embeddings_store(store, encoder.fingerprint_id, "dump-a").list()) == [
        "shard-00001.ids.parquet", "shard-00001.json", "shard-00001.npy"]
