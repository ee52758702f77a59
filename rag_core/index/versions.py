"""Index versions on a store: shard files, a manifest written last, and a LATEST pointer.

One FAISS index per passage shard. Row ``i`` of a shard's index is the shard's
``i``-th passage: ids are resolved through the shard's ids file, never through
FAISS ids (no ``IndexIDMap``: string passage ids do not fit in int64, and the
row order is already stored beside the index). Layout under ``<store>/indexes/``::

    <version>/shard-00000.faiss          faiss.serialize_index bytes of shard 0
    <version>/shard-00000.ids.parquet    passage_id (+ title, text), in FAISS row order
    <version>/manifest.json              written last: the version exists once it does
    LATEST                               {"version": ...}; moved only after the manifest exists

Versions are ``20261130T114501.123Z-1a2b3c4d`` (UTC time to the millisecond,
then random hex): they sort by creation time and do not collide. Shard files may
be written by different workers (:func:`write_shard`); :func:`publish_manifest`
then makes the version visible and moves LATEST. A crash before the manifest
leaves files that no reader lists or loads; :func:`delete_version` removes them.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rag_core.errors import WikiragError
from rag_core.index.faiss_index import METRICS, IndexBuildError, sha256_hex
from rag_core.storage import Store

INDEXES_DIR = "indexes"
MANIFEST = "manifest.json"
LATEST = "LATEST"
MANIFEST_FORMAT = 1
_VERSION_NAME = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]*$")
_RESERVED_FIELDS = ("format", "version", "created_at", "count", "shards")


class IndexVersionError(WikiragError):
    """An index version is missing, misnamed, or cannot be published or deleted."""


class CorruptShardError(WikiragError):
    """A shard's files do not match what its manifest recorded."""


@dataclass(frozen=True)
class ShardPayload:
    """One shard to publish: its serialized index and its passages in row order."""

    index_bytes: bytes
    passages: pa.Table  # passage_id (+ title, text); row i is FAISS row i
    meta: Mapping[str, Any] = field(default_factory=dict)  # recorded in the manifest (e.g. resolved factory)

    @classmethod
    def of(cls, shard: ShardPayload | Sequence[Any]) -> ShardPayload:
        """Accept a ShardPayload or a tuple ``(index_bytes, passage_ids | table[, meta])``."""
        if isinstance(shard, ShardPayload):
            return shard
        index_bytes, passages, *rest = shard
        if not isinstance(passages, pa.Table):
            passages = pa.table({"passage_id": pa.array([str(p) for p in passages], pa.string())})
        return cls(bytes(index_bytes), passages, dict(rest[0]) if rest and rest[0] else {})


def new_version_id(now: dt.datetime | None = None) -> str:
    """``YYYYMMDDTHHMMSS.mmmZ-xxxxxxxx``: sorts by UTC creation time (to the millisecond); the hex keeps it unique."""
    now = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    return f"{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{secrets.token_hex(4)}"


def _check_name(version: str) -> str:
    if not isinstance(version, str) or not _VERSION_NAME.match(version) or version == LATEST:
        raise IndexVersionError(f"{version!r} is not an index version name (e.g. 20261130T114501.123Z-1a2b3c4d)")
    return version


def shard_names(shard: int) -> tuple[str, str]:
    return f"shard-{shard:05d}.faiss", f"shard-{shard:05d}.ids.parquet"


def write_shard(store: Store, version: str, shard: int, payload: ShardPayload | Sequence[Any]) -> dict[str, Any]:
    """Write one shard's two files into an unpublished version; returns its manifest entry."""
    payload = ShardPayload.of(payload)
    root = store.child(INDEXES_DIR, _check_name(version))
    if root.exists(MANIFEST):
        raise IndexVersionError(f"{root.url}: version {version} is already published; versions are immutable")
    table = payload.passages
    if "passage_id" not in table.column_names:
        raise IndexBuildError(f"shard {shard}: the passages table needs a passage_id column, has {table.column_names}")
    table = pa.table({c: table.column(c).cast(pa.string()) for c in ("passage_id", "title", "text")
                      if c in table.column_names})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    ids_bytes = sink.getvalue()
    index_name, ids_name = shard_names(shard)
    root.write_bytes(payload.index_bytes, index_name)
    root.write_bytes(ids_bytes, ids_name)
    return {
        "shard": shard, "url": index_name, "ids_url": ids_name, "count": table.num_rows,
        "bytes": len(payload.index_bytes), "sha256": sha256_hex(payload.index_bytes),
        "ids_sha256": sha256_hex(ids_bytes), "columns": table.column_names, "meta": dict(payload.meta),
    }


