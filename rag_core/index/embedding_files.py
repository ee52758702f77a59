"""Passage embeddings on a store: write-once files addressed by what they hold.

Layout under ``<store>/embeddings/<fingerprint_id>/<dump_id>/``::

    rows-0000000000-0000002195.json                written last: the range is done once it exists
    rows-0000000000-0000002195.<w>.npy             float32 [n, dim] (np.save format), row i = passage start+i
    rows-0000000000-0000002195.<w>.ids.parquet     passage_id, text_hash (blake2b-64 hex of title + "\\n" + text)

A file's address is its content: the encoder (``fingerprint_id``), the
immutable passage set (``dump_id``) and the rows of that set it covers. A shard
of any plan is a pure function of (shard_id, num_shards): a contiguous run of
the passage table (:func:`shard_bounds`), so a rebuild with another shard count
writes other ranges beside the old ones and never touches them. ``<w>`` is a
random write id: data files are never overwritten, even by two runs racing on
one range (each version's manifest names the files it read, with their
sha256). The JSON, written last and only when absent, records n, dim, the
encoder fingerprint, the data files' names and sha256, and how many vectors
were encoded or reused. Files of the layout before ranges
(``shard-00003.{npy,ids.parquet,json}``) are still read as reuse sources.

Writing them, reusing what exists, is :mod:`rag_core.index.incremental_embedding`.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field

from rag_core.errors import StoreError
from rag_core.index.encoders import EncoderConfig
from rag_core.index.manifest import EmbeddingRef
from rag_core.parquet_bytes import parquet_to_table
from rag_core.storage import Store

EMBEDDINGS_DIR = "embeddings"
PASSAGE_COLUMNS = ("passage_id", "title", "text")
_RANGE_JSON = re.compile(r"^rows-(\d{10})-(\d{10})\.json$")
_OLD_JSON = re.compile(r"^shard-(\d{5})\.json$")  # the layout before ranges: one file set per shard id

Progress = Callable[[int], None]  # called with the number of passages just finished


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


def hash_keys(hashes: Sequence[str]) -> np.ndarray:
    """Hex text hashes as sortable uint64."""
    return np.frombuffer(bytes.fromhex("".join(hashes)), dtype=">u8").astype(np.uint64)


def passages_digest(ids: Sequence[str], hashes: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for pid, h in zip(ids, hashes):
        digest.update(f"{pid}\t{h}\n".encode())
    return digest.hexdigest()


# -- files -----------------------------------------------------------------------
def embeddings_store(store: Store, fingerprint_id: str, dump_id: str) -> Store:
    """The folder holding one passage set's embeddings under one encoder fingerprint."""
    return store.child(EMBEDDINGS_DIR, fingerprint_id, dump_id)


def range_name(start: int, stop: int) -> str:
    """``rows-<start>-<stop>``: the stem of a range's files."""
    return f"rows-{start:010d}-{stop:010d}"


def record_files(record: dict[str, Any]) -> tuple[str, str]:
    """(vectors, ids) file names of a range's record; old-layout records name them by their shard id."""
    if "vectors" in record:
        return record["vectors"], record["ids"]
    stem = f"shard-{record['shard']:05d}"
    return f"{stem}.npy", f"{stem}.ids.parquet"


def range_record(store: Store, fingerprint_id: str, dump_id: str, start: int, stop: int) -> dict[str, Any] | None:
    """The JSON of a finished range, or None when it is not done."""
    root = embeddings_store(store, fingerprint_id, dump_id)
    name = f"{range_name(start, stop)}.json"
    return root.read_json(name) if root.exists(name) else None


def _listed(root: Store) -> list[tuple[int | None, int | None, str]]:
    """(start, stop, JSON name) of each finished range in a folder, from the names alone; old-layout rows are None."""
    found: list[tuple[int | None, int | None, str]] = []
    for name in root.list():
        if m := _RANGE_JSON.match(name):
            found.append((int(m.group(1)), int(m.group(2)), name))
        elif _OLD_JSON.match(name):
            found.append((None, None, name))
    return found


