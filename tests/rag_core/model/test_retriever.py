"""IndexRetriever: the index finds passages, the stored vectors score them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rag_core.errors import StoreError
from rag_core.index.build import build_version
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.faiss_index import IndexConfig, build_shard_index, serialize_index
from rag_core.index.versions import publish_version
from rag_core.model.retriever import IndexRetriever, RetrieverError
from rag_core.storage import Store
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.passagefiles import publish_small_index, sample_passages

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def passages(wiki: Path) -> pa.Table:
    return sample_passages().slice(0, 400)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    path = save_tiny_bert(tmp_path_factory.mktemp("enc") / "tiny")
    return Encoder.load(EncoderConfig(path=str(path), dtype="float32"))


def test_doc_vectors_are_the_stored_embeddings_of_the_exact_top_n(tmp_path: Path, passages: pa.Table,
                                                                   encoder: Encoder) -> None:
    store = Store(str(tmp_path))
    version = publish_small_index(store, "d1", passages, encoder, shards=3)
    retriever = IndexRetriever.load(store)
    assert retriever.version == version and retriever.fingerprint == encoder.fingerprint

    every = encoder.encode_passages(passages["title"].to_pylist(), passages["text"].to_pylist())
    questions = encoder.encode_questions(["What is anarchism?", "Where is Alabama?"])
    got = retriever.retrieve(questions, 5)
    assert got.doc_vectors.shape == (2, 5, 32) and got.n_docs == 5
    order = np.argsort(-(questions @ every.T), axis=1, kind="stable")[:, :5]
    ids = passages["passage_id"].to_pylist()
    assert got.passage_ids == [[ids[i] for i in row] for row in order]
    np.testing.assert_allclose(got.doc_vectors, every[order], atol=1e-6)
    np.testing.assert_allclose(np.einsum("bd,bnd->bn", questions, got.doc_vectors), got.index_scores, atol=1e-5)
    titles = passages["title"].to_pylist()
    assert got.titles == [[titles[i] for i in row] for row in order]


def test_clear_errors(tmp_path: Path, passages: pa.Table, encoder: Encoder) -> None:
    store = Store(str(tmp_path))
    publish_small_index(store, "d1", passages.slice(0, 4), encoder, shards=2)
    retriever = IndexRetriever.load(store)
    with pytest.raises(RetrieverError, match="holds 4 passages; n_docs=5 needs at least that many"):
        retriever.retrieve(np.ones((1, 32), np.float32), 5)

    # Another shard count writes new embedding files: the first version's vectors stay as they were.
    first = retriever.version
    build_version(store, "d1", EmbedConfig(encoder=encoder.config, shards=1), IndexConfig(factory="Flat"),
                  encoder=encoder)
    again = IndexRetriever.load(store, first)
    assert [v.tolist() for v in again.vectors] == [v.tolist() for v in retriever.vectors]

    # A version published from bare vectors has no embedding files to score with.
    bare = publish_version(store, [(serialize_index(build_shard_index(again.vectors[0], IndexConfig(factory="Flat"))),
                                    again.index.passage_ids(0))], {"dim": 32, "metric": "ip", "factory": "Flat"})
    with pytest.raises(RetrieverError, match="records no embedding files"):
        IndexRetriever.load(store, bare)

    # An embedding file changed after publishing is refused by its sha256.
    vectors = next((tmp_path / "embeddings").rglob("rows-0000000000-0000000002.*.npy"))
    vectors.write_bytes(vectors.read_bytes()[:-4] + b"\0\0\0\1")
    with pytest.raises(StoreError, match=r"corrupt \(sha256 differs from its record\)"):
        IndexRetriever.load(store, first)
