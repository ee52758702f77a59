"""Tiny RAG models over the indexes of tests/rag_core/model/conftest.py, and the questions they are asked."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rag_core.model.generators import GeneratorConfig
from rag_core.model.rag_model import RagConfig, RagModel
from rag_core.model.retriever import IndexRetriever


TINY_GENERATOR = GeneratorConfig(d_model=32, layers=1, heads=2, ffn_dim=64)


QUESTIONS = ["What is anarchism?", "Where is Alabama?", "Who was Achilles?"]


ANSWERS = ["a political philosophy", "in the south of the united states", "a greek hero"]


def make_model(indexes: SimpleNamespace, version: str | None = None, **config) -> RagModel:
    config = {"question_encoder": indexes.encoder_config, "generator": TINY_GENERATOR, "n_docs": 3,
              "max_context_length": 64, **config}
    return RagModel.create(RagConfig(**config), IndexRetriever.load(indexes.store, version or indexes.v1))


def llama_model(indexes: SimpleNamespace, llama_dir: Path, **config) -> RagModel:  # noqa: F811
    return make_model(indexes, generator=GeneratorConfig(path=str(llama_dir)), **config)
