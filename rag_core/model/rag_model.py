"""The RAG model (Lewis et al., 2020): a trainable question encoder, a frozen index, a seq2seq generator.

Three steps, each its own method, so that a training recipe or a notebook can
look at (or replace) any of them:

1. ``retrieve(questions)`` -> :class:`RetrievalBatch`: question vectors (with
   gradients), the top ``n_docs`` passages of the index, ``doc_scores`` =
   <question vector, stored passage vector> computed in torch (so gradients
   reach the question encoder while the documents stay fixed), and the
   generator inputs, one row per (question, passage).
2. ``forward(batch, answers)`` -> per-example negative log marginal likelihood,
   RAG-Sequence or RAG-Token (``config.kind``) by :mod:`rag_core.model.marginalize`.
3. ``generate(questions)`` -> answers, by :mod:`rag_core.model.decoding`.

Generator input, as in transformers' ``RagRetriever.postprocess_docs`` (the
paper's code): ``prefix + title + " / " + text + " // " + question``, with one
pair of double quotes stripped around the title, every double space replaced
by one, tokenized by the generator's tokenizer and truncated to
``max_context_length`` tokens (300 in the paper; the question is at the end,
so a very long passage truncates it, as there). We pad to the longest row
rather than to ``max_context_length``: the same tokens and mask, less compute.

Targets follow the transformers seq2seq convention: ``labels`` are the
generator tokenizer's encoding of the answer (``tokenizer(text_target=...)``:
BART ``<s> y </s>``, T5 ``y </s>``, BERT ``[CLS] y [SEP]``), and the decoder
reads them shifted right behind ``decoder_start_token_id``. transformers' RAG
classes take ``labels = [decoder_start, target...]`` instead; the losses agree
(a test checks it against RagSequenceForGeneration and RagTokenForGeneration).

Default models (no model hub here):

- question encoder: the packaged all-MiniLM-L6-v2 (``EncoderConfig()``), i.e.
  the encoder the default index is built with; a DPR pair when
  ``question_encoder.path`` / ``question_path`` name one.
- generator: a small BART built from a config (2 + 2 layers, d_model 128,
  ~5M parameters, 4M of them the tied 30522 x 128 embedding; seeded) over the
  MiniLM (BERT uncased) vocabulary, so that it shares a tokenizer with the
  default encoder and needs no download. Why: a warm-started
  ``EncoderDecoderModel`` from MiniLM weights (~2 x 22M parameters, 6 + 6
  layers) is far larger, so slower per step on a CPU; this one learns a small
  task in a few hundred CPU steps (a test shows it; ``AdamW(fused=True)``
  avoids a per-parameter loop over the 30522-row embedding). It knows no English: it is for tests, demos and pipelines, not
  for answers worth reading; set ``GeneratorConfig.path`` for that.

The paper's setup, from local directories (``save_pretrained`` outputs):
``RagConfig(question_encoder=EncoderConfig(path="/models/dpr-ctx_encoder-multiset-base",
question_path="/models/dpr-question_encoder-multiset-base"),
generator=GeneratorConfig(path="/models/bart-large"))``, over an index built
with the same ``EncoderConfig``. Any ``AutoModelForSeq2SeqLM`` directory with
its tokenizer works as the generator (BART, T5, an ``EncoderDecoderModel``
with ``decoder_start_token_id`` and ``pad_token_id`` set).

Saved layout (``save_pretrained``): ``question_encoder/`` and ``generator/``
(transformers ``save_pretrained`` with tokenizers) and ``rag.json`` (kind,
n_docs, the index version and passage fingerprint the model was trained
against, the config). ``from_pretrained(path, retriever)`` may load onto any
index version whose passages the same encoder embedded (the paper's knowledge
update); see :mod:`rag_core.model.question_encoder` for the compatibility rule.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from rag_core.errors import WikiragError
from rag_core.index.encoders import EncoderConfig, packaged_model_path, weights_sha256
from rag_core.model.marginalize import rag_sequence_nll, rag_token_nll
from rag_core.model.question_encoder import QuestionEncoder
from rag_core.model.retriever import IndexRetriever

log = logging.getLogger(__name__)

RAG_JSON = "rag.json"
FORMAT = 1
_NLL = {"sequence": rag_sequence_nll, "token": rag_token_nll}


class RagModelError(WikiragError):
    """A RAG model directory or generator that cannot be used as asked."""


class GeneratorConfig(BaseModel):
    """Which seq2seq generator to use; the size fields shape only the default one."""

    model_config = ConfigDict(frozen=True)

    path: str | None = Field(None, description="local AutoModelForSeq2SeqLM dir with tokenizer; None = small BART")
    d_model: int = Field(128, ge=8, description="default generator: hidden width")
    layers: int = Field(2, ge=1, description="default generator: encoder layers, and as many decoder layers")
    heads: int = Field(4, ge=1, description="default generator: attention heads (must divide d_model)")
    ffn_dim: int = Field(512, ge=8, description="default generator: feed-forward width")
    seed: int = Field(0, description="default generator: initialisation seed (the global RNG is untouched)")


class RagConfig(BaseModel):
    """A RAG model: which encoder and generator, how many documents, how inputs are built."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["sequence", "token"] = Field("sequence", description="RAG-Sequence or RAG-Token marginalisation")
    n_docs: int = Field(5, ge=1, description="documents retrieved per question (the paper: 5 or 10)")
    max_context_length: int = Field(300, ge=8, description="generator input tokens per (passage, question)")
    max_answer_length: int = Field(64, ge=2, description="target tokens per answer (longer ones are truncated)")
    title_sep: str = Field(" / ", description="between a passage's title and its text")
    doc_sep: str = Field(" // ", description="between a passage and the question")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="epsilon of the paper's label smoothing")
    question_encoder: EncoderConfig = Field(default_factory=EncoderConfig, description="initial question encoder")
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig, description="seq2seq generator")
    device: str = Field("cpu", description="torch device for both towers")


