"""The ``ingest`` flow: a Wikipedia dump to quality-gated passages on a store.

plan (checksum, index, shards) -> parse/clean/chunk each shard on Dask ->
gate each part and the ids across parts -> publish (parts, then manifest), all under the passage set's lease

``ingest`` takes everything as parameters (no environment is read here); the
deployment's entry point, ``deployed_ingest``, reads the worker's settings once
and passes them in.
"""

from __future__ import annotations

from prefect import flow, unmapped

from rag_core.wiki.dumps import DumpSource
from rag_core.wiki.ingest import IngestConfig
from runtime.dask_runner import dask_runner
from runtime.process_tuning import start_process
from runtime.settings import Settings, StoreAccess, quiet_environment
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
    with ingest_lease(target, plan.dump_id, dump.url):
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
def deployed_ingest(config: IngestConfig) -> str:
    """The deployment's entry point: the worker's settings, read once, then ``ingest`` on its Dask cluster."""
    settings = Settings()
    start_process(settings)  # the deployment's process: the same switches as a command's
    runner = dask_runner(settings.dask_address, settings.workers)
    return ingest.with_options(task_runner=runner)(config=config, store=settings.store_access())
