"""The ``ingest`` flow: a Wikipedia dump to quality-gated passages on a store.

plan (checksum, index, shards) -> parse/clean/chunk each shard on Dask ->
gate each part and the ids across parts -> publish (parts, then manifest), all under the passage set's lease

``ingest`` takes everything as parameters (no environment is read here); the
deployment's entry point, ``deployed_ingest``, reads the worker's settings once
and passes them in. Given a dump site, it first mirrors the newest complete dated
dump to the store (sha1-verified) and ingests the mirror, never the site.
"""

from __future__ import annotations

from prefect import flow, unmapped

from rag_core.errors import WikiragError
from rag_core.wiki.dump_site import DumpSiteConfig
from rag_core.wiki.dumps import DumpSource
from rag_core.wiki.ingest import IngestConfig
from runtime.dask_runner import dask_runner
from runtime.process_tuning import start_process
from runtime.settings import Settings, StoreAccess, quiet_environment
from tasks.dumps import check_dump_site_for_passages, mirror_dated_dump
from tasks.ingest import (
    already_published,
    check_store,
    ingest_shard,
    ingest_stream,
    plan_dump,
    publish_passages,
    summarize_ingest,
)
from tasks.leases import ingest_lease
from tasks.quality import enforce_gates, gate_passages, warm_gates
from tasks.shard_runs import wait_for_shards

quiet_environment()


@flow(name="ingest", task_runner=dask_runner(None, None), validate_parameters=True)
def ingest(config: IngestConfig, store: StoreAccess) -> str:
    """Ingest a dump into ``<store>/passages/<dump_id>/``; returns that URL.

    ``store`` carries the S3 options, also used for an s3:// dump or index;
    Prefect records them masked, so credentials are not stored with runs.
    """
    target = store.store()
    dump = DumpSource(config.dump, store.options(config.dump))
    index = DumpSource(config.index, store.options(config.index)) if config.index else None

    check_store(target)
    warm_gates()
    plan = plan_dump(config, dump, index)
    url = target.url_of("passages", plan.dump_id)
    # One run per passage set at a time: a second run of the same dump waits here, then finds the set published.
    with ingest_lease(target, plan.dump_id, dump.url, store.lease_ttl_s):
        existing = already_published(target, plan)
        if existing is not None:
            summarize_ingest(plan, existing, url, reused=True)
            return url

        if plan.shards:
            shard_runs = ingest_shard.map(unmapped(dump), plan.shards, unmapped(target), unmapped(plan),
                                          unmapped(config))
            wait_for_shards(shard_runs)  # healthy shards finish and stay staged even when one fails: a rerun reuses them
            records = shard_runs.result()
        else:
            records = ingest_stream.submit(dump, target, plan, config).result()

        gates = gate_passages(target, plan.dump_id, plan.layout, records, config)
        gate_markdown = enforce_gates(target, plan.dump_id, gates)

        manifest = publish_passages(target, plan, records, gate_markdown, dump, index, config)
    summarize_ingest(plan, manifest, url, reused=False)
    return url


@flow(name="ingest-deployment", validate_parameters=True)
def deployed_ingest(config: IngestConfig | None = None, dump_site: DumpSiteConfig | None = None) -> str | None:
    """The deployment's entry point: the worker's settings, read once, then ``ingest`` on its Dask cluster.

    With ``dump_site``, the newest complete dated dump is first mirrored to the store and verified by its published
    sha1, and ``ingest`` parses the mirror (``config`` gives the other ingest settings); when no complete dump is
    newer than the newest one whose passages, cut with these settings, are published, it returns None after one
    request to the site, having parsed nothing. A sum that does not match fails the run before any parsing.
    """
    settings = Settings()
    start_process(settings)  # the deployment's process: the same switches as a command's
    store = settings.store_access()
    if dump_site is not None:
        target = store.store()
        check = check_dump_site_for_passages(dump_site, target, config)
        if check.newer is None:
            return None
        # Mirrored in this process, dump_site.connections requests at a time: never from every Dask worker.
        config = mirror_dated_dump(dump_site, check.newer, target).ingest_config(config)
    if config is None:
        raise WikiragError("ingest-deployment: give dump_site (a dump site to mirror) or config (a dump to parse)")
    runner = dask_runner(settings.dask_address, settings.workers)
    return ingest.with_options(task_runner=runner)(config=config, store=store)
