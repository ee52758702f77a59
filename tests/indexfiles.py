"""Small real index versions built in one process, for tests of what reads them."""

from __future__ import annotations

import pyarrow as pa

from rag_core.index.embeddings import EmbedConfig, embed_shard, passage_shard, read_shard
from rag_core.index.faiss_index import IndexConfig, build_shard_index, serialize_index
from rag_core.index.versions import ShardPayload, new_version_id, publish_manifest, write_shard
from rag_core.storage import Store


def publish_small_index(store: Store, dump_id: str, passages: pa.Table, encoder, *, shards: int = 2,
                        factory: str = "Flat") -> str:
    """Embed ``passages`` (passage_id, title, text) in ``shards`` shards, index and publish them; returns the version."""
    version = new_version_id()
    config = IndexConfig(factory=factory)
    entries = []
    for shard in range(EmbedConfig(shards=shards).num_shards(passages.num_rows)):
        table = passage_shard(passages, shard, shards)
        embed_shard(store, dump_id, table, encoder, shard)
        _, vectors = read_shard(store, encoder.fingerprint_id, dump_id, shard)
        index = build_shard_index(vectors, config)
        entries.append(write_shard(store, version, shard, ShardPayload(serialize_index(index), table)))
    fields = {"dim": encoder.dim, "metric": "ip", "factory": factory, "encoder": encoder.fingerprint,
              "fingerprint_id": encoder.fingerprint_id, "dump_id": dump_id,
              "encoder_config": encoder.config.model_dump()}
    return publish_manifest(store, version, entries, fields)
