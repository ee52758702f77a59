"""Build an index version from a published passage set: embed each shard, index each shard, check, publish.

:func:`build_version` does it all in one process (a notebook, a script); the
``index_rebuild`` flow maps the same per-shard functions over Dask workers and
puts Great Expectations gates between the steps. The first step, which every
other takes the result of, is :func:`rag_core.index.plan.plan_version`::

    plan_version ──▶ embed_plan_shard ──▶ train_plan_index ──▶ build_plan_shard ──▶ publish_plan
     │ counts,          │ (each shard)       │ once, on a sample    │ (each shard)        │ manifest
     │ fingerprint,     │ write-once         │ of every shard's     │ FAISS index tuned   │ (references every
     │ shard cut,       │ embedding files,   │ vectors (IVF/SQ/PQ   │ to the recall       │ file read),
     │ version name,    │ reused where       │ factories)           │ target + held-out   │ then LATEST
     ▼ plan.json        ▼ they exist         ▼ trained.faiss        ▼ recall@10, unpublished

``train_plan_index`` gives the shards of a version one trained, empty index to
fill: IVF shards then share one coarse quantizer, and searching them costs what
searching one index costs (:mod:`rag_core.index.search`). Without it (a flow
that skips the step) each shard trains its own, and search searches each
shard whole.

Every step is idempotent: a rerun with the same plan settings skips the
embedding ranges that are done, so a killed run loses only the shards in flight.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag_core.errors import GateError, StoreError
from rag_core.index.embedding_files import (
    EmbedConfig,
    embedding_ref,
    range_record,
    read_record,
    vector_stats,
)
from rag_core.index.encoders import EncoderError
from rag_core.index.faiss_index import (
    IndexConfig,
    TrainedIndex,
    build_tuned_shard,
    deserialize_index,
    needs_training,
    serialize_index,
    train_version_index,
)
from rag_core.index.incremental_embedding import PassageEncoder, ReuseTable, embed_rows, load_reuse_table
from rag_core.index.manifest import ShardEntry
from rag_core.index.plan import GateConfig, IndexPlan, load_encoder, plan_version
from rag_core.index.retention import delete_version
from rag_core.index.tuning import RECALL_K, heldout_recall
from rag_core.index.version_names import INDEXES_DIR
from rag_core.index.versions import CorruptShardError, ShardPayload, publish_manifest, write_shard
from rag_core.storage import Store
from rag_core.wiki.ingest import read_passage_rows

Progress = Callable[[int], None]  # called with the number of passages (or vectors) just finished


@dataclass
class EmbeddedShard:
    """One shard's embedding record and the per-vector facts its gate checks."""

    shard: int
    record: dict[str, Any]
    expected: int  # passages in the shard
    dim: int  # columns of the stored matrix
    norm: np.ndarray
    finite: np.ndarray
    matches_passage: np.ndarray  # stored id i == passage i of the shard


@dataclass
class BuiltShard:
    """One shard's FAISS index, written into the unpublished version, and its held-out recall."""

    shard: int
    entry: ShardEntry
    ntotal: int
    expected: int
    factory: str
    recall: np.ndarray
    seconds: float
    ids_match: bool  # the index's passages are the embedded ones, row for row


class _OnDemandEncoder:
    """The plan's fingerprint, with the model loaded only when something must be encoded.

    A resumed run finds most shards done: checking them needs the fingerprint,
    which the plan carries, not the model, which takes seconds to load.
    """

    def __init__(self, plan: IndexPlan, threads: int | None) -> None:
        self.config, self.threads = plan.encoder, threads
        self.fingerprint, self.fingerprint_id, self.dim = plan.fingerprint, plan.fingerprint_id, plan.dim

    def encode_passages(self, titles: Any, texts: Any, progress: Progress | None = None) -> np.ndarray:
        if self.threads:  # e.g. the threads a Dask worker declares: workers sharing a host do not oversubscribe it
            import torch

            torch.set_num_threads(self.threads)
        encoder = load_encoder(self.config)
        if encoder.fingerprint_id != self.fingerprint_id:
            raise EncoderError(f"the encoder at {self.config.path or 'the packaged MiniLM'} changed during the run "
                               f"(fingerprint {encoder.fingerprint_id}, planned {self.fingerprint_id}); rerun")
        return encoder.encode_passages(titles, texts, progress)


