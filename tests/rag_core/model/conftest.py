"""Fixtures of the RAG model tests: one torch thread, real passages and the tiny indexes and generators over them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
import torch

from rag_core.index.build import build_version
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.passages import passages_from_pages
from tests.conftest import SAMPLE_BZ2
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.generatorfiles import save_tiny_llama
from tests.helpers.passagefiles import publish_passages, sample_passages


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """These steps are small (a few hundred tokens): a second intra-op thread gains little, and on a
    shared machine its barriers cost up to 10x (200 training steps: 455 s on 2 threads, 42 s on 1, load 8)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def passages(wiki: Path) -> pa.Table:
    table = passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))))[0]
    return table.slice(0, 400).select(["passage_id", "title", "text"])


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory, passages: pa.Table) -> SimpleNamespace:
    """v1 and v2: other passages, same tiny encoder; other: v1's passages under another encoder."""
    root = tmp_path_factory.mktemp("rag")
    encoder_config = EncoderConfig(path=str(save_tiny_bert(root / "tiny")), dtype="float32")
    other_config = EncoderConfig(path=str(save_tiny_bert(root / "tiny-other", seed=1)), dtype="float32")
    store = Store(str(root / "store"))
    encoder = Encoder.load(encoder_config)
    publish_passages(store, "d1", sample_passages().slice(0, 200))
    publish_passages(store, "d2", sample_passages().slice(200, 200))
    flat = IndexConfig(factory="Flat")
    v1 = build_version(store, "d1", EmbedConfig(encoder=encoder_config, shards=2), flat, encoder=encoder)
    v2 = build_version(store, "d2", EmbedConfig(encoder=encoder_config, shards=2), flat, encoder=encoder)
    other = build_version(store, "d1", EmbedConfig(encoder=other_config, shards=1), flat)
    return SimpleNamespace(store=store, encoder=encoder, encoder_config=encoder_config, v1=v1, v2=v2,
                           other=other, v1_ids=set(passages.slice(0, 200)["passage_id"].to_pylist()),
                           v2_ids=set(passages.slice(200, 200)["passage_id"].to_pylist()))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("llama") / "llama")
