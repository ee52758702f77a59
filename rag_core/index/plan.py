"""The plan of an index version: which passages, which encoder, how many shards, which version name.

:func:`plan_version` is the first step of every build (rag_core.index.build,
the ``index_rebuild`` flow): it counts the published passages, fingerprints
the encoder, cuts the shards, names the version and records the plan in
``indexes/<version>/plan.json``, which cleanup reads to tell a running build
from an abandoned one. Every later step takes the :class:`IndexPlan`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from rag_core.errors import StoreError, WikiragError
from rag_core.index.embedding_files import EmbedConfig, shard_bounds
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.index.incremental_embedding import PassageEncoder
from rag_core.index.version_names import INDEXES_DIR, PLAN, new_version_id
from rag_core.index.versions import read_index_manifest
from rag_core.storage import Store
from rag_core.wiki.ingest import PASSAGES_DIR, published_manifest


class GateConfig(BaseModel):
    """The index stage's gates (the recall target is ``IndexConfig.recall_target``: ``auto`` sizes for it too)."""

    recall_queries: int = Field(1000, ge=1, description="held-out queries of the recall gate, over all shards")


@dataclass
class IndexPlan:
    """What a build makes: which passages, which encoder, how many shards, which version."""

    dump_id: str
    passages_url: str
    dump: dict[str, Any]  # the passages manifest's dump record: url, sha256, bytes
    n_passages: int
    num_shards: int
    encoder: EncoderConfig
    fingerprint: dict[str, Any]
    fingerprint_id: str
    dim: int
    index: IndexConfig
    gate: GateConfig
    version: str
    reuse_from: str | None = None
    started: float = field(default_factory=time.time)

    def bounds(self, shard_id: int) -> tuple[int, int]:
        return shard_bounds(self.n_passages, shard_id, self.num_shards)


@functools.cache
def load_encoder(config: EncoderConfig) -> Encoder:
    """One loaded encoder per config and process: a worker keeps it for every shard it is given."""
    return Encoder.load(config)


def dump_id_of(passages_url: str) -> str:
    """The passage set's id: the last part of its URL (``<store>/passages/<dump_id>``)."""
    return passages_url.rstrip("/").rsplit("/", 1)[-1]


def previous_dump(store: Store, fingerprint_id: str, dump_id: str) -> str | None:
    """The passage set behind LATEST, when it differs from ``dump_id`` and its vectors fit this encoder."""
    try:
        manifest = read_index_manifest(store)
    except WikiragError:  # nothing published, or a LATEST that cannot be read: nothing to reuse
        return None
    if manifest.fingerprint_id != fingerprint_id or manifest.dump_id == dump_id:
        return None
    return manifest.dump_id


def plan_version(store: Store, dump_id: str, embed: EmbedConfig | None = None, index: IndexConfig | None = None,
                 gate: GateConfig | None = None, *, encoder: PassageEncoder | None = None) -> IndexPlan:
    """Count the passages, fingerprint the encoder, cut the shards, name the version and record the plan.

    ``encoder`` (default: loaded from ``embed.encoder``) gives the fingerprint
    (and the config recorded, when it has one);
    the plan is written to ``indexes/<version>/plan.json`` so that cleanup can
    tell a running build from an abandoned one.
    """
    embed, index, gate = embed or EmbedConfig(), index or IndexConfig(), gate or GateConfig()
    passages = published_manifest(store, dump_id)
    if passages is None:
        raise StoreError(f"{store.url_of(PASSAGES_DIR, dump_id)}: no published passages; run ingest first")
    n = int(passages["counts"]["passages"])
    encoder = encoder or load_encoder(embed.encoder)
    config = encoder.config if isinstance(getattr(encoder, "config", None), EncoderConfig) else embed.encoder
    config = config.model_copy(update={"device": embed.encoder.device})  # as asked: each worker resolves its own
    plan = IndexPlan(
        dump_id=dump_id, passages_url=store.url_of(PASSAGES_DIR, dump_id), dump=passages["dump"], n_passages=n,
        num_shards=embed.num_shards(n), encoder=config, fingerprint=encoder.fingerprint,
        fingerprint_id=encoder.fingerprint_id, dim=encoder.dim, index=index, gate=gate, version=new_version_id(),
        reuse_from=embed.reuse_from or previous_dump(store, encoder.fingerprint_id, dump_id),
    )
    record = {"version": plan.version, "dump_id": dump_id, "fingerprint_id": plan.fingerprint_id,
              "reuse_from": plan.reuse_from, "n_passages": n, "num_shards": plan.num_shards}
    store.child(INDEXES_DIR, plan.version).write_json(record, PLAN)
    return plan


def describe_plan(plan: IndexPlan) -> str:
    """One log line: passages, shards, encoder, version, reuse source."""
    reuse = f", reusing vectors of {plan.reuse_from}" if plan.reuse_from else ""
    return (f"{plan.n_passages:,} passages in {plan.num_shards} shards, encoder {plan.fingerprint['name']} "
            f"({plan.fingerprint_id}), version {plan.version}{reuse}")
