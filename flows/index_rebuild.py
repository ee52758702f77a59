"""The ``index_rebuild`` flow: a dump to a published, searchable, quality-gated index version.

ingest (its own gates) -> embed each passage shard on Dask -> gate the
embeddings -> build one FAISS index per shard on Dask -> gate counts and
recall -> publish (manifest last, then LATEST) -> summary artifact; from the plan to the publish the build
holds a lease on its passage set (tasks/leases.py), which gc and delete honour

``index_rebuild`` takes everything as parameters (no environment is read
here); the deployment's entry point, ``deployed_index_rebuild``, reads the
worker's settings once and passes them in. Without Prefect, the same build is
``rag_core.index.build.build_version``.
"""

from __future__ import annotations

from prefect import flow, unmapped
from prefect.context import get_run_context
from prefect_dask import DaskTaskRunner

from flows.dump_mirror import mirror_dump
from flows.ingest import ingest
from rag_core.errors import WikiragError
from rag_core.index.plan import GateConfig, dump_id_of
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.wiki.dump_site import DumpSiteConfig
from rag_core.wiki.ingest import IngestConfig
from runtime.dask_runner import dask_runner
from runtime.process_tuning import start_process
from runtime.settings import Settings, StoreAccess, quiet_environment
from runtime.stop_signals import raise_if_stopped
from tasks.index import (
    build_index_shard,
    embed_passages,
    plan_index,
    publish_index,
    summarize_index,
    train_index_version,
    unchanged_latest,
)
from tasks.index_events import announce_published
from tasks.index_quality import enforce_index_gate, gate_embeddings, gate_index
from tasks.leases import index_lease, protect_plan
from tasks.shard_runs import wait_for_shards

quiet_environment()


def scheduler_address() -> str:
    """The address of the Dask cluster this flow runs on, so the ingest subflow shares it.

    Read from the flow's task runner (its client starts or joins the cluster on first use), not from a task on a
    worker: the local server's SQLite was still writing that task's states when the subflow was created, answered
    503, and Prefect's client retried only after ~2 s (5 of 5 rebuild starts logged at DEBUG on 2 cores).
    """
    runner = get_run_context().task_runner
    if not isinstance(runner, DaskTaskRunner):
        raise TypeError(f"index_rebuild runs on a DaskTaskRunner, not {type(runner).__name__}")
    return runner.client.scheduler.address


@flow(name="index_rebuild", task_runner=dask_runner(None, None), validate_parameters=True)
def index_rebuild(
    ingest_config: IngestConfig,
    store: StoreAccess,
    embed: EmbedConfig = EmbedConfig(),  # noqa: B008 - pydantic defaults are immutable values here
    index: IndexConfig = IndexConfig(),  # noqa: B008
    gate: GateConfig = GateConfig(),  # noqa: B008
) -> str:
    """Rebuild the index from a dump; returns the version published (now LATEST).

    No passage is encoded twice: finished embedding ranges of this passage set
    (any shard count) and the vectors of passages unchanged since the dump
    behind the current LATEST are reused (same encoder fingerprint); a rerun
    after a crash skips finished shards. Published versions are never touched.
    """
    target = store.store()
    address = scheduler_address()
    passages_url = ingest.with_options(task_runner=dask_runner(address, None))(config=ingest_config, store=store)

    # The build's lease keeps gc and delete off its embedding ranges and version folder while it runs, and makes a
    # second rebuild of the same passages wait for this one (then find LATEST unchanged, or reuse its vectors).
    with index_lease(target, dump_id_of(passages_url), store.lease_ttl_s) as lease:
        plan = plan_index(target, passages_url, embed, index, gate)
        protect_plan(lease, plan)
        if (current := unchanged_latest(target, plan)) is not None:
            return current
        shard_ids = list(range(plan.num_shards))
        embedding_runs = embed_passages.map(unmapped(target), unmapped(plan), shard_ids)
        wait_for_shards(embedding_runs)  # finished shards stay on the store even when one fails: a rerun skips them
        embedded = embedding_runs.result()
        embed_gates = enforce_index_gate(target, plan, "embeddings", gate_embeddings(plan, embedded))

        train_index_version(target, plan)  # before any shard is built: each fills a copy of what it trains
        index_runs = build_index_shard.map(unmapped(target), unmapped(plan), shard_ids)
        wait_for_shards(index_runs)
        built = index_runs.result()
        index_gates = enforce_index_gate(target, plan, "index", gate_index(plan, built))

        gates = {**embed_gates, **index_gates}
        raise_if_stopped()  # nothing is published after a stop signal, wherever its exception went
        version = publish_index(target, plan, built, gates)
    summarize_index(plan, embedded, built, version, gates)
    announce_published(version, target.url, plan.dump_id)
    return version


@flow(name="index_rebuild-deployment", validate_parameters=True)
def deployed_index_rebuild(
    ingest_config: IngestConfig | None = None,
    dump_site: DumpSiteConfig | None = None,
    embed: EmbedConfig = EmbedConfig(),  # noqa: B008
    index: IndexConfig = IndexConfig(),  # noqa: B008
    gate: GateConfig = GateConfig(),  # noqa: B008
) -> str | None:
    """The deployment's entry point: the worker's settings, read once, then ``index_rebuild`` on its Dask cluster.

    With ``dump_site``, the newest complete dated dump is first mirrored to the store and verified by its published
    sha1 (the ``mirror_dump`` subflow), and the rebuild parses the mirror (``ingest_config`` gives the other ingest
    settings); when the dump behind LATEST is still the newest, it returns None after one request to the site,
    having parsed and embedded nothing.
    """
    settings = Settings()
    start_process(settings)  # the deployment's process: the same switches as a command's
    store = settings.store_access()
    if dump_site is not None:
        mirror = mirror_dump(site=dump_site, store=store)
        if mirror is None:
            return None
        ingest_config = mirror.ingest_config(ingest_config)
    if ingest_config is None:
        raise WikiragError("index_rebuild-deployment: give dump_site (a dump site to mirror) or ingest_config "
                           "(a dump to parse)")
    runner = dask_runner(settings.dask_address, settings.workers)
    return index_rebuild.with_options(task_runner=runner)(ingest_config=ingest_config, store=store, embed=embed,
                                                          index=index, gate=gate)