def finished_ranges(store: Store, fingerprint_id: str, dump_id: str, *, overlapping: tuple[int, int] | None = None,
                    ) -> list[dict[str, Any]]:
    """Records of the finished ranges (any shard plan), by start; only those meeting ``[start, stop)`` if given.

    Old-layout records (one per shard id) carry ``start``/``stop`` None: they
    can be reused by text hash only.
    """
    root = embeddings_store(store, fingerprint_id, dump_id)
    records = []
    for start, stop, name in _listed(root):
        if overlapping is not None and (start is None or start >= overlapping[1] or stop <= overlapping[0]):
            continue
        records.append({**root.read_json(name), "start": start, "stop": stop})
    return sorted(records, key=lambda r: (r["start"] is None, r["start"] or 0, r["stop"] or 0))


def _read_checked(root: Store, name: str, sha256: str) -> bytes:
    try:
        data = root.read_bytes(name)
    except FileNotFoundError as exc:
        raise StoreError(f"{root.url_of(name)}: embedding file missing; rebuild the index version that needs it") from exc
    if hashlib.sha256(data).hexdigest() != sha256:
        raise StoreError(f"{root.url_of(name)}: corrupt (sha256 differs from its record); "
                         "delete the index versions that use it (wikirag indexes delete) and rebuild")
    return data


def _read_files(root: Store, vectors_name: str, vectors_sha: str, ids_name: str,
                ids_sha: str | None) -> tuple[list[str], list[str], np.ndarray]:
    vectors = np.load(io.BytesIO(_read_checked(root, vectors_name, vectors_sha)), allow_pickle=False)
    ids_bytes = _read_checked(root, ids_name, ids_sha) if ids_sha else root.read_bytes(ids_name)
    table = parquet_to_table(ids_bytes)
    ids, hashes = table.column("passage_id").to_pylist(), table.column("text_hash").to_pylist()
    if vectors.ndim != 2 or len(vectors) != len(ids):
        raise StoreError(f"{root.url_of(vectors_name)}: vectors {vectors.shape} for {len(ids)} ids; "
                         "delete the index versions that use it and rebuild")
    return ids, hashes, vectors


def read_record(store: Store, fingerprint_id: str, dump_id: str,
                record: dict[str, Any]) -> tuple[list[str], list[str], np.ndarray]:
    """(passage ids, text hashes, float32 [n, dim]) of a finished range; sha256-checked."""
    vectors_name, ids_name = record_files(record)
    sha = record.get("vectors_sha256", record.get("sha256"))
    return _read_files(embeddings_store(store, fingerprint_id, dump_id), vectors_name, sha, ids_name,
                       record.get("ids_sha256"))


def read_rows(store: Store, fingerprint_id: str, dump_id: str, start: int, stop: int) -> tuple[list[str], np.ndarray]:
    """(passage ids, float32 [n, dim]) of the finished range ``[start, stop)``."""
    record = range_record(store, fingerprint_id, dump_id, start, stop)
    if record is None:
        root = embeddings_store(store, fingerprint_id, dump_id)
        raise StoreError(f"{root.url_of(range_name(start, stop) + '.json')}: rows {start}..{stop} have no finished "
                         "embeddings; run the embedding stage for this passage set and encoder")
    ids, _, vectors = read_record(store, fingerprint_id, dump_id, record)
    return ids, vectors


def embedding_ref(fingerprint_id: str, dump_id: str, record: dict[str, Any]) -> EmbeddingRef:
    """The manifest's reference to a finished range's data files (store-relative paths)."""
    folder = f"{EMBEDDINGS_DIR}/{fingerprint_id}/{dump_id}"
    return EmbeddingRef(start=record["start"], stop=record["stop"], vectors=f"{folder}/{record['vectors']}",
                        vectors_sha256=record["vectors_sha256"], ids=f"{folder}/{record['ids']}",
                        ids_sha256=record["ids_sha256"])


def read_ref(store: Store, ref: EmbeddingRef) -> tuple[list[str], np.ndarray]:
    """(passage ids, float32 [n, dim]) of the files a manifest references; both files sha256-checked."""
    ids, _, vectors = _read_files(store, ref.vectors, ref.vectors_sha256, ref.ids, ref.ids_sha256)
    return ids, vectors


def vector_stats(vectors: np.ndarray) -> dict[str, np.ndarray]:
    """Per-vector facts a quality gate checks: L2 norm (NaN where any value is not finite) and finiteness."""
    finite = np.isfinite(vectors).all(axis=1) if vectors.size else np.ones(len(vectors), dtype=bool)
    norms = np.linalg.norm(np.where(np.isfinite(vectors), vectors, 0), axis=1) if vectors.size else np.zeros(len(vectors))
    return {"norm": np.where(finite, norms, np.nan), "finite": finite}


