"""The RAG model (Lewis et al., 2020): a trainable question encoder, a frozen index, a generator.

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

For training under DistributedDataParallel the first step is cut in two, so
that everything that trains runs inside one ``forward()`` (DDP reduces the
gradients of the parameters used in the wrapped forward; a question encoder
run outside it would never be synchronised):

- ``search(questions)`` -> :class:`SearchResult` (no gradients; the question
  tower in eval mode, so without dropout): the passages, their stored float32
  vectors and the generator inputs. FAISS is not differentiable; this is
  plain data for the next call.
- ``forward(search_result, answers)``: encodes the questions again *with*
  gradients, ``doc_scores`` = q · stored vectors, the generator and the loss,
  all in one call (:meth:`score` is its first half, for inspection).

The generator is seq2seq (BART, T5, EncoderDecoder) or decoder-only (Llama
family): :mod:`rag_core.model.generators` builds each family's inputs, targets
and answer logits (a decoder-only model reads a chat prompt per passage and is
scored on the answer tokens only), and decoding dispatches to
:mod:`rag_core.model.decoding` or :mod:`rag_core.model.causal_decoding`. The
rest of this docstring describes the seq2seq family.

Seq2seq generator input, as in transformers' ``RagRetriever.postprocess_docs`` (the
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

from rag_core.index.encoders import EncoderConfig, weights_sha256
from rag_core.model.extract import grounded_choice, is_grounded, passage_spans, short_answer
from rag_core.model.generators import (
    GeneratorConfig,
    RagModelError,
    context_strings,
    default_generator,
    family_of,
    load_generator,
)
from rag_core.model.marginalize import rag_sequence_nll, rag_token_nll
from rag_core.model.question_encoder import QuestionEncoder
from rag_core.model.retriever import IndexRetriever
from rag_core.perf.device import choose_device

log = logging.getLogger(__name__)

RAG_JSON = "rag.json"
FORMAT = 1
_NLL = {"sequence": rag_sequence_nll, "token": rag_token_nll}
__all__ = ["GeneratorConfig", "RagConfig", "RagModel", "RagModelError", "RetrievalBatch", "SearchResult",
           "context_strings", "default_generator", "load_generator"]


class RagConfig(BaseModel):
    """A RAG model: which encoder and generator, how many documents, how inputs are built."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["sequence", "token"] = Field("sequence", description="RAG-Sequence or RAG-Token marginalisation")
    n_docs: int = Field(5, ge=1, description="documents retrieved per question (the paper: 5 or 10)")
    max_context_length: int = Field(300, ge=8, description="seq2seq generator input tokens per "
                                                              "(passage, question); a decoder-only prompt holds all")
    max_answer_length: int = Field(64, ge=2, description="target tokens per answer (longer ones are truncated)")
    title_sep: str = Field(" / ", description="between a passage's title and its text")
    doc_sep: str = Field(" // ", description="between a passage and the question")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="epsilon of the paper's label smoothing")
    short_answers: bool = Field(True, description="generate() returns each reply's answer span, RAG-Sequence the "
                                                  "best one found in its passages (rag_core.model.extract); "
                                                  "False: the best reply as generated (Jeopardy, MS-MARCO)")
    grounded: bool = Field(True, description="span choice, with short_answers and a decoder-only generator: a "
                                             "question none of whose replies is in its passages answers with the "
                                             "likeliest under p(y|x) of its reply and its passages' spans "
                                             "(rag_core.model.extract.passage_spans). Off: the best reply as "
                                             "generated")
    question_encoder: EncoderConfig = Field(default_factory=EncoderConfig, description="initial question encoder")
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig, description="seq2seq generator")
    device: str = Field("auto", description="torch device for both towers; auto = rag_core.perf.device.choose_device "
                                          "(cuda:LOCAL_RANK where CUDA is present, else cpu). Resolved where the model "
                                          "runs: a saved model records auto")


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