_REUSE: dict[tuple[str, str], ReuseTable] = {}


def _reuse_table(store: Store, plan: IndexPlan) -> ReuseTable | None:
    """The earlier passage set's vectors, loaded once per build and process (a later build lists them anew)."""
    if plan.reuse_from is None:
        return None
    key = (store.url, plan.version)
    if key not in _REUSE:
        _REUSE.clear()  # one build at a time per worker
        _REUSE[key] = load_reuse_table(store, plan.fingerprint_id, plan.reuse_from)
    return _REUSE[key]


def embed_plan_shard(store: Store, plan: IndexPlan, shard_id: int, *, encoder: PassageEncoder | None = None,
                     threads: int | None = None, progress: Progress | None = None) -> EmbeddedShard:
    """Embed one shard of the plan (done: skipped; else reused where possible, the rest encoded).

    Returns the record and what the embeddings gate checks, computed from the
    files as stored. ``threads`` caps torch's threads when the model loads.
    """
    start, stop = plan.bounds(shard_id)
    table = read_passage_rows(store, plan.dump_id, start, stop, columns=["passage_id", "title", "text"])
    record = embed_rows(store, plan.dump_id, start, table, encoder or _OnDemandEncoder(plan, threads),
                        _reuse_table(store, plan), progress)
    stored = range_record(store, plan.fingerprint_id, plan.dump_id, start, stop) or record
    ids, _, vectors = read_record(store, plan.fingerprint_id, plan.dump_id, stored)
    stats = vector_stats(vectors)
    expected = table.column("passage_id").to_pylist()
    matches = np.array([a == b for a, b in zip(ids, expected)] + [False] * max(0, len(ids) - len(expected)), bool)
    return EmbeddedShard(shard_id, record, table.num_rows, int(vectors.shape[1]), stats["norm"], stats["finite"],
                         matches)


TRAINED = "trained.faiss"  # in the version's folder: the trained, empty index every shard copies
TRAINED_FACTORY = "trained.json"  # beside it, written first: the factory it is ({"factory": ...})
TRAIN_STREAM = 2  # training sample: seed [seed, 0, 2]; tuning draws [seed, shard, 1], the gate [seed, shard]


def shared_factory(plan: IndexPlan) -> str | None:
    """The factory the plan's shards train once together, or None (one shard, or nothing to train)."""
    if plan.num_shards < 2:
        return None
    factory = plan.index.resolve_factory(plan.n_passages, plan.dim, total_vectors=plan.n_passages,
                                         shards=plan.num_shards)
    return factory if needs_training(factory, plan.dim) else None


def train_plan_index(store: Store, plan: IndexPlan) -> str | None:
    """Train the version's index once, on a seeded sample of every shard's vectors; returns its factory.

    Writes ``indexes/<version>/trained.faiss`` (kept when it exists: a resumed
    build trains nothing), which :func:`build_plan_shard` copies into each
    shard. None, and nothing written, when the shards share nothing
    (:func:`shared_factory`). Run it after every shard is embedded and before any is built.
    """
    factory = shared_factory(plan)
    root = store.child(INDEXES_DIR, plan.version)
    if factory is None or root.exists(TRAINED):
        return trained_factory(root, plan, factory)
    take = min(plan.index.train_sample, plan.n_passages)
    rows = np.sort(np.random.default_rng([plan.index.seed, 0, TRAIN_STREAM]).choice(plan.n_passages, take,
                                                                                  replace=False))
    parts = []
    for shard_id in range(plan.num_shards):
        start, stop = plan.bounds(shard_id)
        mine = rows[(rows >= start) & (rows < stop)] - start
        if len(mine):
            parts.append(read_embedded(store, plan, shard_id)[2][mine])
    trained = train_version_index(np.concatenate(parts), plan.index, total_vectors=plan.n_passages,
                                  shards=plan.num_shards)
    root.write_bytes(json.dumps({"factory": trained.factory}).encode(), TRAINED_FACTORY)
    root.write_bytes(serialize_index(trained.index), TRAINED)  # last: its presence means both are whole
    return trained.factory