@dataclass
class RetrievalBatch:
    """The retrieval step's output: what the generator and the loss need, plus what was retrieved."""

    questions: list[str]
    question_vectors: Tensor  # float32 [b, dim], differentiable in the question encoder
    doc_scores: Tensor  # float32 [b, n_docs] = <question, passage>, differentiable in the question encoder only
    passage_ids: list[list[str]]  # [b][n_docs], best first
    titles: list[list[str]]  # [b][n_docs]
    texts: list[list[str]]  # [b][n_docs]
    context_input_ids: Tensor  # long [b * n_docs, L]; row i * n_docs + z = passage z of question i
    context_attention_mask: Tensor  # long [b * n_docs, L]
    index_version: str | None

    @property
    def n_docs(self) -> int:
        return self.doc_scores.shape[1]


def context_strings(titles: Sequence[Sequence[str]], texts: Sequence[Sequence[str]], questions: Sequence[str],
                    *, title_sep: str = " / ", doc_sep: str = " // ", prefix: str | None = None) -> list[str]:
    """Generator inputs ``[b * n_docs]``, as transformers' ``RagRetriever.postprocess_docs`` builds them."""
    prefix = prefix or ""
    out = []
    for doc_titles, doc_texts, question in zip(titles, texts, questions, strict=True):
        for title, text in zip(doc_titles, doc_texts, strict=True):
            title = title.removeprefix('"').removesuffix('"')
            out.append((prefix + title + title_sep + text + doc_sep + question).replace("  ", " "))
    return out


