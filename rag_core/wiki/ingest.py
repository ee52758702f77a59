"""The ingest stage's config and its output on a store.

Layout under ``<store>/passages/``::

    _staging/<dump_id>/<layout>/part-00003.parquet    passages of part 3
                                redirects-00003.parquet
                                part-00003.json        counts; written last, marks the part done
    <dump_id>/part-*.parquet, redirects-*.parquet      published parts (brought in before the manifest)
    <dump_id>/manifest.json                            written last: the set exists once it does

``dump_id`` is content-addressed: the dump's sha256 plus every setting that
changes the passages, so a rerun on the same dump finds its output and skips.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, Field

from rag_core.errors import StoreError
from rag_core.parquet_bytes import parquet_to_table, table_to_parquet
from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource
from rag_core.wiki.passages import PASSAGE_SCHEMA, PageCounts
from rag_core.wiki.wikitext import CLEANER_VERSION

PASSAGES_DIR = "passages"
STAGING_DIR = "_staging"
REPORTS_DIR = "_reports"
MANIFEST = "manifest.json"
# A worker holds one shard's passages at a time (about 1,000 pages for 8 MiB of dump); each part costs a
# Prefect task run and a gate validation, so much smaller shards spend their time on those.
AUTO_SHARD_BYTES = 8 << 20
AUTO_MIN_SHARDS = 4


class IngestConfig(BaseModel):
    """Everything the ingest stage needs to know; also the flow's parameter."""

    dump: str = Field(description="dump path or URL: .xml, .xml.bz2 or multistream .xml.bz2")
    index: str | None = Field(None, description="multistream index (offset:page_id:title), .txt or .txt.bz2")
    words_per_passage: int = Field(100, ge=1, description="DPR's window: disjoint runs of this many words")
    skip_disambiguation: bool = Field(True, description="leave disambiguation pages out of the passages")
    shards: int = Field(0, ge=0, description="multistream shards; 0 picks one per 8 MiB of dump, at least 4")
    batch_pages: int = Field(200, ge=1, description="pages per Dask task when there is no index")
    max_residue_rate: float = Field(0.01, ge=0, le=1, description="gate: most passages allowed to keep markup")

    def content_key(self) -> dict[str, Any]:
        """The settings that change the passages (not how the work is cut up)."""
        return {
            "words_per_passage": self.words_per_passage,
            "skip_disambiguation": self.skip_disambiguation,
            "cleaner_version": CLEANER_VERSION,
        }

    def num_shards(self, dump_bytes: int, n_streams: int) -> int:
        wanted = self.shards or max(math.ceil(dump_bytes / AUTO_SHARD_BYTES), AUTO_MIN_SHARDS)
        return max(1, min(wanted, n_streams))


def dump_digest(source: DumpSource, chunk_bytes: int = 8 << 20) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of the raw dump file."""
    digest = hashlib.sha256()
    size = 0
    with source.open(streaming=True) as f:
        while chunk := f.read(chunk_bytes):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def make_dump_id(dump_name: str, sha256: str, config: IngestConfig) -> str:
    """``<readable stem>-<12 hex>``; the hex covers the dump's bytes and the content settings."""
    stem = dump_name
    for suffix in (".bz2", ".xml"):
        stem = stem.removesuffix(suffix)
    stem = re.sub(r"[^A-Za-z0-9]+", "-", stem).strip("-")[:48] or "dump"
    key = json.dumps({"sha256": sha256, **config.content_key()}, sort_keys=True)
    return f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _part_name(kind: str, part: int, ext: str) -> str:
    return f"{kind}-{part:05d}.{ext}"


def _table_bytes(table: pa.Table) -> bytes:
    return table_to_parquet(table, compression="zstd")


def stage_part(
    store: Store, dump_id: str, layout: str, part: int, passages: pa.Table, redirects: pa.Table, counts: PageCounts
) -> dict[str, Any]:
    """Write one part to staging; its JSON is written last and marks it complete."""
    staging = store.child(PASSAGES_DIR, STAGING_DIR, dump_id, layout)
    data = _table_bytes(passages)
    staging.write_bytes(data, _part_name("part", part, "parquet"))
    staging.write_bytes(_table_bytes(redirects), _part_name("redirects", part, "parquet"))
    record = {
        "part": part,
        "rows": passages.num_rows,
        "redirect_rows": redirects.num_rows,
        "sha256": hashlib.sha256(data).hexdigest(),
        "counts": counts.as_dict(),
    }
    staging.write_json(record, _part_name("part", part, "json"))
    return record


