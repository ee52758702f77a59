"""build_version: versions of one store that never disturb each other (local and S3), without Prefect."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pytest

from rag_core.errors import GateError
from rag_core.index.build import build_version, embed_plan_shard
from rag_core.index.embedding_files import EmbedConfig, read_ref
from rag_core.index.encoders import Encoder
from rag_core.index.faiss_index import IndexConfig
from rag_core.index.plan import GateConfig, plan_version
from rag_core.index.retention import CleanupConfig, collect_garbage, delete_version, pin_version, unpin_version
from rag_core.index.search import ShardedIndex
from rag_core.index.tuning import tuning_queries
from rag_core.index.version_names import IndexVersionError
from rag_core.index.versions import latest_version, list_versions, read_index_manifest, verify_version
from rag_core.model.retriever import IndexRetriever
from rag_core.storage import Store
from tests.helpers.encoderfiles import CountingEncoder, tiny_encoder
from tests.helpers.passagefiles import publish_passages, sample_passages

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 120  # passages of the first dump: small, so that the whole story runs in seconds



@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny")


def dumps(wiki: Path) -> tuple[pa.Table, pa.Table, int]:
    """The first dump's passages, a later dump's (2 edited, 1 gone, 10 new) and how many of those differ."""
    first = sample_passages().slice(0, N)
    rows = first.to_pylist()
    rows[7]["text"] += " Edited later."
    rows[50]["text"] = rows[50]["text"].upper()
    del rows[90]
    rows += sample_passages().slice(N, 10).to_pylist()
    return first, pa.Table.from_pylist(rows, schema=first.schema), 2 + 10


def snapshot(store: Store, version: str) -> dict[str, tuple[str, float]]:
    """sha256 and last-modified time of every file the version reads."""
    listing = store.files()
    return {p: (hashlib.sha256(store.read_bytes(p)).hexdigest(), listing[p][1])
            for p in read_index_manifest(store, version).files()}


def search(store: Store, version: str, queries: np.ndarray) -> list[list[tuple[str, float]]]:
    return [[(h.passage_id, h.score) for h in q] for q in ShardedIndex.load(store, version).search(queries, 10)]


def test_versions_share_vectors_and_never_disturb_each_other(wiki: Path, store: Store, tiny: Encoder) -> None:
    first, later, changed = dumps(wiki)
    publish_passages(store, "d1", first)
    publish_passages(store, "d2", later)
    encoder = CountingEncoder(tiny)
    embed = EmbedConfig(encoder=tiny.config, shards=2)
    v1 = build_version(store, "d1", embed, IndexConfig(factory="Flat"), encoder=encoder)
    assert encoder.encoded == N
    queries = tiny.encode_questions(["Who founded anarchism?", "What is the capital of Alabama?"])
    before, files = search(store, v1, queries), snapshot(store, v1)
    vectors = IndexRetriever.load(store, v1).vectors

    v2 = build_version(store, "d1", embed.model_copy(update={"shards": 4}), IndexConfig(factory="HNSW32"),
                       encoder=encoder)
    assert encoder.encoded == N  # another shard count and factory: every vector copied, none encoded
    v3 = build_version(store, "d2", embed.model_copy(update={"shards": 3}), IndexConfig(factory="Flat"),
                       encoder=encoder)
    assert encoder.encoded == N + changed  # another dump: only new and edited passages encoded

    assert search(store, v1, queries) == before and snapshot(store, v1) == files  # v1 as it was, byte for byte
    assert all(np.array_equal(a, b) for a, b in zip(IndexRetriever.load(store, v1).vectors, vectors))
    m1, m2, m3 = (read_index_manifest(store, v) for v in (v1, v2, v3))
    assert [len(m.shards) for m in (m1, m2, m3)] == [2, 4, 3] and (m1.factory, m2.factory) == ("Flat", "HNSW32")
    assert (m1.dump_id, m2.dump_id, m3.dump_id) == ("d1", "d1", "d2") and m3.count == later.num_rows
    assert not set(m1.files()) & set(m2.files()) & set(m3.files())
    assert all(verify_version(store, v) == 4 * len(m.shards) for v, m in ((v1, m1), (v2, m2), (v3, m3)))
    for version, manifest in ((v2, m2), (v3, m3)):  # each version finds its own passages with its own index
        ids, own = zip(*(read_ref(store, e.embeddings) for e in manifest.shards))
        hits = ShardedIndex.load(store, version).search(np.concatenate(own)[::10], 1)
        assert [q[0].passage_id for q in hits] == [i for part in ids for i in part][::10]

    # Deleting v2 removes its own files only; v1 and v3 keep working.
    pin_version(store, v1, "model-a")
    with pytest.raises(IndexVersionError, match=f"refusing to delete {v1}: held by pin 'model-a'; unpin it"):
        delete_version(store, v1)
    with pytest.raises(IndexVersionError, match=f"refusing to delete {v3}: held by LATEST"):
        delete_version(store, v3)
    removed = delete_version(store, v2)
    assert set(m2.files()) <= set(removed.files) and not set(removed.files) & (set(m1.files()) | set(m3.files()))
    assert list_versions(store) == [v1, v3] and latest_version(store) == v3
    assert search(store, v1, queries) == before and snapshot(store, v1) == files
    assert verify_version(store, v1) == 8 and verify_version(store, v3) == 12
    unpin_version(store, v1, "model-a")

    # A build killed after embedding two of five shards: kept while fresh, collected once abandoned.
    plan = plan_version(store, "d1", embed.model_copy(update={"shards": 5}), encoder=encoder)
    leftovers = [embed_plan_shard(store, plan, s, encoder=encoder) for s in (0, 1)]
    assert collect_garbage(store).files == {}
    later_on = max(m for _, m in store.files().values()) + 25 * 3600
    gone = collect_garbage(store, CleanupConfig(older_than_hours=24), now=later_on)
    assert {p.rsplit("/", 1)[0] for p in gone.files} == {f"indexes/{plan.version}", f"embeddings/{plan.fingerprint_id}/d1"}
    assert sum(p.endswith(".json") and "embeddings/" in p for p in gone.files) == len(leftovers)
    assert verify_version(store, v1) == 8 and verify_version(store, v3) == 12  # published versions untouched
    assert collect_garbage(store, now=later_on).files == {}


def test_a_failed_check_publishes_nothing(wiki: Path, tmp_path: Path, tiny: Encoder) -> None:
    store = Store(str(tmp_path))
    publish_passages(store, "d1", sample_passages().slice(0, 40))
    good = build_version(store, "d1", EmbedConfig(encoder=tiny.config, shards=1), encoder=tiny)
    with pytest.raises(GateError, match=r"not published: held-out recall@10 0\.\d+ < target 0\.95"):
        build_version(store, "d1", EmbedConfig(encoder=tiny.config, shards=1), IndexConfig(factory="PQ2x4"),
                      GateConfig(recall_queries=20), encoder=tiny)
    assert list_versions(store) == [good] and latest_version(store) == good
    assert sorted(p.name for p in (tmp_path / "indexes").iterdir()) == sorted([good, "LATEST"])
    plan = json.loads((tmp_path / "indexes" / good / "plan.json").read_text())
    assert (plan["dump_id"], plan["num_shards"], plan["n_passages"]) == ("d1", 1, 40)


TUNED_N = 1_200  # real passages: enough for an HNSW graph whose efSearch matters


def test_an_ann_version_is_built_tuned_and_searched_at_its_target(wiki: Path, tmp_path: Path, tiny: Encoder) -> None:
    store = Store(str(tmp_path))
    publish_passages(store, "d1", sample_passages().slice(0, TUNED_N))
    embed = EmbedConfig(encoder=tiny.config, shards=2)
    config = IndexConfig(factory="HNSW32", ef_construction=40, tune_queries=200, recall_target=0.95)
    version = build_version(store, "d1", embed, config, encoder=tiny)
    flat = build_version(store, "d1", embed, IndexConfig(factory="Flat"), encoder=tiny)

    manifest = read_index_manifest(store, version)
    index = ShardedIndex.load(store, version)
    vectors = np.concatenate([read_ref(store, e.embeddings)[1] for e in manifest.shards])
    for s, entry in enumerate(manifest.shards):  # each shard: the cheapest tried setting that met the target
        meta = entry.meta
        ef = meta["search"]["efSearch"]
        assert meta["factory"] == "HNSW32" and meta["ef_construction"] == 40 and meta["qps"] > 0
        assert meta["recall_at_10"] >= config.recall_target and meta["recall_target"] == config.recall_target
        assert meta["tried"][str(ef)] == meta["recall_at_10"]
        assert all(r < config.recall_target for v, r in meta["tried"].items() if int(v) < ef)
        assert faiss.downcast_index(index.shards[s]).hnsw.efSearch == ef  # applied on load
    # Fresh question-like queries (another seed than tuning's), against exact search over the Flat version.
    _, queries = tuning_queries(vectors, 300, config.tune_query_cosine, seed=[99])
    truth = {i: {h.passage_id for h in q} for i, q in enumerate(ShardedIndex.load(store, flat).search(queries, 10))}
    found = index.search(queries, 10)
    recall = np.mean([len(truth[i] & {h.passage_id for h in q}) / 10 for i, q in enumerate(found)])
    assert recall >= config.recall_target - 0.02  # tuned on other queries of the same kind: the target, give or take
    narrow = ShardedIndex.load(store, version)
    narrow.set_search_params(ef_search=10)
    coarse = np.mean([len(truth[i] & {h.passage_id for h in q}) / 10
                      for i, q in enumerate(narrow.search(queries, 10))])
    assert coarse < recall  # without the stored setting, FAISS's narrow default loses neighbours

    assert all(e.meta == {"factory": "Flat"} for e in read_index_manifest(store, flat).shards)  # exact: untuned
    assert all(not hasattr(faiss.downcast_index(i), "hnsw") for i in ShardedIndex.load(store, flat).shards)
