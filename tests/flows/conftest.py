"""Fixtures shared by the CLI guarantee tests (tampering, hostile arguments, load)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest


class PublishedIndex(NamedTuple):
    store: Path  # treat as read-only: a test that damages it works on a copy
    version: str
    encoder: Path
    generator: Path


@pytest.fixture(scope="session")
def published_index(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> PublishedIndex:
    """One published 2-shard Flat version of 30 real passages (a tiny real BERT), and a tiny real Llama to ask with."""
    import torch

    from rag_core.index.encoders import Encoder, EncoderConfig
    from rag_core.storage import Store
    from tests.helpers.encoderfiles import save_tiny_bert
    from tests.helpers.generatorfiles import save_tiny_llama
    from tests.helpers.passagefiles import publish_small_index, sample_passages

    root = tmp_path_factory.mktemp("published")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tiny = save_tiny_bert(root / "tiny")
        encoder = Encoder.load(EncoderConfig(path=str(tiny), dtype="float32"))
        version = publish_small_index(Store(str(root / "store")), "d1", sample_passages().slice(0, 30), encoder, 2)
        return PublishedIndex(root / "store", version, tiny, save_tiny_llama(root / "llama"))
    finally:
        torch.set_num_threads(threads)
