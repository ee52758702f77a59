"""Index versions on a store: shard files, a manifest written last, a LATEST pointer, pins.

One FAISS index per passage shard. Row ``i`` of a shard's index is the shard's
``i``-th passage: ids are resolved through the shard's ids file, never through
FAISS ids (no ``IndexIDMap``: string passage ids do not fit in int64, and the
row order is already stored beside the index). Layout under ``<store>/indexes/``::

    <version>/shard-00000.faiss          faiss.serialize_index bytes of shard 0
    <version>/shard-00000.ids.parquet    passage_id (+ title, text), in FAISS row order
    <version>/plan.json                  what a build is making (while unpublished; cleanup reads it)
    <version>/manifest.json              written last: the version exists once it does
    <version>/pins/<name>.json           one object per holder (e.g. a registered model)
    LATEST                               {"version", "manifest_sha256"}; moved only after the manifest exists,
                                         and only forward (rag_core.index.latest)

Versions are immutable: nothing a published version reads (its manifest names
every file, embedding files included, with their sha256) is rewritten, and
:func:`rag_core.index.retention.delete_version` removes a file only when no other published version
references it. A pinned version, or the one LATEST points at, is not deleted.

Versions are ``20261130T114501.123Z-1a2b3c4d`` (UTC time to the millisecond,
then random hex): they sort by creation time and do not collide. That time,
given when a build is planned, is the manifest's ``created_at``: LATEST moves
only to a version created after the one it names, so a build that started
earlier and finished later does not move it back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from rag_core.errors import WikiragError
from rag_core.index.faiss_index import METRICS, IndexBuildError, sha256_hex
from rag_core.index.latest import move_latest, parse_pointer
from rag_core.index.manifest import (
    CALLER_FIELDS,
    GENERATED_FIELDS,
    MANIFEST,
    EmbeddingRef,
    IndexManifest,
    ManifestError,
    ShardEntry,
    parse_manifest,
)
from rag_core.index.version_names import (
    INDEXES_DIR,
    LATEST,
    IndexVersionError,
    check_name,
    is_version_name,
    new_version_id,
    version_created_at,
)
from rag_core.parquet_bytes import table_to_parquet
from rag_core.storage import Store



class CorruptShardError(WikiragError):
    """A shard's files do not match what its manifest recorded."""


@dataclass(frozen=True)
class ShardPayload:
    """One shard to publish: its serialized index, its passages in row order, where its vectors came from."""

    index_bytes: bytes
    passages: pa.Table  # passage_id (+ title, text); row i is FAISS row i
    meta: Mapping[str, Any] = field(default_factory=dict)  # free-form, recorded in the manifest
    embeddings: EmbeddingRef | None = None  # the embedding files the vectors were read from

    @classmethod
    def of(cls, shard: ShardPayload | Sequence[Any]) -> ShardPayload:
        """Accept a ShardPayload or a tuple ``(index_bytes, passage_ids | table[, meta])``."""
        if isinstance(shard, ShardPayload):
            return shard
        index_bytes, passages, *rest = shard
        if not isinstance(passages, pa.Table):
            passages = pa.table({"passage_id": pa.array([str(p) for p in passages], pa.string())})
        return cls(bytes(index_bytes), passages, dict(rest[0]) if rest and rest[0] else {})


class PublishedVersion(str):
    """A published version's name that carries what publishing did, so that the caller can report it without
    reading the store again: ``manifest``, as written, and ``latest``, the version LATEST named when publishing
    returned (this one, or a newer one that LATEST stays on)."""

    manifest: IndexManifest
    latest: str

    def __new__(cls, manifest: IndexManifest, latest: str) -> PublishedVersion:
        version = super().__new__(cls, manifest.version)
        version.manifest, version.latest = manifest, latest
        return version

    def __reduce__(self) -> tuple[type[PublishedVersion], tuple[IndexManifest, str]]:
        return PublishedVersion, (self.manifest, self.latest)


def shard_names(shard: int) -> tuple[str, str]:
    return f"shard-{shard:05d}.faiss", f"shard-{shard:05d}.ids.parquet"


