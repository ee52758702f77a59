"""Prefect tasks of the ingest stage: plan, parse/clean/chunk, publish, summarise."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from rag_core.progress import StageProgress
from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource, Page, iter_pages
from rag_core.wiki.ingest import (
    IngestConfig,
    dump_digest,
    make_dump_id,
    publish,
    published_manifest,
    stage_part,
    staged_part,
)
from rag_core.wiki.multistream import StreamShard, check_layout, iter_shard_pages, plan_shards, read_index
from rag_core.wiki.passages import PageCounts, passages_from_pages
from tasks.adapters.dask_waits import wait_within
from tasks.quality import artifact_key
from tasks.retry_policy import io_task


# One batch of pages (IngestConfig.batch_pages) is cleaned in seconds; an hour means a stuck or lost worker.
BATCH_TIMEOUT_S = 3600.0


@dataclass
class DumpPlan:
    """What the run will do: the passage set's id and how the dump is cut up."""

    dump_id: str
    sha256: str
    size: int
    layout: str  # names the staging folder: how the work was cut ("s16": 16 shards, "b500": 500-page batches)
    shards: list[StreamShard] = field(default_factory=list)  # empty: no index, one streaming reader
    schema_version: str | None = None
    started: float = field(default_factory=time.time)


def _progress(pages: Iterable[Page], total: int | None, desc: str) -> Iterator[Page]:
    # A bar on a terminal; elsewhere (CI, a log file) a line every 30 s while the pages last.
    with StageProgress(f"parse {desc}", total, "page", log=get_run_logger().info) as progress:
        yield from progress.track(pages)


@io_task
def check_store(store: Store) -> None:
    """Fail before any work when the store is unreachable or refuses writes."""
    store.check_writable()


@io_task
def plan_dump(config: IngestConfig, dump: DumpSource, index: DumpSource | None) -> DumpPlan:
    """Checksum the dump, read its index when given, and cut it into shards."""
    started = time.time()
    sha256, size = dump_digest(dump)
    dump_id = make_dump_id(dump.name, sha256, config)
    if index is None:
        return DumpPlan(dump_id, sha256, size, f"b{config.batch_pages}", started=started)
    streams = read_index(index)
    version = check_layout(dump, streams, size)
    shards = plan_shards(streams, size, config.num_shards(size, len(streams)))
    return DumpPlan(dump_id, sha256, size, f"s{len(shards)}", shards, version, started=started)


@task
def already_published(store: Store, plan: DumpPlan) -> dict[str, Any] | None:
    """The manifest of this exact passage set when an earlier run published it."""
    manifest = published_manifest(store, plan.dump_id)
    if manifest is not None:
        get_run_logger().info("passages %s already published (%s); nothing to redo", plan.dump_id,
                              manifest.get("created_at"))
    return manifest


@io_task
def ingest_shard(dump: DumpSource, shard: StreamShard, store: Store, plan: DumpPlan, config: IngestConfig) -> dict[str, Any]:
    """Decompress, parse, clean and chunk one shard of a multistream dump into a staged part."""
    done = staged_part(store, plan.dump_id, plan.layout, shard.shard_id)
    if done is not None:
        return done
    t0 = time.time()
    pages = _progress(iter_shard_pages(dump, shard), shard.n_pages, f"shard {shard.shard_id + 1}/{len(plan.shards)}")
    passages, redirects, counts = passages_from_pages(
        pages, words_per_passage=config.words_per_passage, skip_disambiguation=config.skip_disambiguation
    )
    record = stage_part(store, plan.dump_id, plan.layout, shard.shard_id, passages, redirects, counts)
    rate = counts.pages / max(time.time() - t0, 1e-9)
    get_run_logger().info(
        "shard %d/%d: %s pages -> %s passages (%.0f pages/s)",
        shard.shard_id + 1, len(plan.shards), f"{counts.pages:,}", f"{counts.passages:,}", rate,
    )
    return record


def clean_and_stage(part: int, pages: list[Page], store: Store, plan: DumpPlan, config: IngestConfig) -> dict[str, Any]:
    """One batch of an unindexed dump: clean, chunk, stage (runs as a plain Dask task)."""
    passages, redirects, counts = passages_from_pages(
        pages, words_per_passage=config.words_per_passage, skip_disambiguation=config.skip_disambiguation
    )
    return stage_part(store, plan.dump_id, plan.layout, part, passages, redirects, counts)


