"""Build leases around a flow's work: taken before it starts, beating while it runs, released however it ends.

``gc`` and ``indexes delete`` keep what a live lease protects; a second run of
the same input waits for the first (then finds its result published).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prefect import get_run_logger

from rag_core.errors import StoreError
from rag_core.leases import DEFAULT_TTL_S, Lease, LeaseRecord, take_lease
from rag_core.storage import Store
from rag_core.wiki.ingest import PASSAGES_DIR, STAGING_DIR

if TYPE_CHECKING:  # the index modules load torch and FAISS: not for an ingest
    from rag_core.index.plan import IndexPlan

# How long a run waits for another run of the same input (an ingest of a full dump takes hours) before it stops
# with one line naming that run.
WAIT_S = 6 * 3600.0


@contextlib.contextmanager
def build_lease(store: Store, kind: str, key: str, protects: Iterable[str], note: str,
                wait_s: float = WAIT_S, ttl_s: float = DEFAULT_TTL_S) -> Iterator[Lease]:
    """Hold the lease on ``kind/key`` while the block runs: wait (logging for whom) while another run holds it,
    take over one whose run died, refresh it in the background, release it when the block ends, however it ends
    (``ttl_s``: StoreAccess.lease_ttl_s, the setting WIKIRAG_LEASE_TTL_S)."""
    logger = get_run_logger()

    def waiting(holder: LeaseRecord) -> None:
        logger.info("waiting (up to %.0f min) for another run of the same input: %s", wait_s / 60, holder.describe())

    lease = take_lease(store, kind, key, ttl_s=ttl_s, wait_s=wait_s, protects=protects, note=note, on_wait=waiting)
    if lease.took_over is not None:
        logger.warning("took over the expired %s: that run ended without releasing it", lease.took_over.describe())
    lease.start_heartbeat(on_error=lambda exc: logger.warning("lease heartbeat failed, retrying: %s", exc))
    try:
        yield lease
    finally:
        lost = lease.lost  # read before release(), which marks a released lease as no longer this run's
        try:
            lease.release()
        except StoreError as exc:  # the run's outcome stands; the lease expires after its ttl
            logger.warning("lease %s/%s not released (%s); it expires %.0f s after its last heartbeat", kind, key,
                           exc, lease.record.ttl_s)
    if lost:
        logger.warning("the %s lease %s was taken over while this run worked (its heartbeat stalled past the ttl)",
                       kind, key)


def ingest_lease(store: Store, dump_id: str, dump_url: str,
                 ttl_s: float = DEFAULT_TTL_S) -> contextlib.AbstractContextManager[Lease]:
    """An ingest's lease on its passage set: its staged parts and its published folder."""
    protects = [f"{PASSAGES_DIR}/{STAGING_DIR}/{dump_id}/", f"{PASSAGES_DIR}/{dump_id}/"]
    return build_lease(store, "ingest", dump_id, protects, f"ingest of {dump_url}", ttl_s=ttl_s)


def index_lease(store: Store, dump_id: str, ttl_s: float = DEFAULT_TTL_S) -> contextlib.AbstractContextManager[Lease]:
    """An index build's lease on its passage set's embedding ranges (any encoder), from before it plans: the ranges
    a resumed build reuses are kept however old they are."""
    from rag_core.index.embedding_files import EMBEDDINGS_DIR

    return build_lease(store, "index", dump_id, [f"{EMBEDDINGS_DIR}/*/{dump_id}/"], f"index build of {dump_id}",
                       ttl_s=ttl_s)


def protect_plan(lease: Lease, plan: IndexPlan) -> None:
    """Add a planned build's version folder and the embedding folder it reuses vectors from to its lease."""
    from rag_core.index.embedding_files import EMBEDDINGS_DIR
    from rag_core.index.version_names import INDEXES_DIR

    reused = [f"{EMBEDDINGS_DIR}/{plan.fingerprint_id}/{plan.reuse_from}/"] if plan.reuse_from else []
    if not lease.protect(f"{INDEXES_DIR}/{plan.version}/", *reused):
        get_run_logger().warning("the index lease of %s was taken over by another run", plan.dump_id)