@dataclass
class SearchResult:
    """The search step's output (no gradients): what was found, its stored vectors and the generator inputs.

    Everything a training forward needs besides the answers, so that the search
    can run outside the DDP-wrapped forward (or on another machine: it is plain
    tensors and strings).
    """

    questions: list[str]
    passage_ids: list[list[str]]  # [b][n_docs], best first
    titles: list[list[str]]  # [b][n_docs]
    texts: list[list[str]]  # [b][n_docs]
    doc_vectors: Tensor  # float32 [b, n_docs, dim]: the stored passage embeddings (constants)
    index_scores: Tensor  # float32 [b, n_docs]: what the index returned (for reports; not trained on)
    context_input_ids: Tensor  # long [b * n_docs, L]; row i * n_docs + z = passage z of question i
    context_attention_mask: Tensor  # long [b * n_docs, L]
    index_version: str | None

    @property
    def n_docs(self) -> int:
        return self.doc_vectors.shape[1]

    def to(self, device: str | torch.device) -> SearchResult:
        """The same result with its tensors on ``device``."""
        return SearchResult(self.questions, self.passage_ids, self.titles, self.texts, self.doc_vectors.to(device),
                            self.index_scores.to(device), self.context_input_ids.to(device),
                            self.context_attention_mask.to(device), self.index_version)


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
        self.family = family_of(generator, generator_tokenizer, config)  # seq2seq or decoder-only inputs and targets
        self.retriever = retriever
        self.trained_index_version = trained_index_version
        self.pad_token_id = self.family.label_pad_id  # what marks padding in answer_labels()
        self.device = choose_device(config.device)
        self.to(self.device).eval()  # as transformers loads models; a training recipe calls .train()

    @classmethod
    def create(cls, config: RagConfig, retriever: IndexRetriever) -> RagModel:
        """A fresh model: the index's own question encoder (checked) and the configured generator."""
        question_encoder = QuestionEncoder.from_encoder_config(config.question_encoder)
        question_encoder.check_fresh(retriever.fingerprint)
        if config.generator.path is None:
            generator, tokenizer = default_generator(config.generator, max(512, config.max_context_length))
        else:
            generator, tokenizer = load_generator(Path(config.generator.path).expanduser(), config.generator.dtype,
                                                  choose_device(config.device))
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
        questions = _question_list(questions)
        q = self.question_encoder(questions)  # [b, dim]
        return self.score(self._find(questions, q.detach(), n_docs), q)

    @torch.no_grad()
    def search(self, questions: Sequence[str], n_docs: int | None = None) -> SearchResult:
        """The top ``n_docs`` passages, their stored vectors and the generator inputs; nothing differentiable.

        The question tower runs in eval mode (no dropout) and its mode is restored after; use
        :meth:`forward` (or :meth:`score`) on the result to get ``doc_scores`` with gradients.
        """
        questions = _question_list(questions)
        was_training = self.question_encoder.training
        self.question_encoder.eval()
        try:
            q = self.question_encoder(questions)  # [b, dim]
        finally:
            self.question_encoder.train(was_training)
        return self._find(questions, q, n_docs)

    def _find(self, questions: list[str], q: Tensor, n_docs: int | None) -> SearchResult:
        n_docs = self.config.n_docs if n_docs is None else n_docs
        found = self.retriever.retrieve(q.cpu().numpy(), n_docs)
        doc_vectors = torch.from_numpy(found.doc_vectors).to(q.device)  # [b, n_docs, dim], frozen
        if doc_vectors.shape[2] != q.shape[1]:
            raise RagModelError(f"index {self.index_version} stores {doc_vectors.shape[2]}-d passage vectors but "
                                f"the question encoder gives {q.shape[1]}-d ones; use the index's encoder")
        input_ids, mask = self.family.inputs(found.titles, found.texts, questions)  # [b * n_docs, L] each
        return SearchResult(questions, found.passage_ids, found.titles, found.texts, doc_vectors,
                            torch.from_numpy(found.index_scores).to(q.device), input_ids.to(q.device),
                            mask.to(q.device), self.index_version)

    def score(self, found: SearchResult, question_vectors: Tensor | None = None) -> RetrievalBatch:
        """``doc_scores`` = <q, stored vector> with gradients in the question tower (q computed here when None)."""
        q = self.question_encoder(found.questions) if question_vectors is None else question_vectors  # [b, dim]
        doc_vectors = found.doc_vectors.to(device=q.device, dtype=q.dtype)  # [b, n_docs, dim]
        doc_scores = torch.bmm(q.unsqueeze(1), doc_vectors.transpose(1, 2)).squeeze(1)  # [b, 1, n] -> [b, n_docs]
        return RetrievalBatch(found.questions, q, doc_scores, found.passage_ids, found.titles, found.texts,
                              found.context_input_ids, found.context_attention_mask, found.index_version)

    def closed_book(self, questions: Sequence[str]) -> RetrievalBatch:
        """The generator alone (the paper's baseline): one "document" per question, the question without passage."""
        questions = list(questions)
        input_ids, mask = self.family.inputs(None, None, questions)  # [b, L]
        device = self.device
        empty = [[] for _ in questions]
        return RetrievalBatch(questions, torch.zeros(len(questions), 0, device=device),
                              torch.zeros(len(questions), 1, device=device), empty, empty, empty,
                              input_ids.to(device), mask.to(device), None)

    # -- 2. loss -------------------------------------------------------------------------
    def answer_labels(self, answers: Sequence[str]) -> Tensor:
        """long ``[b, T]`` targets: the answers' tokens (and eos), filled with ``pad_token_id``."""
        if isinstance(answers, str):
            raise TypeError("answers must be a list of strings; wrap a single answer in a list")
        return self.family.labels(answers).to(self.device)

    def forward(self, batch: RetrievalBatch | SearchResult, answers: Sequence[str] | Tensor) -> Tensor:
        """float ``[b]`` negative log marginal likelihood of each answer (``config.kind`` marginalisation).

        Given a :class:`SearchResult`, the question vectors and ``doc_scores`` are computed here, so that
        this one call uses every trainable parameter (what DistributedDataParallel wraps).
        """
        if isinstance(batch, SearchResult):
            batch = self.score(batch)
        labels = answers if isinstance(answers, Tensor) else self.answer_labels(answers)  # [b, T]
        if labels.shape[0] != len(batch.questions):
            raise ValueError(f"{labels.shape[0]} answers for {len(batch.questions)} questions; give one per question")
        seq_logits = self.family.answer_logits(self.generator, batch.context_input_ids, batch.context_attention_mask,
                                               labels, batch.n_docs)  # [b * n_docs, T, V]
        return _NLL[self.config.kind](seq_logits.float(), batch.doc_scores, labels, batch.n_docs, self.pad_token_id,
                                      self.config.label_smoothing)  # [b]

    # -- 3. generation -------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, questions: Sequence[str] | RetrievalBatch | SearchResult, *, n_docs: int | None = None, num_beams: int = 1,
                 max_length: int = 32, max_new_tokens: int | None = None,
                 mode: Literal["thorough", "fast"] = "thorough") -> list[str]:
        """One answer per question, by :mod:`rag_core.model.decoding` (in eval mode; the mode is restored after).

        ``questions`` may be a :class:`RetrievalBatch` already made (by :meth:`retrieve` or
        :meth:`closed_book`), or a :class:`SearchResult` (by :meth:`search`). RAG-Token: greedy (``num_beams=1``) or beam search over the marginal;
        RAG-Sequence: a beam search per document, candidates ranked by p(y|x), ``mode`` "thorough" or
        "fast". With ``config.short_answers`` each reply is cut to its answer span
        (:func:`rag_core.model.extract.short_answer`: "The capital of Algeria is Algiers." -> "Algiers"),
        and RAG-Sequence answers with its best candidate whose span is in the question's passages
        (:func:`rag_core.model.extract.grounded_choice`). With ``config.grounded`` and a decoder-only
        generator, a question whose replies are in none of its passages answers with whichever of its reply and
        its passages' spans (:func:`rag_core.model.extract.passage_spans`) has the highest p(y|x) under
        ``config.kind`` (:func:`rag_core.model.causal_decoding.causal_span_scores`).
        ``max_new_tokens`` (answer tokens) overrides ``max_length`` (which counts the decoder's
        start token).
        """
        was_training = self.training
        self.eval()
        try:
            if isinstance(questions, SearchResult):
                batch = self.score(questions)
            elif isinstance(questions, RetrievalBatch):
                batch = questions
            else:
                batch = self.retrieve(questions, n_docs)
            settings: dict[str, Any] = {"num_beams": num_beams, "max_length": max_length, "mode": mode}
            if max_new_tokens is not None:
                settings["max_new_tokens"] = max_new_tokens
            texts, scores, ranked, prefill = self._decode(batch, settings)
            if not self.config.short_answers:
                return [text.strip() for text in texts]
            answers, grounded = self._pick(batch, texts, scores, ranked)
            if self.family.is_decoder_only and self.config.grounded and any(batch.texts) and not all(grounded):
                # a reply that left its passages competes with their spans, as RAG scores answers
                rows = [row for row, ok in enumerate(grounded) if not ok]
                for row, span in self._best_spans(batch, rows, [answers[row] for row in rows], prefill).items():
                    answers[row] = span
        finally:
            self.train(was_training)
        return answers

    def _decode(self, batch: RetrievalBatch, settings: dict[str, Any]) -> tuple[list[str], Tensor | None, int, Any]:
        """Replies (RAG-Sequence: ``ranked`` per question, best first, and their log p(y|x)), and a decoder-only
        generator's :class:`~rag_core.model.causal_decoding.Prefill` of the prompts (else None)."""
        from rag_core.model import causal_decoding, decoding

        settings = dict(settings)
        mode = settings.pop("mode")
        if self.family.is_decoder_only:
            token, sequence = causal_decoding.causal_token_generate, causal_decoding.causal_sequence_generate
            settings.update(eos_token_id=self.family.stop_token_ids, pad_token_id=self.family.pad_token_id)
            settings["prefill"] = causal_decoding.Prefill(self.generator, batch.context_input_ids,
                                                          batch.context_attention_mask)
        else:
            token, sequence = decoding.rag_token_generate, decoding.rag_sequence_generate
        inputs = (self.generator, batch.context_input_ids, batch.context_attention_mask, batch.doc_scores,
                  batch.n_docs)
        sequence_choice = self.config.short_answers and self.config.kind == "sequence"
        ranked = batch.n_docs * settings["num_beams"] if sequence_choice else 1  # candidates kept per question
        scores = None
        if self.config.kind == "token":
            ids = token(*inputs, **settings)  # [b, T]
        else:
            found = sequence(*inputs, mode=mode, num_return_sequences=ranked, **settings)
            ids, scores = found.sequences, found.scores  # [b * ranked, T], best first per question
        rows = ids[:, 1:].tolist()  # after the start token
        texts = self.generator_tokenizer.batch_decode(rows, skip_special_tokens=True)
        return texts, scores, ranked, settings.get("prefill")

    def _pick(self, batch: RetrievalBatch, texts: list[str], scores: Tensor | None,
              ranked: int) -> tuple[list[str], list[bool]]:
        """Per question, the answer span of its best reply that :func:`is_grounded` (its best reply's when none
        is), and whether it is."""
        answers, grounded = [], []
        for row, question in enumerate(batch.questions):
            mine = range(row * ranked, (row + 1) * ranked)
            if scores is not None and ranked > 1:  # RAG-Sequence's distinct candidates; -inf marks a missing one
                mine = [i for i in mine if scores[i] > -torch.inf] or [row * ranked]
            shorts = [short_answer(texts[i], question) for i in mine]
            passages = [f"{title} {text}" for title, text in zip(batch.titles[row], batch.texts[row], strict=True)]
            answers.append(shorts[grounded_choice(shorts, passages, question)])
            grounded.append(is_grounded(answers[-1], passages, question))
        return answers, grounded

    def _best_spans(self, batch: RetrievalBatch, rows: list[int], replies: list[str], prefill: Any) -> dict[int, str]:
        """Per question ``rows[i]`` with spans in its passages, the one of them or of its reply ``replies[i]``
        with the highest p(y|x); ``prefill``: the batch's prompts, as decoding ran them."""
        from rag_core.model.causal_decoding import causal_span_scores

        eos, spans = self.family.eos_token_id, [[] for _ in batch.questions]
        for row, reply in zip(rows, replies, strict=True):
            mine = dict.fromkeys(span for title, text in zip(batch.titles[row], batch.texts[row], strict=True)
                                 for part in (title, text) for span in passage_spans(part, batch.questions[row]))
            spans[row] = [reply, *(span for span in mine if span != reply)] if mine and reply else list(mine)
        tokens = [[ids + [eos] for ids in self.generator_tokenizer(mine, add_special_tokens=False)["input_ids"]]
                  if mine else [] for mine in spans]
        found = causal_span_scores(self.generator, batch.context_input_ids, batch.context_attention_mask,
                                   batch.doc_scores, batch.n_docs, tokens, kind=self.config.kind, always=1,
                                   prefill=prefill)
        return {row: spans[row][kept[int(scores.argmax())]] for row, (kept, scores) in enumerate(found) if kept}

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
            # where it was trained is not where it will run: a model saved on a GPU loads on a CPU-only machine
            "config": {**self.config.model_dump(mode="json"), "device": "auto"},
        }
        (path / RAG_JSON).write_text(json.dumps(record, indent=2, sort_keys=True))
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, retriever: IndexRetriever,
                        overrides: Mapping[str, Any] | None = None) -> RagModel:
        """A saved model, retrieving from ``retriever``'s index version (any with the same passage encoder).

        ``overrides`` replaces config fields (e.g. ``{"n_docs": 10}`` or ``{"device": "cuda"}``); the device is
        ``auto`` unless they name one, whatever the saved record says.
        """
        path = Path(path).expanduser()
        record = _read_record(path)
        config = RagConfig.model_validate({**record["config"], "device": "auto", **(overrides or {})})
        question_encoder = QuestionEncoder.from_pretrained(path / "question_encoder", record["question_encoder"])
        question_encoder.check_passage_side(retriever.fingerprint, model_dir=str(path), index=str(retriever.version))
        generator, tokenizer = load_generator(path / "generator", config.generator.dtype, choose_device(config.device))
        model = cls(config, question_encoder, generator, tokenizer, retriever,
                    trained_index_version=record["index_version"])
        model._log_binding(str(path))
        return model


def _question_list(questions: Sequence[str]) -> list[str]:
    if isinstance(questions, str):
        raise TypeError("questions must be a list of strings; wrap a single question in a list")
    return list(questions)


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
