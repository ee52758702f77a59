"""Prefect tasks of the index stage: plan, embed a shard, build a shard's index, publish, summarise.

Each wraps one call of :mod:`rag_core.index.build`. The per-shard tasks run on
Dask workers; each worker loads the encoder (and the earlier passage set's
reuse table) once and keeps it for the shards it is given.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from rag_core.index.build import (
    RECALL_K,
    BuiltShard,
    EmbeddedShard,
    build_plan_shard,
    embed_plan_shard,
    mean_recall,
    publish_plan,
    shared_factory,
    train_plan_index,
)
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.faiss_index import AUTO_MAX_DEPTH, IndexConfig
from rag_core.index.plan import GateConfig, IndexPlan, describe_plan, dump_id_of, plan_version
from rag_core.index.versions import PublishedVersion
from rag_core.progress import StageProgress
from rag_core.storage import Store
from tasks.quality import artifact_key
from tasks.retry_policy import io_task


@functools.cache
def _worker_threads() -> int | None:
    """The threads the Dask worker declares (None off a worker: torch's default, all cores, is right)."""
    try:
        from distributed import get_worker

        return max(1, get_worker().state.nthreads)
    except (ImportError, ValueError):
        return None


@io_task
def plan_index(store: Store, passages_url: str, embed: EmbedConfig, index: IndexConfig, gate: GateConfig) -> IndexPlan:
    """Count the passages, fingerprint the encoder, cut the shards and name the version."""
    plan = plan_version(store, dump_id_of(passages_url), embed, index, gate)
    get_run_logger().info(describe_plan(plan))
    return plan


@io_task
def unchanged_latest(store: Store, plan: IndexPlan) -> str | None:
    """LATEST when it was built from this plan's passages, encoder, shard count and index settings (a rerun on the
    same dump then publishes nothing new), else None."""
    from rag_core.index.versions import latest_version, read_index_manifest

    latest = latest_version(store)
    if latest is None:
        return None
    manifest = read_index_manifest(store, latest)
    same = (manifest.dump_id == plan.dump_id and manifest.fingerprint_id == plan.fingerprint_id
            and len(manifest.shards) == plan.num_shards and manifest.index_config is not None
            and IndexConfig.model_validate(manifest.index_config) == plan.index)
    if same:
        get_run_logger().info("LATEST (%s) already indexes these passages with this encoder and these settings; "
                              "nothing to rebuild", latest)
    return latest if same else None


@io_task
def embed_passages(store: Store, plan: IndexPlan, shard_id: int) -> EmbeddedShard:
    """Embed one passage shard (skipped when done; reused where vectors exist; the rest encoded)."""
    start, stop = plan.bounds(shard_id)
    with StageProgress(f"embed {shard_id + 1}/{plan.num_shards}", stop - start, "passage",
                       log=get_run_logger().info) as progress:  # a bar on a TTY, else a line every 30 s
        shard = embed_plan_shard(store, plan, shard_id, threads=_worker_threads(), progress=progress.update)
    record = shard.record
    if record["skipped"]:
        how = "already embedded"
    else:
        rate = record["encoded"] / max(record["seconds"], 1e-9)
        how = f"{record['encoded']:,} encoded ({rate:,.0f}/s), {record['reused']:,} reused"
    get_run_logger().info("embeddings %d/%d: %s passages, %s", shard_id + 1, plan.num_shards, f"{shard.expected:,}", how)
    return shard


@io_task
def train_index_version(store: Store, plan: IndexPlan) -> str | None:
    """Train the version's index once for all its shards (IVF lists, PQ codes), when its factory is trained;
    the shards then share one coarse quantizer and a search loads them as one index."""
    started = time.perf_counter()
    factory = train_plan_index(store, plan)
    if factory is not None:
        planned = shared_factory(plan)
        why = "" if factory == planned else f" (auto: {planned} reached recall {plan.index.recall_target} " \
            f"on these vectors at no re-rank depth up to {AUTO_MAX_DEPTH})"
        get_run_logger().info("trained %s once for %d shards (%.1f s)%s", factory, plan.num_shards,
                              time.perf_counter() - started, why)
    return factory


@io_task
def build_index_shard(store: Store, plan: IndexPlan, shard_id: int) -> BuiltShard:
    """Build one shard's FAISS index, measure its held-out recall@10, write it into the unpublished version."""
    # FAISS builds in one call: off a terminal, the timer logs a line every 30 s while it works.
    with StageProgress(f"index {shard_id + 1}/{plan.num_shards}", 1, "shard", log=get_run_logger().info) as progress:
        built = build_plan_shard(store, plan, shard_id)
        progress.update()
    get_run_logger().info("index %d/%d: %s vectors, %s, recall@%d %.3f (%.1f s)", shard_id + 1, plan.num_shards,
                          f"{built.ntotal:,}", built.factory, RECALL_K, mean_recall([built]), built.seconds)
    return built


@io_task
def publish_index(store: Store, plan: IndexPlan, built: list[BuiltShard], gates: dict[str, Any]) -> PublishedVersion:
    """Write the manifest (the version becomes visible), then move LATEST to it unless it names a newer version."""
    published = publish_plan(store, plan, built, gates)
    if published.latest != published:
        get_run_logger().info("published %s; LATEST stays on %s (newer)", published, published.latest)
    return published


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
    sources = sorted({d for r in records if not r["skipped"] for d in r["reused_from"]})
    lines = [
        f"## Index `{version}`",
        "",
        f"Passages `{plan.dump_id}` ({plan.n_passages:,}) embedded by `{plan.fingerprint['name']}` "
        f"({plan.fingerprint_id}, dim {plan.dim}) into {plan.num_shards} shards; "
        f"factory {', '.join(sorted({b.factory for b in built}))} ({plan.index.metric}).",
        "",
        "| passages | encoded | reused | already embedded | recall@10 (held out) | embed s (worker) | index s (worker) | wall s |",
        "|---|---|---|---|---|---|---|---|",
        f"| {plan.n_passages:,} | {encoded:,} | {reused:,} | {skipped:,} | {mean_recall(built):.3f} | {embed_s:.1f} "
        f"| {build_s:.1f} | {time.time() - plan.started:.1f} |",
        "",
        f"Vectors reused from: {', '.join(f'`{s}`' for s in sources)}" if sources else "No vector reused.",
        "",
        *(f"- gate `{name}`: {value}" for name, value in gates.items()),
    ]
    markdown = "\n".join(lines)
    create_markdown_artifact(markdown=markdown, key=artifact_key(f"index-{version}"), description="index rebuild")
    return markdown

