"""The ``mirror_dump`` flow: the newest complete dated dump on a Wikimedia-style site, copied to the store and
verified, so that a rebuild parses the copy and never the site.

check (the site's listing against the dump behind LATEST) -> mirror (range requests, ``connections`` at a time,
resumable) -> verify (published sha1) -> ``<store>/dumps/<wiki>/<date>/``

``mirror_dump`` takes everything as parameters; the deployment's entry point, ``deployed_mirror_dump``, reads the
worker's settings once and passes them in. Without Prefect: ``rag_core.wiki.dump_site.check_site`` then
``rag_core.wiki.dump_mirror.mirror_dump``. The ingest deployment asks its own question of the site
(``tasks.dumps.check_dump_site_for_passages``: newer than the newest dump whose passages are published?) and mirrors with the
same task, ``mirror_dated_dump``.
"""

from __future__ import annotations

from prefect import flow

from rag_core.wiki.dump_mirror import MirroredDump
from rag_core.wiki.dump_site import DumpSiteConfig
from runtime.settings import Settings, StoreAccess, quiet_environment
from tasks.dumps import check_dump_site, mirror_dated_dump

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
