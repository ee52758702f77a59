"""Prefect tasks of the index stage: plan, embed a shard, build a shard's index, publish, summarise.

The per-shard tasks run on Dask workers; each worker loads the encoder (and
the earlier dump's reuse table) once and keeps it for the shards it is given.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from rag_core.errors import StoreError
from rag_core.index.embeddings import (
    EmbedConfig,
    ReuseTable,
    embed_shard,
    load_reuse_table,
    read_shard,
    shard_bounds,
    vector_stats,
)
from rag_core.index.encoders import Encoder, EncoderConfig, EncoderError
from rag_core.index.faiss_index import IndexConfig, build_shard_index, heldout_recall, serialize_index
from rag_core.index.versions import (
    IndexVersionError,
    ShardPayload,
    latest_version,
    new_version_id,
    publish_manifest,
    read_manifest,
    write_shard,
)
from rag_core.progress import StageProgress
from rag_core.storage import Store
from rag_core.wiki.ingest import PASSAGES_DIR, published_manifest, read_passage_rows
from tasks.ingest import io_task
from tasks.quality import artifact_key

RECALL_K = 10


@dataclass
class IndexPlan:
    """What the run will build: which passages, which encoder, how many shards, which version."""

    dump_id: str
    passages_url: str
    dump: dict[str, Any]  # the passages manifest's dump record: url, sha256, bytes
    n_passages: int
    num_shards: int
    encoder: EncoderConfig
    fingerprint: dict[str, Any]
    fingerprint_id: str
    dim: int
    index: IndexConfig
    version: str
    reuse_from: str | None = None
    recall_queries: int = 1000  # held-out queries for the recall gate, over all shards
    started: float = field(default_factory=time.time)

    def bounds(self, shard_id: int) -> tuple[int, int]:
        return shard_bounds(self.n_passages, shard_id, self.num_shards)


@dataclass
class EmbeddedShard:
    """One shard's embedding record and the per-vector facts its gate checks."""

    shard: int
    record: dict[str, Any]
    expected: int  # passages in the shard
    dim: int  # columns of the stored matrix
    norm: np.ndarray
    finite: np.ndarray
    matches_passage: np.ndarray  # stored id i == passage i of the shard


@dataclass
class BuiltShard:
    """One shard's FAISS index, written into the unpublished version, and its held-out recall."""

    shard: int
    entry: dict[str, Any]
    ntotal: int
    expected: int
    factory: str
    recall: np.ndarray
    seconds: float


@functools.cache
def _encoder(config: EncoderConfig) -> Encoder:
    return Encoder.load(config)


_REUSE: dict[tuple[str, str, str], ReuseTable] = {}


def _reuse_table(store: Store, fingerprint_id: str, dump_id: str) -> ReuseTable:
    key = (store.url, fingerprint_id, dump_id)
    if key not in _REUSE:
        _REUSE.clear()  # one earlier dump at a time per worker
        _REUSE[key] = load_reuse_table(store, fingerprint_id, dump_id)
    return _REUSE[key]


@functools.cache
def _share_cores() -> None:
    """Give torch the threads the Dask worker declares, so workers on one host do not oversubscribe it."""
    try:
        from distributed import get_worker

        threads = get_worker().state.nthreads
    except (ImportError, ValueError):
        return  # not on a Dask worker: torch's default (all cores) is right
    import torch

    torch.set_num_threads(max(1, threads))


class _OnDemandEncoder:
    """The plan's fingerprint, with the model loaded only when something must be encoded.

    A resumed run finds most shards done: checking them needs the fingerprint,
    which the plan carries, not the model, which takes seconds to load.
    """

    def __init__(self, plan: IndexPlan) -> None:
        self.config = plan.encoder
        self.fingerprint = plan.fingerprint
        self.fingerprint_id = plan.fingerprint_id
        self.dim = plan.dim

    def encode_passages(self, titles: Any, texts: Any, progress: Any = None) -> np.ndarray:
        _share_cores()
        encoder = _encoder(self.config)
        if encoder.fingerprint_id != self.fingerprint_id:
            raise EncoderError(f"the encoder at {self.config.path or 'the packaged MiniLM'} changed during the run "
                               f"(fingerprint {encoder.fingerprint_id}, planned {self.fingerprint_id}); rerun")
        return encoder.encode_passages(titles, texts, progress)