def publish_manifest(
    store: Store, version: str, entries: Sequence[Mapping[str, Any]], manifest_fields: Mapping[str, Any],
    *, now: dt.datetime | None = None,
) -> str:
    """Write ``manifest.json`` (making the version visible), then move LATEST to it.

    ``manifest_fields`` must hold ``dim``, ``metric`` and ``factory``; anything
    else (encoder fingerprint, dump and passages ids, gate results) is recorded
    as given. Every shard file must already exist.
    """
    root = store.child(INDEXES_DIR, _check_name(version))
    fields = dict(manifest_fields)
    missing = [k for k in ("dim", "metric", "factory") if k not in fields]
    if missing or fields.get("metric") not in METRICS or not isinstance(fields.get("dim"), int):
        raise IndexVersionError(f"manifest_fields need dim (int), metric (ip|l2) and factory; got {sorted(fields)}")
    if clash := [k for k in _RESERVED_FIELDS if k in fields]:
        raise IndexVersionError(f"manifest_fields may not set {clash}: publishing fills them in")
    shards = sorted((dict(e) for e in entries), key=lambda e: e["shard"])
    if not shards or [e["shard"] for e in shards] != list(range(len(shards))):
        raise IndexVersionError(f"{root.url}: shards must be numbered 0..n-1, got {[e['shard'] for e in shards]}")
    for entry in shards:
        for name in (entry["url"], entry["ids_url"]):
            if not root.exists(name):
                raise IndexVersionError(f"{root.url_of(name)}: shard file missing; write every shard before publishing")
    created = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    manifest = {**fields, "format": MANIFEST_FORMAT, "version": version, "created_at": created.isoformat(),
                "count": sum(int(e["count"]) for e in shards), "shards": shards}
    root.write_json(manifest, MANIFEST)
    move_latest(store, version)
    return version


def publish_version(
    store: Store, shards: Sequence[ShardPayload | Sequence[Any]], manifest_fields: Mapping[str, Any],
    *, now: dt.datetime | None = None,
) -> str:
    """Publish shards as a new version in one process: shard files, manifest last, then LATEST."""
    version = new_version_id(now)
    entries = [write_shard(store, version, i, shard) for i, shard in enumerate(shards)]
    return publish_manifest(store, version, entries, manifest_fields, now=now)


def move_latest(store: Store, version: str) -> None:
    """Point LATEST at a published version (one atomic write)."""
    indexes = store.child(INDEXES_DIR)
    if not indexes.exists(_check_name(version), MANIFEST):
        raise IndexVersionError(f"{indexes.url_of(version)}: no manifest; LATEST points at published versions only")
    indexes.write_json({"version": version}, LATEST)


def list_versions(store: Store) -> list[str]:
    """Published versions (those with a manifest), oldest first."""
    indexes = store.child(INDEXES_DIR)
    names = [n for n in indexes.list() if _VERSION_NAME.match(n) and n != LATEST]
    return [n for n in names if indexes.exists(n, MANIFEST)]


def latest_version(store: Store) -> str | None:
    """The version LATEST points at, or None when nothing was published."""
    indexes = store.child(INDEXES_DIR)
    if not indexes.exists(LATEST):
        return None
    pointer = indexes.read_json(LATEST)
    if not isinstance(pointer, dict) or not isinstance(pointer.get("version"), str):
        raise IndexVersionError(f"{indexes.url_of(LATEST)}: not a LATEST pointer; republish or delete it")
    return pointer["version"]


def read_manifest(store: Store, version: str | None = None) -> dict[str, Any]:
    """A published version's manifest (LATEST's when ``version`` is None)."""
    indexes = store.child(INDEXES_DIR)
    if version is None:
        version = latest_version(store)
        if version is None:
            raise IndexVersionError(f"{indexes.url}: no index has been published here (no LATEST); build one first")
    if not indexes.exists(_check_name(version), MANIFEST):
        available = ", ".join(list_versions(store)) or "none"
        raise IndexVersionError(f"{indexes.url}: index version {version} not found; available: {available}")
    manifest = indexes.read_json(version, MANIFEST)
    if manifest.get("format") != MANIFEST_FORMAT:
        raise IndexVersionError(f"{indexes.url_of(version, MANIFEST)}: manifest format {manifest.get('format')!r} "
                                f"is not {MANIFEST_FORMAT}; upgrade wikirag or republish")
    return manifest


def delete_version(store: Store, version: str, *, force: bool = False) -> None:
    """Delete a version (or an unpublished leftover). The one LATEST points at needs ``force``.

    A forced delete of the latest first moves LATEST to the newest other
    version (or removes LATEST when none is left), then removes the manifest
    (the version vanishes at once), then the shard files.
    """
    indexes = store.child(INDEXES_DIR)
    if not indexes.list(_check_name(version)):
        available = ", ".join(list_versions(store)) or "none"
        raise IndexVersionError(f"{indexes.url}: index version {version} not found; available: {available}")
    if latest_version(store) == version:
        if not force:
            raise IndexVersionError(f"{indexes.url}: refusing to delete {version}: LATEST points at it; "
                                    "publish another version first or force the delete")
        others = [v for v in list_versions(store) if v != version]
        if others:
            move_latest(store, others[-1])
        else:
            indexes.remove(LATEST)
    indexes.remove(version, MANIFEST)
    indexes.remove(version)
