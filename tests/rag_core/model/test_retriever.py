"""IndexRetriever: the index finds passages, the stored vectors score them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.model.retriever import IndexRetriever, RetrieverError
from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.passages import passages_from_pages
from tests.conftest import SAMPLE_BZ2
from tests.encoderfiles import save_tiny_bert
from tests.indexfiles import publish_small_index


@pytest.fixture(scope="module")
def passages(wiki: Path) -> pa.Table:
    table = passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))))[0]
    return table.slice(0, 400).select(["passage_id", "title", "text"])


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

    # The dump re-embedded with another shard count rewrites its embedding shards: the old version must say so.
    publish_small_index(store, "d1", passages.slice(0, 4), encoder, shards=1)
    first = sorted(p.name for p in (tmp_path / "indexes").iterdir() if p.name[0].isdigit())[0]
    with pytest.raises(RetrieverError, match="lists other passages"):
        IndexRetriever.load(store, first)