def _dump_id(passages_url: str) -> str:
    return passages_url.rstrip("/").rsplit("/", 1)[-1]


def _previous_dump(store: Store, fingerprint_id: str, dump_id: str) -> str | None:
    """The dump the current LATEST index was built from, when its vectors can be reused here."""
    try:
        version = latest_version(store)
        manifest = read_manifest(store, version) if version else None
    except IndexVersionError:
        return None
    if manifest is None or manifest.get("fingerprint_id") != fingerprint_id or manifest.get("dump_id") == dump_id:
        return None
    return manifest.get("dump_id")


@io_task
def plan_index(store: Store, passages_url: str, embed: EmbedConfig, index: IndexConfig,
               recall_queries: int = 1000) -> IndexPlan:
    """Count the passages, fingerprint the encoder, cut the shards and name the version."""
    dump_id = _dump_id(passages_url)
    manifest = published_manifest(store, dump_id)
    if manifest is None:
        raise StoreError(f"{store.url_of(PASSAGES_DIR, dump_id)}: no published passages; run ingest first")
    n = int(manifest["counts"]["passages"])
    encoder = _encoder(embed.encoder)
    plan = IndexPlan(
        dump_id=dump_id, passages_url=passages_url, dump=manifest["dump"], n_passages=n,
        num_shards=embed.num_shards(n), encoder=embed.encoder, fingerprint=encoder.fingerprint,
        fingerprint_id=encoder.fingerprint_id, dim=encoder.dim, index=index, version=new_version_id(),
        reuse_from=embed.reuse_from or _previous_dump(store, encoder.fingerprint_id, dump_id),
        recall_queries=recall_queries,
    )
    get_run_logger().info(
        "%s passages in %d shards, encoder %s (%s), version %s%s", f"{n:,}", plan.num_shards,
        encoder.fingerprint["name"], encoder.fingerprint_id, plan.version,
        f", reusing vectors of {plan.reuse_from}" if plan.reuse_from else "",
    )
    return plan


@io_task
def embed_passages(store: Store, plan: IndexPlan, shard_id: int) -> EmbeddedShard:
    """Embed one passage shard (skipped when done, incremental when an earlier dump is given)."""
    encoder = _OnDemandEncoder(plan)
    start, stop = plan.bounds(shard_id)
    table = read_passage_rows(store, plan.dump_id, start, stop, columns=["passage_id", "title", "text"])
    previous = _reuse_table(store, plan.fingerprint_id, plan.reuse_from) if plan.reuse_from else None
    with StageProgress(f"embed {shard_id + 1}/{plan.num_shards}", table.num_rows, "passage",
                       log=get_run_logger().info) as progress:  # a bar on a TTY, else a line every 30 s
        record = embed_shard(store, plan.dump_id, table, encoder, shard_id, previous, progress=progress.update)
    ids, vectors = read_shard(store, plan.fingerprint_id, plan.dump_id, shard_id)  # the gate sees what was stored
    stats = vector_stats(vectors)
    expected = table.column("passage_id").to_pylist()
    matches = np.array([a == b for a, b in zip(ids, expected)] + [False] * max(0, len(ids) - len(expected)), bool)
    if record["skipped"]:
        how = "already embedded"
    else:
        rate = record["encoded"] / max(record["seconds"], 1e-9)
        how = f"{record['encoded']:,} encoded ({rate:,.0f}/s), {record['reused']:,} reused"
    get_run_logger().info("embeddings %d/%d: %s passages, %s", shard_id + 1, plan.num_shards, f"{len(ids):,}", how)
    return EmbeddedShard(shard_id, record, table.num_rows, int(vectors.shape[1]) if vectors.ndim == 2 else 0,
                         stats["norm"], stats["finite"], matches)


@io_task
def build_index_shard(store: Store, plan: IndexPlan, shard_id: int) -> BuiltShard:
    """Build one shard's FAISS index, measure its held-out recall@10, write it into the unpublished version."""
    # FAISS builds in one call: off a terminal, the timer logs a line every 30 s while it works.
    with StageProgress(f"index {shard_id + 1}/{plan.num_shards}", 1, "shard", log=get_run_logger().info) as progress:
        built = _build_index_shard(store, plan, shard_id)
        progress.update()
    return built


