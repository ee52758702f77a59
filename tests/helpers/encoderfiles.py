"""Tiny real transformers encoders saved to disk, for runs where the pretrained MiniLM would be slow."""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def save_tiny_bert(directory: Path, *, seed: int = 0, broken: bool = False) -> Path:
    """A 2-layer, 32-wide random BERT with MiniLM's vocabulary; ``broken`` puts NaN in its weights."""
    import torch
    from transformers import BertConfig, BertModel

    from rag_core.index.encoders import packaged_model_path

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    model = BertModel(config).eval()
    if broken:  # what a bad conversion or a diverged checkpoint leaves behind
        with torch.no_grad():
            model.encoder.layer[1].output.dense.weight[0, 0] = float("nan")
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:  # the MiniLM (BERT uncased) vocabulary: no hub needed
        shutil.copy(packaged_model_path() / name, directory / name)
    return directory


def tiny_encoder(directory: Path, *, seed: int = 0):
    """:func:`save_tiny_bert` loaded as a float32 ``Encoder`` (exact on any CPU)."""
    from rag_core.index.encoders import Encoder, EncoderConfig

    return Encoder.load(EncoderConfig(path=str(save_tiny_bert(directory, seed=seed)), dtype="float32"))


class CountingEncoder:
    """A real encoder, counting the passages it is asked to encode (what "never encoded twice" is checked by)."""

    def __init__(self, inner) -> None:
        self.inner, self.config = inner, inner.config
        self.fingerprint, self.fingerprint_id, self.dim = inner.fingerprint, inner.fingerprint_id, inner.dim
        self.encoded = 0

    def encode_passages(self, titles, texts, progress=None):
        self.encoded += len(texts)
        return self.inner.encode_passages(titles, texts, progress)
