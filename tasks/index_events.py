"""The Prefect event a published index version announces: what triggers the ``refresh`` deployment (prefect.yaml)."""

from __future__ import annotations

from prefect import task
from prefect.events import emit_event

INDEX_PUBLISHED = "wikirag.index.published"
RESOURCE_PREFIX = "wikirag.index."  # the event's resource: wikirag.index.<version>; a trigger matches wikirag.index.*


@task
def announce_published(version: str, store_url: str, dump_id: str) -> str | None:
    """Emit ``wikirag.index.published`` for ``version`` of the store at ``store_url`` (its payload: version, store,
    dump_id); the event's id, or None where this process sends no events (no Prefect API)."""
    event = emit_event(event=INDEX_PUBLISHED,
                       resource={"prefect.resource.id": f"{RESOURCE_PREFIX}{version}",
                                 "prefect.resource.name": version},
                       payload={"version": version, "store": store_url, "dump_id": dump_id})
    return None if event is None else str(event.id)