def _build_index_shard(store: Store, plan: IndexPlan, shard_id: int) -> BuiltShard:
    started = time.perf_counter()
    ids, vectors = read_shard(store, plan.fingerprint_id, plan.dump_id, shard_id)
    start, stop = plan.bounds(shard_id)
    passages = read_passage_rows(store, plan.dump_id, start, stop, columns=["passage_id", "title", "text"])
    index = build_shard_index(vectors, plan.index, total_vectors=plan.n_passages)
    factory = plan.index.resolve_factory(len(vectors), plan.dim, total_vectors=plan.n_passages)
    per_shard = math.ceil(plan.recall_queries * len(vectors) / max(plan.n_passages, 1))
    rng = np.random.default_rng([plan.index.seed, shard_id])
    rows = np.sort(rng.choice(len(vectors), min(per_shard, len(vectors)), replace=False))
    recall = heldout_recall(index, vectors, rows, RECALL_K, plan.index.metric) if len(vectors) > 1 else np.ones(0)
    meta = {"factory": factory, "passage_ids_match": ids == passages.column("passage_id").to_pylist()}
    entry = write_shard(store, plan.version, shard_id, ShardPayload(serialize_index(index), passages, meta))
    seconds = time.perf_counter() - started
    get_run_logger().info("index %d/%d: %s vectors, %s, recall@%d %.3f (%.1f s)", shard_id + 1, plan.num_shards,
                          f"{index.ntotal:,}", factory, RECALL_K, recall.mean() if len(recall) else 1.0, seconds)
    return BuiltShard(shard_id, entry, int(index.ntotal), stop - start, factory, recall, seconds)


@io_task
def publish_index(store: Store, plan: IndexPlan, built: list[BuiltShard], gates: dict[str, Any]) -> str:
    """Write the manifest (the version becomes visible), then move LATEST to it."""
    factories = sorted({b.factory for b in built})
    fields = {
        "dim": plan.dim, "metric": plan.index.metric, "factory": ",".join(factories) if factories else "Flat",
        "factory_requested": plan.index.factory, "index_config": plan.index.model_dump(),
        "encoder": plan.fingerprint, "fingerprint_id": plan.fingerprint_id,
        "encoder_config": plan.encoder.model_dump(), "dump_id": plan.dump_id, "passages": plan.passages_url,
        "dump": plan.dump, "gates": gates,
    }
    return publish_manifest(store, plan.version, [b.entry for b in sorted(built, key=lambda b: b.shard)], fields)


@task
def summarize_index(plan: IndexPlan, embedded: list[EmbeddedShard], built: list[BuiltShard], version: str,
                    gates: dict[str, Any]) -> str:
    """A markdown artifact: counts, reuse, timings, recall and the version published."""
    records = [e.record for e in embedded]
    encoded = sum(r["encoded"] for r in records if not r["skipped"])
    reused = sum(r["reused"] for r in records if not r["skipped"])
    skipped = sum(r["n"] for r in records if r["skipped"])
    embed_s = sum(r["seconds"] for r in records if not r["skipped"])
    build_s = sum(b.seconds for b in built)
    recall = float(np.concatenate([b.recall for b in built]).mean()) if built and any(len(b.recall) for b in built) else 1.0
    elapsed = time.time() - plan.started
    lines = [
        f"## Index `{version}`",
        "",
        f"Passages `{plan.dump_id}` ({plan.n_passages:,}) embedded by `{plan.fingerprint['name']}` "
        f"({plan.fingerprint_id}, dim {plan.dim}) into {plan.num_shards} shards; "
        f"factory {', '.join(sorted({b.factory for b in built}))} ({plan.index.metric}).",
        "",
        "| passages | encoded | reused | already embedded | recall@10 (held out) | embed s (worker) | index s (worker) | wall s |",
        "|---|---|---|---|---|---|---|---|",
        f"| {plan.n_passages:,} | {encoded:,} | {reused:,} | {skipped:,} | {recall:.3f} | {embed_s:.1f} | {build_s:.1f} "
        f"| {elapsed:.1f} |",
        "",
        f"Reused vectors from: `{plan.reuse_from}`" if plan.reuse_from else "No earlier dump to reuse vectors from.",
        "",
        *(f"- gate `{name}`: {value}" for name, value in gates.items()),
    ]
    markdown = "\n".join(lines)
    create_markdown_artifact(markdown=markdown, key=artifact_key(f"index-{version}"), description="index rebuild")
    return markdown