def trained_factory(root: Store, plan: IndexPlan, planned: str | None) -> str | None:
    """The factory of a version's stored trained index: the planned one, or the fallback auto took for these
    vectors (:func:`~rag_core.index.faiss_index.train_version_index`); any other name is refused."""
    if planned is None or not root.exists(TRAINED_FACTORY):
        return planned
    try:
        named = json.loads(root.read_bytes(TRAINED_FACTORY))["factory"]
        if not isinstance(named, str):
            raise TypeError(f"factory is {type(named).__name__}")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptShardError(f"{root.url_of(TRAINED_FACTORY)}: unreadable; delete the unpublished version "
                                "and rebuild") from exc
    allowed = {planned, plan.index.resolve_factory(plan.n_passages, plan.dim, total_vectors=plan.n_passages,
                                                   shards=plan.num_shards, fast_scan=False)}
    if named not in allowed:
        raise CorruptShardError(f"{root.url_of(TRAINED_FACTORY)}: names {named!r}, not this plan's "
                                f"{' or '.join(sorted(allowed))}; delete the unpublished version and rebuild")
    return named


def stored_trained(store: Store, plan: IndexPlan) -> TrainedIndex | None:
    """The trained index of :func:`train_plan_index`, when the version has one."""
    planned, root = shared_factory(plan), store.child(INDEXES_DIR, plan.version)
    if planned is None or not root.exists(TRAINED):
        return None
    return TrainedIndex(trained_factory(root, plan, planned), deserialize_index(root.read_bytes(TRAINED)))


def read_embedded(store: Store, plan: IndexPlan, shard_id: int) -> tuple[dict[str, Any], list[str], np.ndarray]:
    """One shard's finished embeddings: (record, passage ids, float32 [n, dim])."""
    start, stop = plan.bounds(shard_id)
    record = range_record(store, plan.fingerprint_id, plan.dump_id, start, stop)
    if record is None:
        raise StoreError(f"shard {shard_id} (rows {start}..{stop}) of {plan.dump_id} has no finished embeddings; "
                         "embed it first (embed_plan_shard)")
    ids, _, vectors = read_record(store, plan.fingerprint_id, plan.dump_id, record)
    return record, ids, vectors


def recall_rows(plan: IndexPlan, shard_id: int, n_vectors: int) -> np.ndarray:
    """The seeded held-out query rows of one shard: its share of ``gate.recall_queries``, by size."""
    per_shard = math.ceil(plan.gate.recall_queries * n_vectors / max(plan.n_passages, 1))
    rng = np.random.default_rng([plan.index.seed, shard_id])
    return np.sort(rng.choice(n_vectors, min(per_shard, n_vectors), replace=False))


def build_plan_shard(store: Store, plan: IndexPlan, shard_id: int, *, progress: Progress | None = None) -> BuiltShard:
    """Build one shard's FAISS index from its stored vectors, measure held-out recall@10, write it unpublished.

    An HNSW or IVF shard is tuned while it is built: the cheapest efSearch /
    nprobe whose recall@10 against exact search on held-out, question-like
    queries reaches ``plan.index.recall_target``
    (:func:`~rag_core.index.faiss_index.build_tuned_shard`). The setting, that
    recall and the QPS measured go into the shard's manifest ``meta``
    (``{"factory", "search": {"efSearch": 96}, "recall_at_10", "qps", ...}``),
    from which search applies it. A Flat shard is exact and untuned: its meta
    is ``{"factory": "Flat"}``. The recall gate then measures the tuned shard on
    other held-out rows (:func:`recall_rows`): the passages themselves.
    When :func:`train_plan_index` trained the version's index, the shard fills
    a copy of it (one coarse quantizer for all shards, named in its meta's
    ``coarse_sha256``); else it trains its own.
    """
    started = time.perf_counter()
    start, stop = plan.bounds(shard_id)
    record, ids, vectors = read_embedded(store, plan, shard_id)
    passages = read_passage_rows(store, plan.dump_id, start, stop, columns=["passage_id", "title", "text"])
    # ANN shards come back tuned (efSearch / nprobe set); the report is the shard's meta, applied by search on load
    index, report = build_tuned_shard(vectors, plan.index, total_vectors=plan.n_passages, shard_id=shard_id,
                                      trained=stored_trained(store, plan))
    factory = report["factory"]
    rows = recall_rows(plan, shard_id, len(vectors))
    recall = heldout_recall(index, vectors, rows, RECALL_K, plan.index.metric) if len(vectors) > 1 else np.ones(0)
    payload = ShardPayload(serialize_index(index), passages, report,
                           embedding_ref(plan.fingerprint_id, plan.dump_id, record))
    entry = write_shard(store, plan.version, shard_id, payload)
    if progress is not None:
        progress(len(vectors))
    return BuiltShard(shard_id, entry, int(index.ntotal), stop - start, factory, recall,
                      time.perf_counter() - started, ids == passages.column("passage_id").to_pylist())