# -- publishing ------------------------------------------------------------------
def write_shard(store: Store, version: str, shard: int, payload: ShardPayload | Sequence[Any]) -> ShardEntry:
    """Write one shard's two files into an unpublished version; returns its manifest entry."""
    payload = ShardPayload.of(payload)
    root = store.child(INDEXES_DIR, check_name(version))
    if root.exists(MANIFEST):
        raise IndexVersionError(f"{root.url}: version {version} is already published; versions are immutable")
    table = payload.passages
    if "passage_id" not in table.column_names:
        raise IndexBuildError(f"shard {shard}: the passages table needs a passage_id column, has {table.column_names}")
    table = pa.table({c: table.column(c).cast(pa.string()) for c in ("passage_id", "title", "text")
                      if c in table.column_names})
    ids_bytes = table_to_parquet(table)
    index_name, ids_name = shard_names(shard)
    root.write_bytes(payload.index_bytes, index_name)
    root.write_bytes(ids_bytes, ids_name)
    return ShardEntry(
        shard=shard, url=index_name, ids_url=ids_name, count=table.num_rows, bytes=len(payload.index_bytes),
        sha256=sha256_hex(payload.index_bytes), ids_sha256=sha256_hex(ids_bytes), columns=table.column_names,
        meta=dict(payload.meta), embeddings=payload.embeddings,
    )


