"""Prefect tasks of dump acquisition: check the dump site against the dump behind LATEST, mirror and verify."""

from __future__ import annotations

from prefect import get_run_logger

from rag_core.storage import Store
from rag_core.wiki.dump_mirror import MirroredDump, find_mirror, mirror_dump, verify_mirror
from rag_core.wiki.dump_site import (
    DatedDump,
    DumpCheck,
    DumpSiteConfig,
    check_site,
    dump_date_behind_latest,
    dump_date_ingested,
)
from rag_core.wiki.ingest import IngestConfig
from tasks.retry_policy import io_task

# A line per tenth of a file's pieces: a 24 GB dump in 32 MiB pieces is ~750 of them.
PROGRESS_STEPS = 10


@io_task
def check_dump_site(config: DumpSiteConfig, store: Store) -> DumpCheck:
    """Resolve the newest complete dated dump on the site and whether it is newer than the one behind LATEST."""
    check = check_site(config, dump_date_behind_latest(store, config.wiki))
    get_run_logger().info("%s: %s", config.url(""), check.describe())
    return check


@io_task
def check_dump_site_for_passages(config: DumpSiteConfig, store: Store, settings: IngestConfig | None) -> DumpCheck:
    """Resolve the newest complete dated dump on the site and whether it is newer than the newest one whose passages,
    with ``settings``' content settings (None: IngestConfig's defaults), are published."""
    # Only the content settings are read: defaults need no dump URL, which the mirror supplies later.
    key = (settings if settings is not None else IngestConfig.model_construct()).content_key()
    check = check_site(config, dump_date_ingested(store, config.wiki, key))
    have = f"{config.wiki}-{check.current}" if check.current else "no dated dump"
    get_run_logger().info("%s: passages are published from %s; newer complete dump: %s (%d request(s))",
                          config.url(""), have, check.newer.dump_id if check.newer else "none", check.requests)
    return check


@io_task
def mirror_dated_dump(config: DumpSiteConfig, dated: DatedDump, store: Store) -> MirroredDump:
    """Copy a dated dump and its index to the store, each kept only when its published sha1 matches (a retry or a
    rerun asks for the missing pieces only); an existing mirror is re-hashed against its record instead."""
    logger = get_run_logger()
    existing = find_mirror(store, dated.wiki, dated.date)
    if existing is not None:
        verify_mirror(store, existing)
        logger.info("%s: mirrored already at %s; its sha1 still matches", dated.dump_id, existing.dump_url)
        return existing

    def on_piece(name: str, done: int, total: int) -> None:
        if done == total or done % max(1, total // PROGRESS_STEPS) == 0:
            logger.info("%s: %d/%d pieces", name, done, total)

    mirror = mirror_dump(config, dated, store, on_piece=on_piece)
    logger.info("%s: mirrored to %s, sha1 verified", dated.dump_id, mirror.dump_url)
    return mirror