def default_generator(config: GeneratorConfig, max_positions: int) -> tuple[nn.Module, Any]:
    """A small BART from a config over the packaged MiniLM (BERT uncased) vocabulary, and that tokenizer.

    Special tokens mirror BART's (``decoder_start = eos``, targets ``bos y eos``):
    [PAD] pads, [CLS] is bos, [SEP] is eos and the decoder start.
    """
    from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(str(packaged_model_path()))
    bart = BartConfig(
        vocab_size=len(tokenizer), d_model=config.d_model, encoder_layers=config.layers,
        decoder_layers=config.layers, encoder_attention_heads=config.heads, decoder_attention_heads=config.heads,
        encoder_ffn_dim=config.ffn_dim, decoder_ffn_dim=config.ffn_dim, max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id, decoder_start_token_id=tokenizer.sep_token_id,
        forced_eos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = BartForConditionalGeneration(bart)
    return model, tokenizer


def load_generator(path: Path) -> tuple[nn.Module, Any]:
    """A seq2seq generator and its tokenizer from a local directory."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise RagModelError(f"{path}: not a transformers model directory (no config.json); give a local "
                            "directory saved with save_pretrained() (e.g. facebook/bart-large downloaded elsewhere)")
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(str(path), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:
        raise RagModelError(f"{path}: cannot load a seq2seq generator and its tokenizer ({type(exc).__name__}: "
                            f"{str(exc)[:160]}); save an AutoModelForSeq2SeqLM and its tokenizer there") from exc
    return model, tokenizer


class RagModel(nn.Module):
    """Question encoder (trained) + index retriever (frozen) + generator (trained).

    Build a fresh one with :meth:`create`, a saved one with :meth:`from_pretrained`.
    ``trained_index_version`` is the version the model was trained against;
    ``index_version`` the one it retrieves from now (they differ after a
    knowledge update).
    """

    def __init__(self, config: RagConfig, question_encoder: QuestionEncoder, generator: nn.Module,
                 generator_tokenizer: Any, retriever: IndexRetriever, *, trained_index_version: str | None) -> None:
        super().__init__()
        self.config = config
        self.question_encoder = question_encoder
        self.generator = generator
        self.generator_tokenizer = generator_tokenizer
        self.retriever = retriever
        self.trained_index_version = trained_index_version
        self.decoder_start_token_id = generator.config.decoder_start_token_id
        self.pad_token_id = generator_tokenizer.pad_token_id
        if self.decoder_start_token_id is None or self.pad_token_id is None:
            raise RagModelError(f"generator {type(generator).__name__}: needs decoder_start_token_id in its config "
                                f"(has {self.decoder_start_token_id}) and a pad token in its tokenizer (has "
                                f"{self.pad_token_id}); set them before saving the generator")
        self.to(config.device).eval()  # as transformers loads models; a training recipe calls .train()

    @classmethod
    def create(cls, config: RagConfig, retriever: IndexRetriever) -> RagModel:
        """A fresh model: the index's own question encoder (checked) and the configured generator."""
        question_encoder = QuestionEncoder.from_encoder_config(config.question_encoder)
        question_encoder.check_fresh(retriever.fingerprint)
        if config.generator.path is None:
            generator, tokenizer = default_generator(config.generator, max(512, config.max_context_length))
        else:
            generator, tokenizer = load_generator(Path(config.generator.path).expanduser())
        return cls(config, question_encoder, generator, tokenizer, retriever, trained_index_version=retriever.version)

    @property
    def index_version(self) -> str | None:
        return self.retriever.version

    def use_index(self, retriever: IndexRetriever, *, where: str = "RagModel") -> None:
        """Retrieve from another index version from now on (no retraining); its passage encoder must match."""
        self.question_encoder.check_passage_side(retriever.fingerprint, model_dir=where, index=str(retriever.version))
        self.retriever = retriever
        self._log_binding(where)

    def _log_binding(self, where: str) -> None:
        if self.index_version != self.trained_index_version:
            log.info("%s: trained against index %s, now retrieving from index %s (knowledge update)",
                     where, self.trained_index_version, self.index_version)

    # -- 1. retrieval ------------------------------------------------------------------
    def retrieve(self, questions: Sequence[str], n_docs: int | None = None) -> RetrievalBatch:
        """Encode, search the index, score the stored passage vectors, build the generator inputs."""
        if isinstance(questions, str):
            raise TypeError("questions must be a list of strings; wrap a single question in a list")
        n_docs = self.config.n_docs if n_docs is None else n_docs
        questions = list(questions)
        q = self.question_encoder(questions)  # [b, dim]
        found = self.retriever.retrieve(q.detach().cpu().numpy(), n_docs)
        doc_vectors = torch.from_numpy(found.doc_vectors).to(q.device)  # [b, n_docs, dim], frozen
        if doc_vectors.shape[2] != q.shape[1]:
            raise RagModelError(f"index {self.index_version} stores {doc_vectors.shape[2]}-d passage vectors but "
                                f"the question encoder gives {q.shape[1]}-d ones; use the index's encoder")
        doc_scores = torch.bmm(q.unsqueeze(1), doc_vectors.transpose(1, 2)).squeeze(1)  # [b, 1, n] -> [b, n_docs]
        contexts = context_strings(found.titles, found.texts, questions, title_sep=self.config.title_sep,
                                   doc_sep=self.config.doc_sep, prefix=getattr(self.generator.config, "prefix", None))
        tokens = self.generator_tokenizer(contexts, max_length=self.config.max_context_length, truncation=True,
                                          padding="longest", return_tensors="pt")
        return RetrievalBatch(questions, q, doc_scores, found.passage_ids, found.titles, found.texts,
                              tokens["input_ids"].to(q.device), tokens["attention_mask"].to(q.device),
                              self.index_version)

    # -- 2. loss -------------------------------------------------------------------------
    def answer_labels(self, answers: Sequence[str]) -> Tensor:
        """long ``[b, T]`` targets: the generator tokenizer's encoding of each answer, pad-filled."""
        if isinstance(answers, str):
            raise TypeError("answers must be a list of strings; wrap a single answer in a list")
        tokens = self.generator_tokenizer(text_target=list(answers), max_length=self.config.max_answer_length,
                                          truncation=True, padding="longest", return_tensors="pt")
        return tokens["input_ids"].to(self.config.device)

    def forward(self, batch: RetrievalBatch, answers: Sequence[str] | Tensor) -> Tensor:
        """float ``[b]`` negative log marginal likelihood of each answer (``config.kind`` marginalisation)."""
        labels = answers if isinstance(answers, Tensor) else self.answer_labels(answers)  # [b, T]
        if labels.shape[0] != len(batch.questions):
            raise ValueError(f"{labels.shape[0]} answers for {len(batch.questions)} questions; give one per question")
        start = labels.new_full((labels.shape[0], 1), self.decoder_start_token_id)  # [b, 1]
        decoder_input_ids = torch.cat([start, labels[:, :-1]], dim=1)  # [b, T]: shifted right
        decoder_input_ids = decoder_input_ids.repeat_interleave(batch.n_docs, dim=0)  # [b * n_docs, T]
        seq_logits = self.generator(input_ids=batch.context_input_ids, attention_mask=batch.context_attention_mask,
                                    decoder_input_ids=decoder_input_ids, use_cache=False).logits  # [b*n, T, V]
        return _NLL[self.config.kind](seq_logits, batch.doc_scores, labels, batch.n_docs, self.pad_token_id,
                                      self.config.label_smoothing)  # [b]

    # -- 3. generation -------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, questions: Sequence[str], *, n_docs: int | None = None, num_beams: int = 1,
                 max_length: int = 32, mode: Literal["thorough", "fast"] = "thorough") -> list[str]:
        """One answer per question, by :mod:`rag_core.model.decoding` (in eval mode; the mode is restored after).

        RAG-Token: greedy (``num_beams=1``) or beam search over the marginal; RAG-Sequence:
        a beam search per document, candidates ranked by p(y|x), ``mode`` "thorough" or "fast".
        """
        from rag_core.model.decoding import rag_sequence_generate, rag_token_generate

        was_training = self.training
        self.eval()
        try:
            batch = self.retrieve(questions, n_docs)
            inputs = (self.generator, batch.context_input_ids, batch.context_attention_mask, batch.doc_scores,
                      batch.n_docs)
            if self.config.kind == "token":
                ids = rag_token_generate(*inputs, num_beams=num_beams, max_length=max_length)  # [b, T]
            else:
                ids = rag_sequence_generate(*inputs, mode=mode, num_beams=num_beams,
                                            max_length=max_length).sequences  # [b, T]
        finally:
            self.train(was_training)
        return self.generator_tokenizer.batch_decode(ids, skip_special_tokens=True)

    # -- saving and loading --------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> Path:
        """``question_encoder/`` + ``generator/`` (transformers layout) + ``rag.json``; returns the directory."""
        path = Path(path).expanduser()
        self.question_encoder.save_pretrained(path / "question_encoder")
        self.generator.save_pretrained(str(path / "generator"))
        self.generator_tokenizer.save_pretrained(str(path / "generator"))
        record = {
            "format": FORMAT,
            "kind": self.config.kind,
            "n_docs": self.config.n_docs,
            "index_version": self.index_version,  # what it was trained against, when saved after training
            "fingerprint_id": self.retriever.manifest.get("fingerprint_id"),
            "question_encoder": self.question_encoder.settings(),
            "question_weights_sha256": weights_sha256(path / "question_encoder"),  # the trained tower, for provenance
            "config": self.config.model_dump(mode="json"),
        }
        (path / RAG_JSON).write_text(json.dumps(record, indent=2, sort_keys=True))
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, retriever: IndexRetriever,
                        overrides: Mapping[str, Any] | None = None) -> RagModel:
        """A saved model, retrieving from ``retriever``'s index version (any with the same passage encoder).

        ``overrides`` replaces config fields (e.g. ``{"n_docs": 10}`` or ``{"device": "cuda"}``).
        """
        path = Path(path).expanduser()
        record = _read_record(path)
        config = RagConfig.model_validate({**record["config"], **(overrides or {})})
        question_encoder = QuestionEncoder.from_pretrained(path / "question_encoder", record["question_encoder"])
        question_encoder.check_passage_side(retriever.fingerprint, model_dir=str(path), index=str(retriever.version))
        generator, tokenizer = load_generator(path / "generator")
        model = cls(config, question_encoder, generator, tokenizer, retriever,
                    trained_index_version=record["index_version"])
        model._log_binding(str(path))
        return model


def _read_record(path: Path) -> dict[str, Any]:
    file = path / RAG_JSON
    if not file.is_file():
        raise RagModelError(f"{path}: no {RAG_JSON}; not a RAG model saved with RagModel.save_pretrained()")
    try:
        record = json.loads(file.read_text())
    except ValueError as exc:
        raise RagModelError(f"{file}: not valid JSON ({exc}); re-save the model") from exc
    if record.get("format") != FORMAT:
        raise RagModelError(f"{file}: format {record.get('format')!r}, this version reads {FORMAT}; "
                            "re-save the model with this version of wikirag")
    return record
