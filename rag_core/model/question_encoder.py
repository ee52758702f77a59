"""The trainable question tower of a RAG model, and the rule that ties it to an index.

``QuestionEncoder`` is an ``nn.Module`` that turns questions into vectors with
the pooling of :mod:`rag_core.index.encoders` (mean + L2 for sentence encoders, DPR's
``pooler_output`` for DPR), but with gradients: in eval mode its output equals
``Encoder.encode_questions`` for the same directory (a test checks it).

Compatibility with an index (the encoder fingerprint of :mod:`rag_core.index.encoders`):

- The tower remembers ``base_fingerprint``: the full fingerprint of the encoder
  it was initialised from (both towers' weights hashes, kind, dim, pooling,
  normalisation), computed by ``Encoder.load`` itself.
- A fresh tower attached to an index must be the index's own encoder:
  ``check_compatible`` on the full fingerprint, question weights included.
- Fine-tuning changes the question weights, never the passage vectors (the
  index and its stored embeddings stay frozen). So a trained tower is checked
  on the *passage side* only: kind, passage weights, dim, pooling and
  normalisation of its base must equal the index's (``PASSAGE_SIDE``). The
  hash of its current weights is recorded for provenance, never compared.
  Any index version built with the same passage encoder (another dump: the
  paper's knowledge update) passes; one built with another encoder fails with
  the directory, both encoders and the fix in the message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rag_core.index.encoders import (
    MUST_MATCH,
    Encoder,
    EncoderConfig,
    EncoderError,
    check_compatible,
    pool,
    warn_truncated,
)

# Fingerprint fields that decide the passage vectors: what a trained question tower must still match.
PASSAGE_SIDE = tuple(key for key in MUST_MATCH if key != "question_weights_sha256")


class QuestionEncoder(nn.Module):
    """Questions -> ``[b, dim]`` float32 vectors, differentiable in the tower's weights."""

    def __init__(self, model: nn.Module, tokenizer: Any, *, kind: str, pooling: str, normalize: bool,
                 max_length: int, base_fingerprint: Mapping[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.kind = kind  # "dpr" or "sentence"
        self.pooling = pooling  # "mean" or "cls" (DPR: its pooler_output)
        self.normalize = normalize
        self.max_length = max_length
        self.base_fingerprint = dict(base_fingerprint)  # the encoder this tower started from (the index's)

    @classmethod
    def from_encoder_config(cls, config: EncoderConfig) -> QuestionEncoder:
        """A fresh tower: the question side of ``Encoder.load(config)`` (in float32, for training).

        For a DPR pair both towers load once, so that the fingerprint is the one
        ``Encoder`` computes; the context tower is then dropped.
        """
        encoder = Encoder.load(config.model_copy(update={"dtype": "float32"}))
        tower = encoder.question or encoder.context
        return cls(tower.model, tower.tokenizer, kind=encoder.kind, pooling=encoder.pooling,
                   normalize=encoder.normalize, max_length=encoder.max_length,
                   base_fingerprint=encoder.fingerprint)

    @classmethod
    def from_pretrained(cls, path: Path, settings: Mapping[str, Any]) -> QuestionEncoder:
        """A tower saved by :meth:`save_pretrained`; ``settings`` is what :meth:`settings` returned then."""
        import transformers

        try:  # the saved class (a DPR question tower, or a DPR context tower that also encoded questions)
            archs = json.loads((path / "config.json").read_text()).get("architectures") or ["AutoModel"]
            model_cls = getattr(transformers, archs[0], transformers.AutoModel)
            model = model_cls.from_pretrained(str(path), dtype=torch.float32, use_safetensors=True)
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
        except Exception as exc:
            raise EncoderError(f"{path}: cannot load the saved question encoder ({type(exc).__name__}: "
                               f"{str(exc)[:160]}); re-save the RAG model with save_pretrained()") from exc
        return cls(model, tokenizer, kind=settings["kind"], pooling=settings["pooling"],
                   normalize=settings["normalize"], max_length=settings["max_length"],
                   base_fingerprint=settings["base_fingerprint"])

    def settings(self) -> dict[str, Any]:
        """What :meth:`from_pretrained` needs beside the weights (JSON-serialisable)."""
        return {"kind": self.kind, "pooling": self.pooling, "normalize": self.normalize,
                "max_length": self.max_length, "base_fingerprint": self.base_fingerprint}

    def save_pretrained(self, path: Path) -> None:
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))

    @property
    def dim(self) -> int:
        return int(self.base_fingerprint["dim"])

    def forward(self, questions: Sequence[str]) -> Tensor:
        """``[b, dim]`` float32 question vectors (pooled as ``rag_core.index.encoders.Encoder`` pools them)."""
        if isinstance(questions, str) or not all(isinstance(q, str) for q in questions):
            raise TypeError(f"questions must be a list of strings, got {type(questions).__name__}; "
                            "wrap a single question in a list")
        device = next(self.model.parameters()).device
        tokens = self.tokenizer(list(questions), truncation=True, max_length=self.max_length, padding=True,
                                return_tensors="pt")
        if not getattr(self, "_told_truncation", False):
            self._told_truncation = warn_truncated(self.tokenizer, questions, self.max_length)
        mask = tokens["attention_mask"].to(device)  # [b, t]
        output = self.model(input_ids=tokens["input_ids"].to(device), attention_mask=mask,
                            token_type_ids=torch.zeros_like(mask))
        return pool(output, mask, self.kind, self.pooling, self.normalize)

    # -- compatibility with an index --------------------------------------------------
    def check_fresh(self, index_fingerprint: Mapping[str, Any]) -> None:
        """An untrained tower must be the index's own encoder (both towers), as for plain search."""
        check_compatible(index_fingerprint, self.base_fingerprint)

    def check_passage_side(self, index_fingerprint: Mapping[str, Any], *, model_dir: str, index: str) -> None:
        """A (possibly fine-tuned) tower may search any index whose passages its base encoder embedded."""
        diffs = [f"{key} (index {_short(index_fingerprint.get(key, '<missing>'))}, "
                 f"model {_short(self.base_fingerprint.get(key, '<missing>'))})"
                 for key in PASSAGE_SIDE if index_fingerprint.get(key) != self.base_fingerprint.get(key)]
        if diffs:
            raise EncoderError(
                f"{model_dir}: this RAG model's question encoder was trained against passages embedded by "
                f"{self.base_fingerprint.get('name')!r}, but index {index} was built with "
                f"{index_fingerprint.get('name')!r}: {', '.join(diffs)} differ; load the model onto an index "
                "version built with its passage encoder (same weights, pooling and normalisation), "
                "or fine-tune a new RAG model on this index"
            )


def _short(value: Any) -> Any:
    return f"{value[:12]}..." if isinstance(value, str) and len(value) > 16 else value
