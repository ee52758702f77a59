"""DaskRetriever: shards and stored vectors held by the workers of a real local Dask cluster, against IndexRetriever
on the same published version (a real FAISS index of real passages, a real tiny encoder)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from distributed import Client

from rag_core.errors import StoreError
from rag_core.index.faiss_index import IndexConfig, build_shard_index, serialize_index
from rag_core.index.manifest import IndexManifest
from rag_core.index.versions import ShardPayload, publish_version, read_manifest
from rag_core.model.retriever import IndexRetriever, RetrieverError
from rag_core.storage import Store
from tasks.adapters.dask_retriever import DaskRetriever
from tests.helpers.encoderfiles import tiny_encoder
from tests.helpers.passagefiles import publish_small_index, sample_passages
from tests.tasks.conftest import held_after_release, shard_keys

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def published(wiki: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("dask-retriever")
    store = Store(str(root / "store"))
    encoder = tiny_encoder(root / "bert")
    passages = sample_passages().slice(0, 300)
    version = publish_small_index(store, "d1", passages, encoder, shards=3)
    questions = encoder.encode_questions(["What is anarchism?", "Where is Alabama?", "Who was Achilles?"])
    return store, version, questions


def test_same_retrieved_as_the_in_process_retriever(client: Client, published) -> None:
    store, version, questions = published
    local = IndexRetriever.load(store, version)
    with DaskRetriever.load(client, store, version) as remote:
        assert (remote.version, remote.fingerprint, remote.manifest) == (version, local.fingerprint, local.manifest)
        for n_docs in (1, 5, 40):  # 40: more than the top hits of one shard
            want, got = local.retrieve(questions, n_docs), remote.retrieve(questions, n_docs)
            assert (got.passage_ids, got.titles, got.texts) == (want.passage_ids, want.titles, want.texts)
            assert got.doc_vectors.dtype == np.float32 and np.array_equal(got.doc_vectors, want.doc_vectors)
            assert np.array_equal(got.index_scores, want.index_scores)
            doc_scores = np.einsum("bd,bnd->bn", questions, got.doc_vectors)  # what RagModel.score computes
            assert np.array_equal(doc_scores, np.einsum("bd,bnd->bn", questions, want.doc_vectors))
        with pytest.raises(RetrieverError, match="holds 300 passages; n_docs=301 needs at least that many"):
            remote.retrieve(questions, 301)
    assert held_after_release(client) == set()  # closed: the workers dropped the shards


def test_loads_under_one_share_name_hold_one_copy(client: Client, published) -> None:
    """What the ranks of one training job do: each its own client, the same share name."""
    store, version, questions = published
    want = IndexRetriever.load(store, version).retrieve(questions, 5)
    with Client(client.scheduler.address, set_as_default=False) as other:
        first = DaskRetriever.load(client, store, version, share="job-1")
        second = DaskRetriever.load(other, store, version, share="job-1")
        private = DaskRetriever.load(client, store, version)
        keys = sorted(shard_keys(client))
        assert len(keys) == 6 and len([k for k in keys if k.endswith("-job-1-vectors")]) == 3  # not 9
        first.close()  # another holder keeps the shared copy alive
        private.close()
        assert np.array_equal(second.retrieve(questions, 5).doc_vectors, want.doc_vectors)
        second.close()
    assert held_after_release(client) == set()


def test_vectors_are_checked_like_the_in_process_retriever(client: Client, published, tmp_path: Path) -> None:
    store, version, _ = published
    manifest = IndexManifest.model_validate(read_manifest(store, version))
    bare = Store(str(tmp_path / "bare"))  # a version published from bare vectors names no embedding files
    index = build_shard_index(np.eye(4, manifest.dim, dtype=np.float32), IndexConfig(factory="Flat"))
    table = pa.table({"passage_id": [f"p{i}" for i in range(4)]})
    bare_version = publish_version(bare, [ShardPayload(serialize_index(index), table)],
                                   {"dim": manifest.dim, "metric": "ip", "factory": "Flat"})
    with pytest.raises(RetrieverError, match=f"index {bare_version} records no embedding files"):
        DaskRetriever.load(client, bare, bare_version)

    ref = manifest.shards[1].embeddings
    data = store.read_bytes(ref.vectors)
    try:
        store.write_bytes(data[:-4] + b"\0\0\0\0", ref.vectors)  # one float changed: sha256 differs
        with pytest.raises(StoreError, match="corrupt"):
            DaskRetriever.load(client, store, version)
    finally:
        store.write_bytes(data, ref.vectors)
    assert held_after_release(client) == set()