def publish_manifest(
    store: Store, version: str, entries: Sequence[ShardEntry | Mapping[str, Any]], manifest_fields: Mapping[str, Any],
    *, now: dt.datetime | None = None,
) -> PublishedVersion:
    """Write ``manifest.json`` (making the version visible), then move LATEST to it unless it names a newer version.

    ``manifest_fields`` must hold ``dim``, ``metric`` and ``factory``; the other
    fields of :class:`~rag_core.index.manifest.IndexManifest` (encoder
    fingerprint, passage set, gate results, ...) are optional. Every shard file
    must already exist. ``created_at`` is ``now``, else the time in the
    version's name (when its build was planned), else the time of publishing.
    Returns the version with its manifest and where LATEST stands.
    """
    root = store.child(INDEXES_DIR, check_name(version))
    fields = dict(manifest_fields)
    if clash := [k for k in GENERATED_FIELDS if k in fields]:
        raise IndexVersionError(f"manifest_fields may not set {clash}: publishing fills them in")
    if unknown := sorted(set(fields) - set(CALLER_FIELDS)):
        raise IndexVersionError(f"manifest_fields {unknown} are not manifest fields; known: {', '.join(CALLER_FIELDS)} "
                                "(free-form facts go into a shard's meta)")
    if fields.get("metric") not in METRICS or not isinstance(fields.get("dim"), int) or "factory" not in fields:
        raise IndexVersionError(f"manifest_fields need dim (int), metric (ip|l2) and factory; got {sorted(fields)}")
    shards = sorted((ShardEntry.model_validate(e) for e in entries), key=lambda e: e.shard)
    if not shards or [e.shard for e in shards] != list(range(len(shards))):
        raise IndexVersionError(f"{root.url}: shards must be numbered 0..n-1, got {[e.shard for e in shards]}")
    present = set(root.list())
    for entry in shards:
        for name in (entry.url, entry.ids_url):
            if name not in present:
                raise IndexVersionError(f"{root.url_of(name)}: shard file missing; write every shard before publishing")
    listed: dict[str, set[str]] = {}  # one listing per embedding folder, not a request per file
    for path in (p for e in shards if e.embeddings for p in e.embeddings.paths()):
        folder, _, name = path.rpartition("/")
        if folder not in listed:
            listed[folder] = set(store.list(folder))
        if name not in listed[folder]:
            raise IndexVersionError(f"{store.url_of(path)}: embedding file missing (deleted meanwhile?); rebuild")
    created = (now or version_created_at(version) or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    manifest = IndexManifest(**fields, version=version, created_at=created, count=sum(e.count for e in shards),
                             shards=shards)
    root.write_json(manifest.as_dict(), MANIFEST)
    # Nothing is read after LATEST moved: a store failing then leaves the version published, and says so.
    return PublishedVersion(manifest, move_latest(store, version))


def publish_version(
    store: Store, shards: Sequence[ShardPayload | Sequence[Any]], manifest_fields: Mapping[str, Any],
    *, now: dt.datetime | None = None,
) -> PublishedVersion:
    """Publish shards as a new version in one process: shard files, manifest last, then LATEST (forward only)."""
    version = new_version_id(now)
    entries = [write_shard(store, version, i, shard) for i, shard in enumerate(shards)]
    return publish_manifest(store, version, entries, manifest_fields, now=now)


# -- reading ---------------------------------------------------------------------
def list_versions(store: Store) -> list[str]:
    """Published versions (those with a manifest), oldest first."""
    indexes = store.child(INDEXES_DIR)
    names = [n for n in indexes.list() if is_version_name(n)]
    return [n for n in names if indexes.exists(n, MANIFEST)]


def latest_version(store: Store) -> str | None:
    """The version LATEST points at, or None when nothing was published."""
    pointer = _latest_pointer(store)
    return None if pointer is None else pointer["version"]


def _latest_pointer(store: Store) -> dict[str, Any] | None:
    """LATEST's content: ``version`` and (since manifests are chained) the manifest's ``manifest_sha256``."""
    indexes = store.child(INDEXES_DIR)
    if not indexes.exists(LATEST):
        return None
    return parse_pointer(indexes.read_bytes(LATEST), indexes.url_of(LATEST))


def read_index_manifest(store: Store, version: str | None = None) -> IndexManifest:
    """A published version's manifest (LATEST's when ``version`` is None), validated."""
    indexes = store.child(INDEXES_DIR)
    expected_sha256 = None
    if version is None:
        pointer = _latest_pointer(store)
        if pointer is None:
            raise IndexVersionError(f"{indexes.url}: no index has been published here (no LATEST); build one first")
        version, expected_sha256 = pointer["version"], pointer.get("manifest_sha256")
    if not indexes.exists(check_name(version), MANIFEST):
        available = ", ".join(list_versions(store)) or "none"
        raise IndexVersionError(f"{indexes.url}: index version {version} not found; available: {available}")
    data = indexes.read_bytes(version, MANIFEST)
    manifest = parse_manifest(data, indexes.url_of(version, MANIFEST))  # says what is wrong, when it can
    if expected_sha256 is not None and sha256_hex(data) != expected_sha256:
        raise ManifestError(f"{indexes.url_of(version, MANIFEST)}: sha256 differs from the one {indexes.url_of(LATEST)} "
                            "recorded: the manifest was changed after publishing; restore it from a backup, or "
                            "delete the version and rebuild")
    if manifest.version != version:
        raise ManifestError(f"{indexes.url_of(version, MANIFEST)}: names version {manifest.version}, its folder "
                            f"{version}; the file was copied from another version: delete this one")
    return manifest


def read_manifest(store: Store, version: str | None = None) -> dict[str, Any]:
    """:func:`read_index_manifest` as the stored JSON object (validated), for readers that index it by key."""
    return read_index_manifest(store, version).as_dict()


def verify_version(store: Store, version: str | None = None) -> int:
    """Check every file a version reads against its manifest's sha256; returns how many were checked."""
    manifest = read_index_manifest(store, version)
    root = store.child(INDEXES_DIR, manifest.version)
    checked = 0
    for entry in manifest.shards:
        files = [(root, entry.url, entry.sha256), (root, entry.ids_url, entry.ids_sha256)]
        if entry.embeddings is not None:
            files += [(store, entry.embeddings.vectors, entry.embeddings.vectors_sha256),
                      (store, entry.embeddings.ids, entry.embeddings.ids_sha256)]
        for where, name, sha in files:
            try:
                data = where.read_bytes(name)
            except FileNotFoundError as exc:
                raise CorruptShardError(f"{where.url_of(name)}: missing; version {manifest.version} needs it: "
                                        "delete the version and rebuild") from exc
            if sha256_hex(data) != sha:
                raise CorruptShardError(f"{where.url_of(name)}: sha256 differs from version {manifest.version}'s "
                                        "manifest; delete the version and rebuild")
            checked += 1
    return checked
