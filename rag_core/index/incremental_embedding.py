"""The embedding stage: embed a range of a passage set without encoding any passage twice.

:func:`embed_rows` writes one range's files (layout: :mod:`rag_core.index.embedding_files`):

- a range already done (same passages) is skipped;
- rows that finished ranges of the same passage set hold (another shard plan)
  are copied from them;
- rows whose title and text are unchanged in an earlier passage set
  (:func:`load_reuse_table`, by text hash) are copied from it;
- only the rest is encoded.

Text hashes are 64-bit: a collision among 21M passages has a probability of
about 1e-5.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from rag_core.errors import StoreError
from rag_core.index.embedding_files import (
    PASSAGE_COLUMNS,
    Progress,
    embeddings_store,
    finished_ranges,
    hash_keys,
    passages_digest,
    range_name,
    range_record,
    read_record,
    record_files,
    text_hash,
)
from rag_core.index.encoders import EncoderError
from rag_core.parquet_bytes import parquet_to_table, table_to_parquet
from rag_core.storage import Store


class PassageEncoder(Protocol):
    """What :func:`embed_rows` needs from an encoder (``rag_core.index.encoders.Encoder`` is one)."""

    fingerprint: dict[str, Any]
    fingerprint_id: str
    dim: int

    def encode_passages(self, titles: Sequence[str], texts: Sequence[str],
                        progress: Progress | None = None) -> np.ndarray: ...


# -- reuse across passage sets ------------------------------------------------------
@dataclass
class ReuseTable:
    """An earlier passage set's embeddings, indexed by text hash; vectors stay on the store until needed.

    Memory: 16 bytes per passage (sorted uint64 hashes, record and row), about
    340 MB for 21M passages. :meth:`vectors` reads only the files it needs.
    """

    store: Store
    fingerprint_id: str
    dump_id: str
    records: list[dict[str, Any]]
    hashes: np.ndarray  # [m] uint64, sorted
    record: np.ndarray  # [m] int32: the record holding each vector
    row: np.ndarray  # [m] int64: its row in that record's files

    def __len__(self) -> int:
        return len(self.hashes)

    def find(self, text_hashes: Sequence[str]) -> np.ndarray:
        """Position in this table of each hash, or -1 where it is absent."""
        if not len(self.hashes) or not len(text_hashes):
            return np.full(len(text_hashes), -1, dtype=np.int64)
        keys = hash_keys(text_hashes)
        pos = np.minimum(np.searchsorted(self.hashes, keys), len(self.hashes) - 1)
        return np.where(self.hashes[pos] == keys, pos, -1)

    def vectors(self, positions: np.ndarray, dim: int) -> np.ndarray:
        """float32 [k, dim] vectors at ``positions`` (all >= 0), read record by record."""
        out = np.empty((len(positions), dim), dtype=np.float32)
        for index in np.unique(self.record[positions]):
            take = np.flatnonzero(self.record[positions] == index)
            _, _, matrix = read_record(self.store, self.fingerprint_id, self.dump_id, self.records[int(index)])
            out[take] = matrix[self.row[positions[take]]]
        return out


def load_reuse_table(store: Store, fingerprint_id: str, old_dump_id: str) -> ReuseTable:
    """Index the finished ranges of ``old_dump_id`` under ``fingerprint_id`` (empty when there are none)."""
    root = embeddings_store(store, fingerprint_id, old_dump_id)
    records = finished_ranges(store, fingerprint_id, old_dump_id)
    keys, owners, rows = [np.empty(0, np.uint64)], [np.empty(0, np.int32)], [np.empty(0, np.int64)]
    for index, record in enumerate(records):
        hashes = parquet_to_table(root.read_bytes(record_files(record)[1]), ["text_hash"])
        hashes = hashes.column("text_hash").to_pylist()
        keys.append(hash_keys(hashes))
        owners.append(np.full(len(hashes), index, dtype=np.int32))
        rows.append(np.arange(len(hashes), dtype=np.int64))
    all_keys = np.concatenate(keys)
    order = np.argsort(all_keys, kind="stable")
    return ReuseTable(store, fingerprint_id, old_dump_id, records, all_keys[order], np.concatenate(owners)[order],
                      np.concatenate(rows)[order])


# -- the stage ------------------------------------------------------------------------
def _copy_overlaps(store: Store, fingerprint_id: str, dump_id: str, start: int, ids: list[str],
                   vectors: np.ndarray, missing: np.ndarray) -> int:
    """Copy rows that finished ranges of the same passage set (other shard plans) hold; returns the count."""
    stop, copied = start + len(ids), 0
    for record in finished_ranges(store, fingerprint_id, dump_id, overlapping=(start, stop)):
        lo, hi = max(start, record["start"]), min(stop, record["stop"])
        if not missing[lo - start:hi - start].any():
            continue
        their_ids, _, matrix = read_record(store, fingerprint_id, dump_id, record)
        ours, theirs = slice(lo - start, hi - start), slice(lo - record["start"], hi - record["start"])
        if their_ids[theirs] != ids[ours]:  # a passage set never changes under its id; never trust it blindly
            continue
        take = np.flatnonzero(missing[ours]) + (lo - start)
        vectors[take] = matrix[take - (lo - start) + (lo - record["start"])]
        missing[take] = False
        copied += len(take)
    return copied


def embed_rows(store: Store, dump_id: str, start: int, passages: pa.Table, encoder: PassageEncoder,
               previous: ReuseTable | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Embed rows ``[start, start + len(passages))`` of passage set ``dump_id``; returns the range's record.

    Modes:
    - done: the range's JSON exists for the same passages: nothing is encoded
      or written; the stored record comes back with ``skipped=True``;
    - fresh: every passage is encoded;
    - reuse: rows that finished ranges of the same passage set hold are copied,
      then (``previous`` given) passages whose text hash is in ``previous``;
      only the others are encoded. The record counts ``reused`` (per source
      passage set in ``reused_from``) and ``encoded``.
    The data files get a fresh write id and the JSON is written last and only
    when absent, so a killed run leaves no JSON (the next run redoes the range)
    and no file a published version reads is ever rewritten.
    """
    missing_columns = [c for c in PASSAGE_COLUMNS if c not in passages.column_names]
    if missing_columns:
        raise ValueError(f"embed_rows: the passage table lacks columns {missing_columns}; pass rows of read_passages()")
    if previous is not None and previous.fingerprint_id != encoder.fingerprint_id:
        raise EncoderError(f"reuse table of dump {previous.dump_id} has fingerprint {previous.fingerprint_id}, "
                           f"the encoder {encoder.fingerprint_id}; load it with the encoder's fingerprint_id")
    fp, stop = encoder.fingerprint_id, start + passages.num_rows
    root, stem = embeddings_store(store, fp, dump_id), range_name(start, start + passages.num_rows)
    ids = passages.column("passage_id").to_pylist()
    titles = passages.column("title").to_pylist()
    texts = passages.column("text").to_pylist()
    hashes = [text_hash(t, x) for t, x in zip(titles, texts)]
    digest = passages_digest(ids, hashes)

    record = range_record(store, fp, dump_id, start, stop)
    if record is not None:
        if record["passages_sha256"] != digest:
            raise StoreError(f"{root.url_of(stem + '.json')}: records other passages for rows {start}..{stop} of "
                             f"{dump_id}; a passage set never changes under its id: the store is inconsistent")
        if progress is not None:
            progress(len(ids))
        return {**record, "skipped": True}

    started = time.perf_counter()
    vectors = np.empty((len(ids), encoder.dim), dtype=np.float32)
    missing = np.ones(len(ids), dtype=bool)
    reused_from: dict[str, int] = {}
    if copied := _copy_overlaps(store, fp, dump_id, start, ids, vectors, missing):
        reused_from[dump_id] = copied
    if previous is not None and missing.any():
        todo = np.flatnonzero(missing)
        positions = previous.find([hashes[i] for i in todo])
        found = todo[positions >= 0]
        if len(found):
            vectors[found] = previous.vectors(positions[positions >= 0], encoder.dim)
            missing[found] = False
            reused_from[previous.dump_id] = len(found)
    reused = len(ids) - int(missing.sum())
    if progress is not None and reused:
        progress(reused)
    fresh = np.flatnonzero(missing)
    if len(fresh):
        vectors[fresh] = encoder.encode_passages([titles[i] for i in fresh], [texts[i] for i in fresh], progress)
    seconds = time.perf_counter() - started

    write_id = secrets.token_hex(4)
    buf = io.BytesIO()
    np.save(buf, vectors, allow_pickle=False)
    data = buf.getvalue()
    ids_bytes = table_to_parquet(
        pa.table({"passage_id": pa.array(ids, pa.string()), "text_hash": pa.array(hashes, pa.string())}),
        compression="zstd")
    names = {"vectors": f"{stem}.{write_id}.npy", "ids": f"{stem}.{write_id}.ids.parquet"}
    root.write_bytes(data, names["vectors"])
    root.write_bytes(ids_bytes, names["ids"])
    record = {
        "start": start, "stop": stop, "dump_id": dump_id, "n": len(ids), "dim": encoder.dim,
        "fingerprint": encoder.fingerprint, "fingerprint_id": fp, **names,
        "vectors_sha256": hashlib.sha256(data).hexdigest(), "ids_sha256": hashlib.sha256(ids_bytes).hexdigest(),
        "passages_sha256": digest, "reused": reused, "reused_from": reused_from, "encoded": len(fresh),
        "seconds": round(seconds, 3),
    }
    if range_record(store, fp, dump_id, start, stop) is None:  # a racing run may have finished first: keep its JSON
        root.write_json(record, f"{stem}.json")
    return {**record, "skipped": False}