def mean_recall(built: list[BuiltShard]) -> float:
    """The shards' held-out recall@10, all queries together (1.0 when no shard had two vectors)."""
    parts = [b.recall for b in built if len(b.recall)]
    return float(np.concatenate(parts).mean()) if parts else 1.0


def publish_plan(store: Store, plan: IndexPlan, built: list[BuiltShard], gates: dict[str, Any]) -> str:
    """Write the manifest (the version becomes visible), then move LATEST to it."""
    factories = sorted({b.factory for b in built})
    fields = {
        "dim": plan.dim, "metric": plan.index.metric, "factory": ",".join(factories) if factories else "Flat",
        "factory_requested": plan.index.factory, "index_config": plan.index.model_dump(),
        "encoder": plan.fingerprint, "fingerprint_id": plan.fingerprint_id,
        "encoder_config": plan.encoder.model_dump(exclude={"device"}),  # no device: each reader resolves its own
        "dump_id": plan.dump_id, "passages": plan.passages_url, "dump": plan.dump, "gates": gates,
    }
    return publish_manifest(store, plan.version, [b.entry for b in sorted(built, key=lambda b: b.shard)], fields)


def check_version(plan: IndexPlan, embedded: list[EmbeddedShard], built: list[BuiltShard]) -> dict[str, Any]:
    """The gates of a build without Great Expectations: every passage embedded (finite) and indexed, recall."""
    problems = [f"shard {e.shard}: {int((~e.finite).sum())} vectors not finite" for e in embedded if not e.finite.all()]
    problems += [f"shard {e.shard}: stored ids differ from the passages" for e in embedded
                 if len(e.matches_passage) != e.expected or not e.matches_passage.all()]
    problems += [f"shard {b.shard}: {b.ntotal} vectors indexed for {b.expected} passages" for b in built
                 if b.ntotal != b.expected or not b.ids_match]
    recall = mean_recall(built)
    if recall < plan.index.recall_target:
        problems.append(f"held-out recall@{RECALL_K} {recall:.3f} < target {plan.index.recall_target}")
    if problems:
        raise GateError(f"index {plan.version} not published: {'; '.join(problems)}")
    return {"checks": "passed (embeddings finite, ids, counts, recall; rag_core)", f"recall@{RECALL_K}": recall}


def build_version(store: Store, dump_id: str, embed: EmbedConfig | None = None, index: IndexConfig | None = None,
                  gate: GateConfig | None = None, *, encoder: PassageEncoder | None = None,
                  progress: Progress | None = None) -> str:
    """Build, check and publish an index version of a published passage set in this process; returns it.

    The same steps as the ``index_rebuild`` flow, one shard after another and
    without Prefect, Dask or Great Expectations (:func:`check_version` stands in
    for the gates). ``encoder`` replaces loading ``embed.encoder`` (e.g. one
    already in memory). A failed check publishes nothing and removes the
    unpublished files; LATEST moves only on success.
    """
    plan = plan_version(store, dump_id, embed, index, gate, encoder=encoder)
    try:
        embedded = [embed_plan_shard(store, plan, s, encoder=encoder, progress=progress) for s in range(plan.num_shards)]
        train_plan_index(store, plan)
        built = [build_plan_shard(store, plan, s) for s in range(plan.num_shards)]
        gates = check_version(plan, embedded, built)
    except BaseException:
        delete_version(store, plan.version)  # unpublished: nobody can see its files, nobody needs them
        raise
    return publish_plan(store, plan, built, gates)
