"""The ``mirror_dump`` flow: the newest complete dated dump on a Wikimedia-style site, copied to the store and
verified, so that a rebuild parses the copy and never the site.

check (the site's listing against the dump behind LATEST) -> mirror (range requests, ``connections`` at a time,
resumable) -> verify (published sha1) -> ``<store>/dumps/<wiki>/<date>/``

``mirror_dump`` takes everything as parameters; the deployment's entry point, ``deployed_mirror_dump``, reads the
worker's settings once and passes them in. Without Prefect: ``rag_core.wiki.dump_site.check_site`` then
``rag_core.wiki.dump_mirror.mirror_dump``. The ingest deployment asks its own question of the site
(``check_dump_site_for_passages``: newer than the newest dump whose passages are published?) and mirrors with the
same task, ``mirror_dated_dump``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from rag_core.storage import Store
from rag_core.wiki.dump_mirror import MirroredDump
from rag_core.wiki.dump_site import DumpCheck, DumpSiteConfig, check_site, dump_date_of
from rag_core.wiki.ingest import PASSAGES_DIR, IngestConfig, published_manifest
from runtime.settings import Settings, StoreAccess, quiet_environment
from tasks.dumps import check_dump_site, mirror_dated_dump
from tasks.retry_policy import io_task

quiet_environment()


@flow(name="mirror_dump", validate_parameters=True)
def mirror_dump(site: DumpSiteConfig, store: StoreAccess) -> MirroredDump | None:
    """Mirror the newest complete dump when it is newer than the one behind LATEST; returns the verified mirror, or
    None when LATEST's dump is still the newest (one request to the site, nothing downloaded or parsed).

    The copy runs in this flow's process, ``site.connections`` requests at a time: never from every Dask worker.
    """
    target = store.store()
    check = check_dump_site(site, target)
    if check.newer is None:
        return None
    return mirror_dated_dump(site, check.newer, target)


@flow(name="mirror_dump-deployment", validate_parameters=True)
def deployed_mirror_dump(site: DumpSiteConfig = DumpSiteConfig()) -> MirroredDump | None:  # noqa: B008
    """The deployment's entry point: the worker's settings, read once, then ``mirror_dump`` on its store."""
    return mirror_dump(site=site, store=Settings().store_access())


def dump_date_ingested(store: Store, wiki: str, content_key: dict[str, Any]) -> str | None:
    """The newest date of a dated ``wiki`` dump whose passages, cut with the settings of ``content_key``
    (``IngestConfig.content_key``), are published on ``store``; None when there is none (any complete dump is then
    newer). A dated dump is the same bytes wherever it was read from: the mirror or the site's dated URL."""
    dates = []
    for dump_id in store.list(PASSAGES_DIR):
        manifest = None if dump_id.startswith("_") else published_manifest(store, dump_id)
        if manifest is None or manifest.get("content_key") != content_key:
            continue
        url = (manifest.get("dump") or {}).get("url")
        if isinstance(url, str) and (date := dump_date_of(url, wiki)) is not None:
            dates.append(date)
    return max(dates, default=None)


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
