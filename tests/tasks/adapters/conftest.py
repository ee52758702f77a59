"""Fixtures of the MLflow adapter tests: a real small index and a saved RAG model bound to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.model.generators import GeneratorConfig
from rag_core.model.rag_model import RagConfig, RagModel
from rag_core.model.retriever import IndexRetriever
from rag_core.storage import Store
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.generatorfiles import save_tiny_llama
from tests.helpers.passagefiles import publish_small_index, sample_passages


@pytest.fixture(scope="module")
def bound_model(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, str, Path]:
    """A small real index (tiny BERT encoder, 200 real passages) and a saved RAG model over it (tiny Llama)."""
    root = tmp_path_factory.mktemp("registry")
    encoder_dir = save_tiny_bert(root / "encoder")
    encoder = Encoder.load(EncoderConfig(path=str(encoder_dir), dtype="float32"))
    store = Store(str(root / "store"))
    version = publish_small_index(store, "d1", sample_passages().slice(0, 200), encoder, shards=2)
    config = RagConfig(n_docs=2, question_encoder=encoder.config,
                       generator=GeneratorConfig(path=str(save_tiny_llama(root / "llama"))))
    model = RagModel.create(config, IndexRetriever.load(store, version))
    return store, version, model.save_pretrained(root / "rag")
