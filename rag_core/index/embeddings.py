"""Passage embeddings on a store: one set of files per passage shard, resumable and incremental.

Layout under ``<store>/embeddings/<fingerprint_id>/<dump_id>/``::

    shard-00003.npy           float32 [n, dim] (np.save format), rows in passage order
    shard-00003.ids.parquet   passage_id, text_hash (blake2b-64 hex of title + "\\n" + text)
    shard-00003.json          n, dim, fingerprint, sha256 of the .npy, reused/encoded counts;
                              written last: a shard is done once its JSON exists

A shard is a pure function of (shard_id, num_shards): a contiguous run of the
passage table in its published order (:func:`passage_shard`). A rerun skips a
shard whose JSON records the same passages (ids and text hashes) under the same
encoder fingerprint; a run killed halfway loses only the shards without JSON.

Incremental rebuilds: :func:`load_reuse_table` indexes an earlier dump's
embeddings (same fingerprint) by text hash; :func:`embed_shard` copies the
vectors of passages whose title and text are unchanged (bit for bit) and
encodes only new or changed ones. Passages that left the dump simply are not
embedded again. Text hashes are 64-bit: a collision among 21M passages has a
probability of about 1e-5.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, Field

from rag_core.errors import StoreError
from rag_core.index.encoders import EncoderConfig, EncoderError
from rag_core.storage import Store

EMBEDDINGS_DIR = "embeddings"
PASSAGE_COLUMNS = ("passage_id", "title", "text")
_SHARD_JSON = re.compile(r"^shard-(\d{5})\.json$")

Progress = Callable[[int], None]  # called with the number of passages just finished


class PassageEncoder(Protocol):
    """What :func:`embed_shard` needs from an encoder (``rag_core.index.encoders.Encoder`` is one)."""

    fingerprint: dict[str, Any]
    fingerprint_id: str
    dim: int

    def encode_passages(self, titles: Sequence[str], texts: Sequence[str],
                        progress: Progress | None = None) -> np.ndarray: ...


class EmbedConfig(BaseModel):
    """The embedding stage's settings; also a flow parameter."""

    encoder: EncoderConfig = Field(default_factory=EncoderConfig, description="which encoder, how to run it")
    shards: int = Field(0, ge=0, description="passage shards; 0 = one per passages_per_shard")
    passages_per_shard: int = Field(20_000, ge=1, description="shard size when shards is 0")
    min_shards: int = Field(4, ge=1, description="when shards is 0: at least this many (every worker gets work)")
    reuse_from: str | None = Field(None, description="an earlier dump_id whose embeddings may be reused; "
                                   "None = the dump behind the current LATEST index, when the encoder matches")

    def num_shards(self, n_passages: int) -> int:
        """Shards for ``n_passages``: the configured count, else one per passages_per_shard, at least min_shards."""
        if self.shards:
            return self.shards
        return max(1, min(self.min_shards, n_passages), math.ceil(n_passages / self.passages_per_shard))