@io_task
def ingest_stream(dump: DumpSource, store: Store, plan: DumpPlan, config: IngestConfig) -> list[dict[str, Any]]:
    """Read an unindexed dump once; batches are cleaned by the other Dask workers meanwhile.

    The reader secedes from its worker's thread pool (``worker_client``) so
    its own worker cleans batches too; at most two batches per worker are in
    flight, which keeps memory flat however large the dump.
    """
    from distributed import worker_client

    records: dict[int, dict[str, Any]] = {}
    with worker_client() as client:
        limit = 2 * max(1, len(client.scheduler_info().get("workers", {})))
        pending: deque = deque()
        batch: list[Page] = []
        part = 0

        def flush() -> None:
            nonlocal batch, part
            done = staged_part(store, plan.dump_id, plan.layout, part)
            if done is not None:
                records[part] = done
            else:
                pending.append(client.submit(clean_and_stage, part, batch, store, plan, config, pure=False))
            batch, part = [], part + 1
            while len(pending) >= limit:
                wait_within(list(pending), f"ingest of {dump.url}: cleaning page batches", BATCH_TIMEOUT_S,
                            raise_with="tasks.ingest.BATCH_TIMEOUT_S", return_when="FIRST_COMPLETED")
                while pending and pending[0].done():
                    record = pending.popleft().result()
                    records[record["part"]] = record

        for page in _progress(iter_pages(dump), None, "dump"):
            batch.append(page)
            if len(batch) >= config.batch_pages:
                flush()
        if batch or part == 0:
            flush()
        wait_within(list(pending), f"ingest of {dump.url}: cleaning page batches", BATCH_TIMEOUT_S,
                    raise_with="tasks.ingest.BATCH_TIMEOUT_S")
        for future in pending:
            record = future.result()
            records[record["part"]] = record
    get_run_logger().info("read %s pages in %d parts", f"{sum(r['counts']['pages'] for r in records.values()):,}", len(records))
    return [records[k] for k in sorted(records)]


def total_counts(records: list[dict[str, Any]]) -> PageCounts:
    counts = PageCounts()
    for r in records:
        counts = counts + PageCounts(**r["counts"])
    return counts


@io_task
def publish_passages(
    store: Store, plan: DumpPlan, records: list[dict[str, Any]], gate_markdown: str, dump: DumpSource, index: DumpSource | None, config: IngestConfig
) -> dict[str, Any]:
    """Move staged parts into place and write the manifest last; returns the manifest."""
    manifest = {
        "dump": {"url": dump.url, "sha256": plan.sha256, "bytes": plan.size, "schema_version": plan.schema_version},
        "index": index.url if index else None,
        "config": config.model_dump(exclude={"dump", "index"}),
        "content_key": config.content_key(),
        "counts": total_counts(records).as_dict(),
        "gate": gate_markdown,
        "parts": records,
    }
    return publish(store, plan.dump_id, plan.layout, manifest)


@task
def summarize_ingest(plan: DumpPlan, manifest: dict[str, Any], url: str, reused: bool) -> str:
    """A markdown artifact for the run: counts, throughput, gate, where the passages are."""
    c = PageCounts(**manifest["counts"])
    elapsed = max(time.time() - plan.started, 1e-9)
    lines = [
        f"## Ingest `{plan.dump_id}`",
        "",
        f"Passages: `{url}`" + (" (already published; nothing redone)" if reused else ""),
        "",
        "| pages | articles | redirects | disambiguation | empty | other namespaces | passages | words |",
        "|---|---|---|---|---|---|---|---|",
        f"| {c.pages:,} | {c.articles:,} | {c.redirects:,} | {c.disambiguation:,} | {c.empty:,} | {c.other_namespace:,} "
        f"| {c.passages:,} | {c.words:,} |",
        "",
    ]
    if not reused:
        lines += [
            f"Throughput: {plan.size / 1e6 / elapsed:.2f} MB/s of dump, {c.pages / elapsed:,.0f} pages/s "
            f"({elapsed:.1f} s, {len(plan.shards) or 'streamed'} shards).",
            "",
        ]
    lines.append(manifest.get("gate") or "")
    markdown = "\n".join(lines)
    create_markdown_artifact(markdown=markdown, key=artifact_key(f"ingest-{plan.dump_id}"), description="ingest summary")
    return markdown
