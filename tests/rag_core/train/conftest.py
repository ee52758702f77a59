"""The recipe tests' shared setup: a small real index, cloze files from its passages, tiny generators."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rag_core.model.generators import GeneratorConfig, default_generator
from rag_core.storage import Store
from rag_core.train.cloze import ClozeConfig, cloze_examples
from rag_core.train.examples import write_examples
from tests.helpers.encoderfiles import tiny_encoder
from tests.helpers.generatorfiles import save_tiny_llama
from tests.helpers.passagefiles import publish_small_index, sample_passages


@pytest.fixture(scope="module")
def tiny(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """A Flat index (tiny BERT) of 200 real passages, cloze train/dev files from them, a tiny BART and Llama."""
    root = tmp_path_factory.mktemp("recipe")
    store = Store(str(root / "store"))
    passages = sample_passages().slice(0, 200)
    version = publish_small_index(store, "d1", passages, tiny_encoder(root / "bert"), shards=2)
    task = cloze_examples(passages, ClozeConfig(seed=0, dev_fraction=0.2))
    write_examples(task.train, str(root / "train.jsonl"))
    write_examples(task.dev, str(root / "dev.jsonl"))
    bart, tokenizer = default_generator(GeneratorConfig(d_model=32, layers=1, heads=2, ffn_dim=64), 512)
    bart.save_pretrained(root / "bart")
    tokenizer.save_pretrained(root / "bart")
    return SimpleNamespace(root=root, store=store, version=version, train=str(root / "train.jsonl"),
                           dev=str(root / "dev.jsonl"), bart=str(root / "bart"), n_train=len(task.train),
                           llama=str(save_tiny_llama(root / "llama")))