# -- sharding and hashing ------------------------------------------------------
def shard_bounds(n_rows: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``shard_id``: ``[id*n//k, (id+1)*n//k)``."""
    if num_shards < 1 or not 0 <= shard_id < num_shards:
        raise ValueError(f"shard {shard_id} of {num_shards}: need num_shards >= 1 and 0 <= shard_id < num_shards")
    return shard_id * n_rows // num_shards, (shard_id + 1) * n_rows // num_shards


def passage_shard(table: pa.Table, shard_id: int, num_shards: int) -> pa.Table:
    """The contiguous slice of the passage table that shard ``shard_id`` of ``num_shards`` embeds."""
    start, stop = shard_bounds(table.num_rows, shard_id, num_shards)
    return table.slice(start, stop - start)


def text_hash(title: str, text: str) -> str:
    """16 hex digits: blake2b-64 of ``title + "\\n" + text`` (what the passage vector depends on)."""
    return hashlib.blake2b(f"{title}\n{text}".encode(), digest_size=8).hexdigest()


def _hash_keys(hashes: Sequence[str]) -> np.ndarray:
    """Hex text hashes as sortable uint64."""
    return np.frombuffer(bytes.fromhex("".join(hashes)), dtype=">u8").astype(np.uint64)


def _passages_digest(ids: Sequence[str], hashes: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for pid, h in zip(ids, hashes):
        digest.update(f"{pid}\t{h}\n".encode())
    return digest.hexdigest()


# -- files -----------------------------------------------------------------------
def embeddings_store(store: Store, fingerprint_id: str, dump_id: str) -> Store:
    """The folder holding one dump's embeddings under one encoder fingerprint."""
    return store.child(EMBEDDINGS_DIR, fingerprint_id, dump_id)


def _name(shard_id: int, ext: str) -> str:
    return f"shard-{shard_id:05d}.{ext}"


def shard_record(store: Store, fingerprint_id: str, dump_id: str, shard_id: int) -> dict[str, Any] | None:
    """The JSON of a finished shard, or None when the shard is not done."""
    root = embeddings_store(store, fingerprint_id, dump_id)
    return root.read_json(_name(shard_id, "json")) if root.exists(_name(shard_id, "json")) else None


def done_shards(store: Store, fingerprint_id: str, dump_id: str) -> list[int]:
    """Ids of the shards whose JSON exists (from any shard count used on this dump)."""
    names = embeddings_store(store, fingerprint_id, dump_id).list()
    return sorted(int(m.group(1)) for m in map(_SHARD_JSON.match, names) if m)


def _read_vectors(root: Store, shard_id: int, record: dict[str, Any]) -> np.ndarray:
    data = root.read_bytes(_name(shard_id, "npy"))
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise StoreError(f"{root.url_of(_name(shard_id, 'npy'))}: corrupt (sha256 differs from its JSON); "
                         f"delete {_name(shard_id, '*')} and rerun the embedding")
    return np.load(io.BytesIO(data), allow_pickle=False)


def read_shard(store: Store, fingerprint_id: str, dump_id: str, shard_id: int) -> tuple[list[str], np.ndarray]:
    """(passage ids, float32 [n, dim] vectors) of a finished shard; the .npy is checked against its sha256."""
    root = embeddings_store(store, fingerprint_id, dump_id)
    record = shard_record(store, fingerprint_id, dump_id, shard_id)
    if record is None:
        raise StoreError(f"{root.url_of(_name(shard_id, 'json'))}: shard {shard_id} has no finished embeddings; "
                         "run the embedding stage for this dump and encoder")
    vectors = _read_vectors(root, shard_id, record)
    ids = pq.read_table(io.BytesIO(root.read_bytes(_name(shard_id, "ids.parquet"))), columns=["passage_id"])
    passage_ids = ids.column("passage_id").to_pylist()
    if vectors.shape != (record["n"], record["dim"]) or len(passage_ids) != record["n"]:
        raise StoreError(f"{root.url_of(_name(shard_id, 'json'))}: {len(passage_ids)} ids and vectors "
                         f"{vectors.shape} for n={record['n']}; delete the shard's files and rerun the embedding")
    return passage_ids, vectors


def vector_stats(vectors: np.ndarray) -> dict[str, np.ndarray]:
    """Per-vector facts a quality gate checks: L2 norm (NaN where any value is not finite) and finiteness."""
    finite = np.isfinite(vectors).all(axis=1) if vectors.size else np.ones(len(vectors), dtype=bool)
    norms = np.linalg.norm(np.where(np.isfinite(vectors), vectors, 0), axis=1) if vectors.size else np.zeros(len(vectors))
    return {"norm": np.where(finite, norms, np.nan), "finite": finite}


# -- reuse -------------------------------------------------------------------------
@dataclass
class ReuseTable:
    """An earlier dump's embeddings, indexed by text hash; vectors stay on the store until needed.

    Memory: 16 bytes per passage (sorted uint64 hashes, shard and row), about
    340 MB for 21M passages. :meth:`vectors` reads only the shards it needs.
    """

    root: Store  # embeddings/<fingerprint_id>/<dump_id>
    fingerprint_id: str
    dump_id: str
    hashes: np.ndarray  # [m] uint64, sorted
    shard: np.ndarray  # [m] int32: the shard holding each vector
    row: np.ndarray  # [m] int64: its row in that shard

    def __len__(self) -> int:
        return len(self.hashes)

    def find(self, text_hashes: Sequence[str]) -> np.ndarray:
        """Position in this table of each hash, or -1 where it is absent."""
        if not len(self.hashes) or not len(text_hashes):
            return np.full(len(text_hashes), -1, dtype=np.int64)
        keys = _hash_keys(text_hashes)
        pos = np.minimum(np.searchsorted(self.hashes, keys), len(self.hashes) - 1)
        return np.where(self.hashes[pos] == keys, pos, -1)

    def vectors(self, positions: np.ndarray) -> np.ndarray:
        """float32 [k, dim] vectors at ``positions`` (all >= 0), read shard by shard."""
        out: np.ndarray | None = None
        for shard_id in np.unique(self.shard[positions]):
            take = np.flatnonzero(self.shard[positions] == shard_id)
            record = self.root.read_json(_name(int(shard_id), "json"))
            matrix = _read_vectors(self.root, int(shard_id), record)
            if out is None:
                out = np.empty((len(positions), matrix.shape[1]), dtype=np.float32)
            out[take] = matrix[self.row[positions[take]]]
        return out if out is not None else np.empty((0, 0), dtype=np.float32)


def load_reuse_table(store: Store, fingerprint_id: str, old_dump_id: str) -> ReuseTable:
    """Index the finished shards of ``old_dump_id`` under ``fingerprint_id`` (empty when there are none)."""
    root = embeddings_store(store, fingerprint_id, old_dump_id)
    keys, shards, rows = [], [], []
    for shard_id in done_shards(store, fingerprint_id, old_dump_id):
        ids = pq.read_table(io.BytesIO(root.read_bytes(_name(shard_id, "ids.parquet"))), columns=["text_hash"])
        hashes = ids.column("text_hash").to_pylist()
        keys.append(_hash_keys(hashes))
        shards.append(np.full(len(hashes), shard_id, dtype=np.int32))
        rows.append(np.arange(len(hashes), dtype=np.int64))
    if not keys:
        empty = np.empty(0, dtype=np.uint64)
        return ReuseTable(root, fingerprint_id, old_dump_id, empty, np.empty(0, np.int32), np.empty(0, np.int64))
    all_keys = np.concatenate(keys)
    order = np.argsort(all_keys, kind="stable")
    return ReuseTable(root, fingerprint_id, old_dump_id, all_keys[order], np.concatenate(shards)[order],
                      np.concatenate(rows)[order])


# -- the stage ------------------------------------------------------------------------
def embed_shard(store: Store, dump_id: str, passages: pa.Table, encoder: PassageEncoder, shard_id: int,
                previous: ReuseTable | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Embed one shard's passages (see :func:`passage_shard`) and write its files; returns its record.

    Modes:
    - done: the shard's JSON exists for the same passages and fingerprint: nothing
      is encoded or written; the stored record comes back with ``skipped=True``;
    - fresh: every passage is encoded;
    - incremental (``previous`` given): passages whose text hash is in
      ``previous`` reuse its vector; only the others are encoded. The record
      counts ``reused`` and ``encoded``.
    The JSON is written after the .npy and .ids.parquet, so a killed run leaves
    no JSON and the next run redoes the shard.
    """
    missing = [c for c in PASSAGE_COLUMNS if c not in passages.column_names]
    if missing:
        raise ValueError(f"embed_shard: the passage table lacks columns {missing}; pass rows of read_passages()")
    if previous is not None and previous.fingerprint_id != encoder.fingerprint_id:
        raise EncoderError(f"reuse table of dump {previous.dump_id} has fingerprint {previous.fingerprint_id}, "
                           f"the encoder {encoder.fingerprint_id}; load it with the encoder's fingerprint_id")
    root = embeddings_store(store, encoder.fingerprint_id, dump_id)
    ids = passages.column("passage_id").to_pylist()
    titles = passages.column("title").to_pylist()
    texts = passages.column("text").to_pylist()
    hashes = [text_hash(t, x) for t, x in zip(titles, texts)]
    digest = _passages_digest(ids, hashes)

    record = shard_record(store, encoder.fingerprint_id, dump_id, shard_id)
    if record is not None and record.get("passages_sha256") == digest:
        if progress is not None:
            progress(len(ids))
        return {**record, "skipped": True}
    if record is not None:  # other passages (e.g. another shard count): the old files go stale first
        root.remove(_name(shard_id, "json"))

    started = time.perf_counter()
    vectors = np.empty((len(ids), encoder.dim), dtype=np.float32)
    positions = previous.find(hashes) if previous is not None else np.full(len(ids), -1, dtype=np.int64)
    reuse = np.flatnonzero(positions >= 0)
    if len(reuse):
        vectors[reuse] = previous.vectors(positions[reuse])  # type: ignore[union-attr]
        if progress is not None:
            progress(len(reuse))
    fresh = np.flatnonzero(positions < 0)
    if len(fresh):
        vectors[fresh] = encoder.encode_passages([titles[i] for i in fresh], [texts[i] for i in fresh], progress)
    seconds = time.perf_counter() - started

    buf = io.BytesIO()
    np.save(buf, vectors, allow_pickle=False)
    data = buf.getvalue()
    root.write_bytes(data, _name(shard_id, "npy"))
    table = pa.table({"passage_id": pa.array(ids, pa.string()), "text_hash": pa.array(hashes, pa.string())})
    ids_buf = io.BytesIO()
    pq.write_table(table, ids_buf, compression="zstd")
    root.write_bytes(ids_buf.getvalue(), _name(shard_id, "ids.parquet"))
    record = {
        "shard": shard_id,
        "dump_id": dump_id,
        "n": len(ids),
        "dim": encoder.dim,
        "fingerprint": encoder.fingerprint,
        "fingerprint_id": encoder.fingerprint_id,
        "sha256": hashlib.sha256(data).hexdigest(),
        "passages_sha256": digest,
        "reused": len(reuse),
        "encoded": len(fresh),
        "reused_from": previous.dump_id if previous is not None else None,
        "seconds": round(seconds, 3),
    }
    root.write_json(record, _name(shard_id, "json"))
    return {**record, "skipped": False}
