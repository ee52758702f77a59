"""Embedding files and the stage that writes them: the layout, no passage encoded twice, no file rewritten."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rag_core.errors import StoreError
from rag_core.index.embedding_files import (
    embedding_ref,
    embeddings_store,
    finished_ranges,
    range_name,
    range_record,
    read_ref,
    read_rows,
)
from rag_core.index.encoders import Encoder, EncoderError
from rag_core.index.incremental_embedding import embed_rows, load_reuse_table
from rag_core.storage import Store
from tests.conftest import S3Server
from tests.helpers.encoderfiles import CountingEncoder, tiny_encoder
from tests.helpers.passagefiles import sample_passages

pytestmark = pytest.mark.usefixtures("one_torch_thread")



@pytest.fixture(scope="module")
def table(wiki: Path) -> pa.Table:
    """40 real passages from the sample, in published order."""
    return sample_passages().slice(100, 40).select(["passage_id", "title", "text"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny")


@pytest.fixture
def encoder(tiny: Encoder) -> CountingEncoder:
    return CountingEncoder(tiny)


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file's sha256 and mtime: what 'never rewritten' is checked against."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def embed_plan(store: Store, dump_id: str, passages: pa.Table, encoder, shards: int, previous=None) -> list[dict]:
    bounds = [(s * passages.num_rows // shards, (s + 1) * passages.num_rows // shards) for s in range(shards)]
    return [embed_rows(store, dump_id, a, passages.slice(a, b - a), encoder, previous) for a, b in bounds]


def test_layout_json_last_and_reading_back(tmp_path: Path, table: pa.Table, encoder: CountingEncoder,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(str(tmp_path))
    written: list[str] = []
    original = Store.write_bytes

    def recording(self: Store, data: bytes, *parts: str) -> None:
        written.append(parts[-1])
        original(self, data, *parts)

    monkeypatch.setattr(Store, "write_bytes", recording)
    records = [embed_rows(store, "dump-a", start, table.slice(start, 20), encoder) for start in (0, 20)]
    assert [w.split(".", 1)[0] for w in written] == [range_name(0, 20)] * 3 + [range_name(20, 40)] * 3
    assert [w.rsplit(".", 1)[-1] for w in written] == ["npy", "parquet", "json"] * 2  # the record last
    folder = tmp_path / "embeddings" / encoder.fingerprint_id / "dump-a"
    assert sorted(p.name for p in folder.iterdir()) == sorted(written)
    assert records[0]["vectors"] == f"{range_name(0, 20)}.{records[0]['vectors'].split('.')[1]}.npy"
    assert [r["n"] for r in records] == [20, 20] and all(r["encoded"] == 20 and r["reused"] == 0 for r in records)
    assert records[0]["fingerprint"] == encoder.fingerprint and records[0]["dim"] == 32

    ids, vectors = read_rows(store, encoder.fingerprint_id, "dump-a", 20, 40)
    assert ids == table.column("passage_id").to_pylist()[20:]
    row = table.slice(20, 1).to_pylist()[0]
    np.testing.assert_allclose(vectors[0], encoder.encode_passages([row["title"]], [row["text"]])[0], atol=1e-5)
    assert np.load(folder / records[1]["vectors"]).shape == (20, 32)  # plain np.save format
    assert [(r["start"], r["stop"]) for r in finished_ranges(store, encoder.fingerprint_id, "dump-a")] == [(0, 20), (20, 40)]

    ref = embedding_ref(encoder.fingerprint_id, "dump-a", range_record(store, encoder.fingerprint_id, "dump-a", 0, 20))
    assert ref.vectors == f"embeddings/{encoder.fingerprint_id}/dump-a/{records[0]['vectors']}"
    ref_ids, ref_vectors = read_ref(store, ref)
    assert ref_ids == table.column("passage_id").to_pylist()[:20] and ref_vectors.shape == (20, 32)


def test_missing_and_corrupt_files_are_clear_errors(tmp_path: Path, table: pa.Table, encoder: CountingEncoder) -> None:
    store = Store(str(tmp_path))
    with pytest.raises(StoreError, match="rows 0..10 have no finished embeddings; run the embedding stage"):
        read_rows(store, encoder.fingerprint_id, "dump-a", 0, 10)
    record = embed_rows(store, "dump-a", 0, table.slice(0, 10), encoder)
    npy = tmp_path / "embeddings" / encoder.fingerprint_id / "dump-a" / record["vectors"]
    npy.write_bytes(npy.read_bytes()[:-4] + b"\0\0\0\1")
    with pytest.raises(StoreError, match=r"corrupt \(sha256 differs from its record\)"):
        read_rows(store, encoder.fingerprint_id, "dump-a", 0, 10)
    npy.unlink()
    with pytest.raises(StoreError, match="embedding file missing"):
        read_rows(store, encoder.fingerprint_id, "dump-a", 0, 10)


def test_rerun_and_other_shard_plans_encode_nothing_and_rewrite_nothing(tmp_path: Path, table: pa.Table,
                                                                        encoder: CountingEncoder) -> None:
    store = Store(str(tmp_path))
    folder = tmp_path / "embeddings" / encoder.fingerprint_id / "dump-a"
    first = embed_plan(store, "dump-a", table, encoder, 2)
    assert encoder.encoded == 40
    before = snapshot(folder)

    again = embed_plan(store, "dump-a", table, encoder, 2)
    assert all(r["skipped"] for r in again) and encoder.encoded == 40
    five = embed_plan(store, "dump-a", table, encoder, 5)  # another shard plan: ranges cut across the old ones
    three = embed_plan(store, "dump-a", table, encoder, 3)
    assert encoder.encoded == 40  # every vector copied from the ranges already done
    assert [r["reused"] for r in five + three] == [r["n"] for r in five + three]
    assert all(r["reused_from"] == {"dump-a": r["n"]} for r in five + three)
    assert {k: v for k, v in snapshot(folder).items() if k in before} == before  # old files untouched

    whole = np.concatenate([read_rows(store, encoder.fingerprint_id, "dump-a", r["start"], r["stop"])[1] for r in first])
    for plan in (five, three):
        copied = np.concatenate([read_rows(store, encoder.fingerprint_id, "dump-a", r["start"], r["stop"])[1]
                                 for r in plan])
        assert np.array_equal(copied, whole)  # bit for bit


def test_a_range_killed_before_its_record_is_redone_beside_the_leftover(tmp_path: Path, table: pa.Table,
                                                                      encoder: CountingEncoder) -> None:
    store = Store(str(tmp_path))
    root = embeddings_store(store, encoder.fingerprint_id, "dump-a")
    root.write_bytes(b"half a file", f"{range_name(0, 10)}.deadbeef.npy")  # the run died here
    assert range_record(store, encoder.fingerprint_id, "dump-a", 0, 10) is None
    record = embed_rows(store, "dump-a", 0, table.slice(0, 10), encoder)
    assert not record["skipped"] and encoder.encoded == 10 and "deadbeef" not in record["vectors"]
    assert root.read_bytes(f"{range_name(0, 10)}.deadbeef.npy") == b"half a file"  # left for gc, not overwritten
    assert read_rows(store, encoder.fingerprint_id, "dump-a", 0, 10)[1].shape == (10, 32)


def test_two_runs_racing_on_one_range_keep_each_others_files(tmp_path: Path, table: pa.Table,
                                                           encoder: CountingEncoder) -> None:
    store = Store(str(tmp_path))
    winner = embed_rows(store, "dump-a", 0, table.slice(0, 10), encoder)
    root = embeddings_store(store, encoder.fingerprint_id, "dump-a")
    record_bytes = root.read_bytes(f"{range_name(0, 10)}.json")
    root.remove(f"{range_name(0, 10)}.json")  # the loser checked before the winner's record existed
    loser = embed_rows(store, "dump-a", 0, table.slice(0, 10), encoder)
    root.write_bytes(record_bytes, f"{range_name(0, 10)}.json")
    assert loser["vectors"] != winner["vectors"]
    assert root.exists(winner["vectors"]) and root.exists(loser["vectors"])  # neither overwrote the other


def test_a_record_over_other_passages_is_an_error_not_a_rewrite(tmp_path: Path, table: pa.Table,
                                                               encoder: CountingEncoder) -> None:
    store = Store(str(tmp_path))
    embed_rows(store, "dump-a", 0, table.slice(0, 10), encoder)
    with pytest.raises(StoreError, match="records other passages for rows 0..10 of dump-a"):
        embed_rows(store, "dump-a", 0, table.slice(10, 10), encoder)


def _new_dump(table: pa.Table) -> tuple[pa.Table, set[int]]:
    """A later dump: 2 passages edited, 1 removed, 1 added (4 of 40 to encode, 10%)."""
    rows = table.to_pylist()
    rows[3]["text"] += " An edit in the new dump."
    rows[17]["title"] = rows[17]["title"] + " (film)"
    del rows[30]
    rows.insert(5, {**rows[0], "passage_id": "999-1-0", "text": "A brand new article about nothing at all."})
    return pa.Table.from_pylist(rows, schema=table.schema), {3, 17 + 1, 5}  # the insert at 5 shifts row 17


def test_a_new_dump_encodes_only_new_or_changed_passages(tmp_path: Path, table: pa.Table,
                                                         encoder: CountingEncoder) -> None:
    store = Store(str(tmp_path))
    embed_plan(store, "dump-old", table, encoder, 2)
    old = [read_rows(store, encoder.fingerprint_id, "dump-old", a, b) for a, b in ((0, 20), (20, 40))]
    old_vectors = {pid: v for ids, vectors in old for pid, v in zip(ids, vectors)}
    new, changed = _new_dump(table)
    previous = load_reuse_table(store, encoder.fingerprint_id, "dump-old")
    assert len(previous) == 40

    before = encoder.encoded
    records = embed_plan(store, "dump-new", new, encoder, 3, previous)
    assert encoder.encoded - before == 3 == sum(r["encoded"] for r in records)
    assert sum(r["reused"] for r in records) == 37 == sum(r["reused_from"]["dump-old"] for r in records)

    ids = [i for r in records for i in read_rows(store, encoder.fingerprint_id, "dump-new", r["start"], r["stop"])[0]]
    vectors = np.concatenate([read_rows(store, encoder.fingerprint_id, "dump-new", r["start"], r["stop"])[1]
                              for r in records])
    assert ids == new.column("passage_id").to_pylist()
    for i, pid in enumerate(ids):
        if i not in changed:
            assert np.array_equal(vectors[i], old_vectors[pid])  # bit for bit
        elif pid in old_vectors:
            assert not np.array_equal(vectors[i], old_vectors[pid])  # re-encoded from the edited passage
    row = new.slice(5, 1).to_pylist()[0]
    np.testing.assert_allclose(vectors[5], encoder.inner.encode_passages([row["title"]], [row["text"]])[0], atol=1e-5)

    other = CountingEncoder(encoder.inner)
    other.fingerprint_id = "f" * 16  # as an encoder with other settings would have
    with pytest.raises(EncoderError, match="load it with the encoder's fingerprint_id"):
        embed_rows(store, "dump-new", 0, new, other, previous)
    assert len(load_reuse_table(store, "0" * 16, "dump-old")) == 0


def test_files_of_the_layout_before_ranges_are_reused(tmp_path: Path, table: pa.Table,
                                                      encoder: CountingEncoder) -> None:
    store = Store(str(tmp_path))
    record = embed_rows(store, "dump-old", 0, table, encoder)
    root = embeddings_store(store, encoder.fingerprint_id, "dump-old")
    for key, ext in (("vectors", "npy"), ("ids", "ids.parquet")):  # as wikirag wrote them before ranges
        root.write_bytes(root.read_bytes(record[key]), f"shard-00000.{ext}")
        root.remove(record[key])
    root.write_json({"shard": 0, "n": 40, "sha256": record["vectors_sha256"]}, "shard-00000.json")
    root.remove(f"{range_name(0, 40)}.json")
    before = encoder.encoded
    reused = embed_rows(store, "dump-new", 0, table, encoder, load_reuse_table(store, encoder.fingerprint_id, "dump-old"))
    assert reused["reused"] == 40 and encoder.encoded == before


def test_s3_store(s3_server: S3Server, table: pa.Table, encoder: CountingEncoder) -> None:
    store = Store(f"s3://{s3_server.bucket}/embed-test", s3_server.options())
    shard = table.slice(10, 10)
    record = embed_rows(store, "dump-a", 10, shard, encoder)
    assert not record["skipped"]
    ids, vectors = read_rows(store, encoder.fingerprint_id, "dump-a", 10, 20)
    assert ids == shard.column("passage_id").to_pylist() and vectors.shape == (10, 32)
    assert embed_rows(store, "dump-a", 10, shard, encoder)["skipped"]
    assert embed_rows(store, "dump-a", 15, table.slice(15, 10), encoder)["reused_from"] == {"dump-a": 5}
    names = embeddings_store(store, encoder.fingerprint_id, "dump-a").list()
    assert sorted(names) == sorted([f"{range_name(10, 20)}.json", record["vectors"], record["ids"],
                                    *(n for n in names if n.startswith(range_name(15, 25)))])
    assert len(names) == 6