def staged_part(store: Store, dump_id: str, layout: str, part: int) -> dict[str, Any] | None:
    """The record of a part already staged by an earlier (perhaps killed) run."""
    staging = store.child(PASSAGES_DIR, STAGING_DIR, dump_id, layout)
    name = _part_name("part", part, "json")
    return staging.read_json(name) if staging.exists(name) else None


def published_manifest(store: Store, dump_id: str) -> dict[str, Any] | None:
    """The manifest of a published passage set, or None when it is not published."""
    root = store.child(PASSAGES_DIR, dump_id)
    return root.read_json(MANIFEST) if root.exists(MANIFEST) else None


def publish(store: Store, dump_id: str, layout: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Bring the staged parts into place, then write the manifest, then remove the staging; returns the manifest.

    Published data is never deleted or rewritten: when the set is published already (another run of the same dump
    finished first), its manifest is kept and returned and only the staging goes. Parts already in place whole are
    kept, so a publish retried after a crash brings only the missing ones; the manifest is written once every part
    it names is in place, so a reader never meets a manifest naming a missing part, and a crash before it leaves
    no visible set.
    """
    records = sorted(manifest["parts"], key=lambda r: r["part"])
    if (existing := published_manifest(store, dump_id)) is None:
        names = [_part_name(kind, r["part"], "parquet") for r in records for kind in ("part", "redirects")]
        store.copy_missing((PASSAGES_DIR, STAGING_DIR, dump_id, layout), (PASSAGES_DIR, dump_id), names)
        full = {
            **manifest,
            "kind": "passages",
            "dump_id": dump_id,
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "parts": [
                {
                    "path": _part_name("part", r["part"], "parquet"),
                    "redirects": _part_name("redirects", r["part"], "parquet"),
                    "rows": r["rows"],
                    "sha256": r["sha256"],
                }
                for r in records
            ],
        }
        if (existing := published_manifest(store, dump_id)) is None:
            store.child(PASSAGES_DIR, dump_id).write_json(full, MANIFEST)
    store.remove(PASSAGES_DIR, STAGING_DIR, dump_id)
    return existing if existing is not None else full


def write_report(store: Store, dump_id: str, name: str, markdown: str) -> str:
    """Keep a report (e.g. a failed gate's) beside the output; returns its URL."""
    reports = store.child(PASSAGES_DIR, REPORTS_DIR, dump_id)
    reports.write_bytes(markdown.encode(), name)
    return reports.url_of(name)


def read_passages(store: Store, dump_id: str, columns: list[str] | None = None) -> pa.Table:
    """The whole published passage set as one table (parts in order)."""
    manifest = published_manifest(store, dump_id)
    if manifest is None:
        raise StoreError(f"{store.url_of(PASSAGES_DIR, dump_id)}: no published passages (no manifest.json); run ingest")
    root = store.child(PASSAGES_DIR, dump_id)
    tables = [parquet_to_table(root.read_bytes(p["path"]), columns) for p in manifest["parts"]]
    return pa.concat_tables(tables) if tables else pa.table({})


def read_passage_rows(store: Store, dump_id: str, start: int, stop: int, columns: list[str] | None = None) -> pa.Table:
    """Rows ``[start, stop)`` of the published passage set, reading only the parts that hold them."""
    manifest = published_manifest(store, dump_id)
    if manifest is None:
        raise StoreError(f"{store.url_of(PASSAGES_DIR, dump_id)}: no published passages (no manifest.json); run ingest")
    root = store.child(PASSAGES_DIR, dump_id)
    tables, first = [], 0
    for part in manifest["parts"]:
        last = first + part["rows"]
        if last > start and first < stop:
            table = parquet_to_table(root.read_bytes(part["path"]), columns)
            tables.append(table.slice(max(start - first, 0), min(stop, last) - max(start, first)))
        first = last
    if not tables:
        empty = PASSAGE_SCHEMA.empty_table()
        return empty.select(columns) if columns else empty
    return pa.concat_tables(tables)


def read_staged_table(
    store: Store, dump_id: str, layout: str, part: int, kind: str = "part", columns: list[str] | None = None
) -> pa.Table:
    """One staged part (``kind`` "part" for passages, "redirects" for redirects)."""
    staging = store.child(PASSAGES_DIR, STAGING_DIR, dump_id, layout)
    return parquet_to_table(staging.read_bytes(_part_name(kind, part, "parquet")), columns)
