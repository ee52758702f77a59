"""A version whose IVF shards are trained once together: one coarse quantizer, searched as one index."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pytest

from rag_core.index import faiss_index
from rag_core.index.build import (
    TRAINED,
    TRAINED_FACTORY,
    build_plan_shard,
    build_version,
    embed_plan_shard,
    mean_recall,
    read_embedded,
    shared_factory,
    stored_trained,
    train_plan_index,
)
from rag_core.index.embedding_files import EmbedConfig, read_ref
from rag_core.index.encoders import Encoder
from rag_core.index.faiss_index import (
    IndexConfig,
    coarse_fingerprint,
    deserialize_index,
    fast_scan_falls_short,
    set_search_params,
    train_index,
)
from rag_core.index.plan import plan_version
from rag_core.index.search import ShardedIndex
from rag_core.index.tuning import tuning_queries
from rag_core.index.version_names import INDEXES_DIR
from rag_core.index.versions import CorruptShardError, read_index_manifest, verify_version
from rag_core.storage import Store
from tests.helpers.encoderfiles import tiny_encoder
from tests.helpers.passagefiles import publish_passages, sample_passages

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 1_200
IVF = IndexConfig(factory="IVF16,Flat", tune_queries=100)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny")


def test_a_built_version_searches_its_shards_as_one_index(wiki: Path, tmp_path: Path, tiny: Encoder) -> None:
    store = Store(str(tmp_path))
    publish_passages(store, "d1", sample_passages().slice(0, N))
    version = build_version(store, "d1", EmbedConfig(encoder=tiny.config, shards=3), IVF, encoder=tiny)

    manifest = read_index_manifest(store, version)
    assert verify_version(store, version) > 0  # every file a version reads, checked as always
    trained = deserialize_index(store.read_bytes(INDEXES_DIR, version, TRAINED))
    assert trained.ntotal == 0 and {e.meta["coarse_sha256"] for e in manifest.shards} == {coarse_fingerprint(trained)}
    assert {e.meta["search"]["nprobe"] for e in manifest.shards} == {faiss.downcast_index(trained).nprobe}
    loaded = ShardedIndex.load(store, version)
    assert loaded.merged and loaded.num_shards == 3  # the shards' lists moved into one index on load

    vectors = np.concatenate([read_ref(store, e.embeddings)[1] for e in manifest.shards])
    whole = faiss.clone_index(trained)
    whole.add(vectors)
    _, queries = tuning_queries(vectors, 200, IVF.tune_query_cosine, seed=[7])
    for nprobe in (1, 4):  # at one nprobe the shards return the one index's passages, in its order
        loaded.set_search_params(nprobe=nprobe)
        set_search_params(whole, nprobe=nprobe)
        want_scores, want = whole.search(queries, 10)
        scores, shards, rows = loaded.search_rows(queries, 10)
        found = np.where(rows >= 0, np.array([e.embeddings.start for e in manifest.shards])[shards] + rows, -1)
        assert np.array_equal(found < 0, want < 0)  # the lists probed hold fewer than 10: the same misses
        assert np.allclose(scores[want >= 0], want_scores[want >= 0], atol=1e-5)
        tied = np.isclose(want_scores[:, :, None], want_scores[:, None, :], atol=1e-6).sum(-1) > 1
        assert np.array_equal(found[~tied], want[~tied]) and tied.mean() < 0.5  # ties: the lower shard first


def test_shards_built_without_the_training_step_train_apart(wiki: Path, tmp_path: Path, tiny: Encoder) -> None:
    store = Store(str(tmp_path))
    publish_passages(store, "d1", sample_passages().slice(0, N))
    plan = plan_version(store, "d1", EmbedConfig(encoder=tiny.config, shards=3), IVF, encoder=tiny)
    for s in range(plan.num_shards):
        embed_plan_shard(store, plan, s, encoder=tiny)
    built = [build_plan_shard(store, plan, s) for s in range(plan.num_shards)]  # a flow skipping train_plan_index
    assert all("coarse_sha256" not in b.entry.meta for b in built)
    assert not store.exists(INDEXES_DIR, plan.version, TRAINED)
    assert train_plan_index(store, plan) == "IVF16,Flat" and store.exists(INDEXES_DIR, plan.version, TRAINED)
    first = store.read_bytes(INDEXES_DIR, plan.version, TRAINED)
    assert train_plan_index(store, plan) == "IVF16,Flat"  # a resumed build keeps what was trained
    assert store.read_bytes(INDEXES_DIR, plan.version, TRAINED) == first
    again = [build_plan_shard(store, plan, s) for s in range(plan.num_shards)]
    assert len({b.entry.meta["coarse_sha256"] for b in again}) == 1


def test_one_shard_or_an_untrained_factory_trains_nothing_together(wiki: Path, tmp_path: Path, tiny: Encoder) -> None:
    store = Store(str(tmp_path))
    publish_passages(store, "d1", sample_passages().slice(0, 300))
    for shards, config in ((1, IVF), (3, IndexConfig(factory="HNSW32", tune_queries=50))):
        plan = plan_version(store, "d1", EmbedConfig(encoder=tiny.config, shards=shards), config, encoder=tiny)
        assert train_plan_index(store, plan) is None and not store.exists(INDEXES_DIR, plan.version, TRAINED)


def test_auto_falls_back_to_the_graph_where_the_encoders_vectors_defeat_fast_scan(
        wiki: Path, tmp_path: Path, tiny: Encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny random encoder's vectors are all alike: no re-rank depth up to AUTO_MAX_DEPTH lets 4-bit codes
    find their neighbours, so auto's sharded version becomes HNSW32, named beside the stored (empty) graph every
    shard fills."""
    monkeypatch.setattr(faiss_index, "FLAT_MAX_VECTORS", 500)  # so that 1,200 passages are past exact search
    store = Store(str(tmp_path))
    publish_passages(store, "d1", sample_passages().slice(0, N))
    auto = IndexConfig(tune_queries=100)
    plan = plan_version(store, "d1", EmbedConfig(encoder=tiny.config, shards=3), auto, encoder=tiny)
    assert shared_factory(plan) == "IVF16,PQ16x4fs,RFlat"  # what auto plans for 3 shards of 1,200 (lists capped by the 39 rows each trains on)
    for s in range(plan.num_shards):
        embed_plan_shard(store, plan, s, encoder=tiny)
    assert train_plan_index(store, plan) == "HNSW32"  # the vectors decided
    root = store.child(INDEXES_DIR, plan.version)
    assert json.loads(root.read_bytes(TRAINED_FACTORY)) == {"factory": "HNSW32"}
    built = [build_plan_shard(store, plan, s) for s in range(plan.num_shards)]
    assert {b.factory for b in built} == {"HNSW32"} and mean_recall(built) >= auto.recall_target

    # the fast-scan it refused: tuned on the same sample, short of the target or deeper than auto allows
    vectors = np.concatenate([read_embedded(store, plan, s)[2] for s in range(plan.num_shards)])
    assert fast_scan_falls_short(train_index(vectors, auto, "IVF16,PQ16x4fs,RFlat"), auto.recall_target)

    root.write_bytes(json.dumps({"factory": "IVF4,Flat"}).encode(), TRAINED_FACTORY)  # not a name this plan allows
    with pytest.raises(CorruptShardError, match="trained.json: names 'IVF4,Flat', not this plan's"):
        stored_trained(store, plan)
