"""Published passage sets made in tests from real sample passages, without running the ingest flow."""

from __future__ import annotations

import hashlib
from functools import cache

import pyarrow as pa

from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.ingest import publish, stage_part
from rag_core.wiki.passages import REDIRECT_SCHEMA, PageCounts, passages_from_pages
from tests.conftest import SAMPLE_BZ2


@cache
def sample_passages() -> pa.Table:
    """Every passage of the real sample (4,391), in published order (needs ../shared/data: use the ``wiki`` fixture)."""
    return passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))))[0]


def publish_passages(store: Store, dump_id: str, passages: pa.Table) -> str:
    """Publish ``passages`` (the passage schema) as the ingest stage would: one part, manifest last; returns its URL."""
    counts = PageCounts(passages=passages.num_rows)
    record = stage_part(store, dump_id, "test", 0, passages, REDIRECT_SCHEMA.empty_table(), counts)
    digest = hashlib.sha256(",".join(passages.column("passage_id").to_pylist()).encode()).hexdigest()
    publish(store, dump_id, "test", {"parts": [record], "counts": counts.as_dict(),
                                     "dump": {"url": f"test://{dump_id}", "sha256": digest, "bytes": 0}})
    return store.url_of("passages", dump_id)


def publish_small_index(store: Store, dump_id: str, passages: pa.Table, encoder, shards: int,
                        factory: str = "Flat") -> str:
    """Publish ``passages`` and a Flat index version of them built with ``encoder`` (in memory); returns the version."""
    from rag_core.index.build import build_version
    from rag_core.index.embedding_files import EmbedConfig
    from rag_core.index.faiss_index import IndexConfig

    publish_passages(store, dump_id, passages)
    embed = EmbedConfig(encoder=encoder.config, shards=shards)
    return build_version(store, dump_id, embed, IndexConfig(factory=factory), encoder=encoder)
