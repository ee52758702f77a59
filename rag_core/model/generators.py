"""The generator families RAG can use: seq2seq (BART, T5, EncoderDecoder) and decoder-only (Llama, SmolLM2, ...).

RAG needs three things of a generator, and each family does them its own way:

- **inputs** for every (question, passage) pair, ``[b * n_docs, L]`` (and for a question alone, the
  closed-book baseline);
- **answer logits** ``[b * n_docs, T, V]`` such that ``logits[:, t]`` predicts target token ``t``
  (what :mod:`rag_core.model.marginalize` takes), for targets ``[b, T]`` padded with ``label_pad_id``;
- **decoding**: RAG-Token and RAG-Sequence (:mod:`rag_core.model.decoding`,
  :mod:`rag_core.model.causal_decoding`).

Seq2seq: the input is the paper's string ``title / text // question``; targets are
``tokenizer(text_target=answer)`` and the decoder reads them shifted right.

Decoder-only: the input is a prompt (the model's chat template where it has one, with
:data:`SYSTEM` and :data:`WITH_PASSAGE` / :data:`CLOSED_BOOK`), left-padded so that every row's
answer starts at the same column; the target is the answer's tokens and eos, so the loss covers
the answer only. Position ids count real tokens only, so a left-padded row computes exactly what
the unpadded prompt would. The stop rule of decoding: eos, or any token holding a line break
(the answer is the first line), which with the short-answer instruction keeps answers short.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from rag_core.errors import WikiragError
from rag_core.perf.precision import choose_precision
from rag_core.index.encoders import packaged_model_path

# Chosen on 8 questions outside the benchmark's set among 5 variants (few-shot turns made no answer shorter).
# On the real questions' dev split (50) no other wording beat it by more than 2 questions, and the best of
# those lost 4 on test: few-shot turns with short passages (the model copies the shot's answer type, a year
# or a name), a system line to answer from the passage, the question before the passage, passages cut to
# their best sentences, and a forced reply lead-in all scored the same or worse.
SYSTEM = "You answer like a quiz contestant: only the answer, in one to five words."
WITH_PASSAGE = "Passage: {title}: {text}\n\nQuestion: {question}\nReply with the answer only, in one to five words."
CLOSED_BOOK = "Question: {question}\nReply with the answer only, in one to five words."
EXAMPLES: tuple[tuple[str, str], ...] = ()  # (question, answer) chat turns before the real one (few-shot)
PLAIN_SUFFIX = "\nAnswer:"  # decoder-only models without a chat template
IGNORE = -100  # target padding of decoder-only models, whose pad token is often their eos


class RagModelError(WikiragError):
    """A RAG model directory or generator that cannot be used as asked."""


class GeneratorConfig(BaseModel):
    """Which generator to use; the size fields shape only the default one."""

    model_config = ConfigDict(frozen=True)

    path: str | None = Field(None, description="local transformers dir (seq2seq or decoder-only) with tokenizer; "
                                               "None = small BART")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "float32", description="weights of a generator loaded from path; auto = rag_core.perf.precision's rule "
                               "(inference); training wants float32")
    d_model: int = Field(128, ge=8, description="default generator: hidden width")
    layers: int = Field(2, ge=1, description="default generator: encoder layers, and as many decoder layers")
    heads: int = Field(4, ge=1, description="default generator: attention heads (must divide d_model)")
    ffn_dim: int = Field(512, ge=8, description="default generator: feed-forward width")
    seed: int = Field(0, description="default generator: initialisation seed (the global RNG is untouched)")


class Seq2SeqFamily:
    """BART, T5, EncoderDecoderModel: the paper's generator inputs and the seq2seq target convention."""

    is_decoder_only = False

    def __init__(self, model: nn.Module, tokenizer: Any, *, max_context_length: int, max_answer_length: int,
                 title_sep: str, doc_sep: str) -> None:
        self.tokenizer, self.max_context_length, self.max_answer_length = tokenizer, max_context_length, max_answer_length
        self.title_sep, self.doc_sep = title_sep, doc_sep
        self.prefix = getattr(model.config, "prefix", None)
        self.decoder_start_token_id = model.config.decoder_start_token_id
        self.label_pad_id = tokenizer.pad_token_id
        if self.decoder_start_token_id is None or self.label_pad_id is None:
            raise RagModelError(f"generator {type(model).__name__}: needs decoder_start_token_id in its config "
                                f"(has {self.decoder_start_token_id}) and a pad token in its tokenizer (has "
                                f"{self.label_pad_id}); set them before saving the generator")

    def inputs(self, titles: Sequence[Sequence[str]] | None, texts: Sequence[Sequence[str]] | None,
               questions: Sequence[str]) -> tuple[Tensor, Tensor]:
        """``[b * n_docs, L]`` ids and mask; ``titles=None``: the question alone (closed book)."""
        if titles is None:
            strings = [(self.prefix or "") + q for q in questions]
        else:
            strings = context_strings(titles, texts, questions, title_sep=self.title_sep, doc_sep=self.doc_sep,
                                      prefix=self.prefix)
        tokens = self.tokenizer(strings, max_length=self.max_context_length, truncation=True, padding="longest",
                                return_tensors="pt")
        return tokens["input_ids"], tokens["attention_mask"]

    def labels(self, answers: Sequence[str]) -> Tensor:
        tokens = self.tokenizer(text_target=list(answers), max_length=self.max_answer_length, truncation=True,
                                padding="longest", return_tensors="pt")
        return tokens["input_ids"]  # [b, T]

    def answer_logits(self, model: nn.Module, input_ids: Tensor, mask: Tensor, labels: Tensor, n_docs: int) -> Tensor:
        start = labels.new_full((labels.shape[0], 1), self.decoder_start_token_id)  # [b, 1]
        decoder_input_ids = torch.cat([start, labels[:, :-1]], dim=1)  # [b, T]: shifted right
        decoder_input_ids = decoder_input_ids.repeat_interleave(n_docs, dim=0)  # [b * n_docs, T]
        return model(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_input_ids,
                     use_cache=False).logits  # [b * n_docs, T, V]


class DecoderOnlyFamily:
    """Causal LMs: a prompt per (question, passage), left-padded; the loss and decoding cover the answer only."""

    is_decoder_only = True

    def __init__(self, model: nn.Module, tokenizer: Any, *, max_answer_length: int) -> None:
        self.tokenizer, self.max_answer_length = tokenizer, max_answer_length
        eos = model.generation_config.eos_token_id
        eos = tokenizer.eos_token_id if eos is None else eos
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if not eos:
            raise RagModelError(f"generator {type(model).__name__}: no eos token in its generation_config or "
                                "tokenizer; set one before saving the generator")
        self.eos_token_id = eos[0]
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        self.label_pad_id = IGNORE
        # the stop rule: eos, or a token that holds a line break (the answer is the prompt's first line)
        self.stop_token_ids = eos + sorted(i for t, i in tokenizer.get_vocab().items()
                                           if "\n" in tokenizer.convert_tokens_to_string([t]) and i not in eos)

    def prompt(self, question: str, title: str | None = None, text: str | None = None) -> str:
        user = (CLOSED_BOOK.format(question=question) if title is None
                else WITH_PASSAGE.format(title=title.strip('"'), text=text, question=question))
        if getattr(self.tokenizer, "chat_template", None):
            shots = [{"role": role, "content": content} for q, a in EXAMPLES
                     for role, content in (("user", CLOSED_BOOK.format(question=q)), ("assistant", a))]
            messages = [{"role": "system", "content": SYSTEM}, *shots, {"role": "user", "content": user}]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return user + PLAIN_SUFFIX

    def inputs(self, titles: Sequence[Sequence[str]] | None, texts: Sequence[Sequence[str]] | None,
               questions: Sequence[str]) -> tuple[Tensor, Tensor]:
        """``[b * n_docs, L]`` left-padded prompt ids and mask; ``titles=None``: closed book."""
        if titles is None:
            prompts = [self.prompt(q) for q in questions]
        else:
            prompts = [self.prompt(q, title, text) for doc_titles, doc_texts, q in zip(titles, texts, questions,
                                                                                      strict=True)
                       for title, text in zip(doc_titles, doc_texts, strict=True)]
        rows = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        return left_pad(rows, self.pad_token_id)

    def labels(self, answers: Sequence[str]) -> Tensor:
        rows = self.tokenizer(list(answers), add_special_tokens=False)["input_ids"]
        rows = [row[: self.max_answer_length - 1] + [self.eos_token_id] for row in rows]
        width = max(len(row) for row in rows)
        return torch.tensor([row + [IGNORE] * (width - len(row)) for row in rows])  # [b, T]

    def answer_logits(self, model: nn.Module, input_ids: Tensor, mask: Tensor, labels: Tensor, n_docs: int) -> Tensor:
        length = labels.shape[1]
        answer = labels.masked_fill(labels == IGNORE, self.pad_token_id)  # [b, T]; what follows eos is never read
        answer = answer.repeat_interleave(n_docs, dim=0)[:, :-1]  # [b * n_docs, T - 1]: the last token predicts none
        ids = torch.cat([input_ids, answer], dim=1)  # [b * n_docs, L + T - 1]
        mask = torch.cat([mask, torch.ones_like(answer)], dim=1)  # [b * n_docs, L + T - 1]
        if self.row_by_row(ids, mask):
            # each row without its left padding; its position L - 1 + t still predicts answer token t
            return torch.cat([model(input_ids=row[keep.bool()][None], logits_to_keep=length, use_cache=False).logits
                              for row, keep in zip(ids, mask, strict=True)])  # [b * n_docs, T, V]
        # position L - 1 + t (the prompt's last token for t = 0) predicts answer token t
        return model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), logits_to_keep=length,
                     use_cache=False).logits  # [b * n_docs, T, V]

    # "auto": rows one by one on a CPU, where a padding token costs as much as a real one and a ~200-token row
    # still makes GEMMs big enough (prompts of sampled passages differ in length: ~10% of a batch of 4 is
    # padding); one padded batch on accelerators, which need the width. "batched" / "rows" force one way.
    unpadding: Literal["auto", "batched", "rows"] = "auto"

    def row_by_row(self, ids: Tensor, mask: Tensor) -> bool:
        if self.unpadding == "auto":
            return ids.device.type == "cpu" and ids.shape[0] > 1 and not bool(mask.all())
        return self.unpadding == "rows"


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token lists to left-padded ``[n, L]`` ids and mask."""
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad_id] * (width - len(row)) + list(row) for row in rows])  # [n, L]
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])  # [n, L]
    return ids, mask


def positions(mask: Tensor) -> Tensor:
    """``[n, L]`` position ids that count real tokens only (0 on left padding), as ``generate`` computes them."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)


def context_strings(titles: Sequence[Sequence[str]], texts: Sequence[Sequence[str]], questions: Sequence[str],
                    *, title_sep: str = " / ", doc_sep: str = " // ", prefix: str | None = None) -> list[str]:
    """Seq2seq generator inputs ``[b * n_docs]``, as transformers' ``RagRetriever.postprocess_docs`` builds them."""
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


def load_generator(path: Path, dtype: str = "float32", device: str = "cpu") -> tuple[nn.Module, Any]:
    """A seq2seq or decoder-only generator (by its config) and its tokenizer from a local directory."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    if not (path / "config.json").is_file():
        raise RagModelError(f"{path}: not a transformers model directory (no config.json); give a local directory "
                            "saved with save_pretrained() (e.g. from `wikirag models fetch`)")
    torch_dtype = choose_precision(dtype, device).torch_dtype
    try:
        config = AutoConfig.from_pretrained(str(path))
        auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
        model = auto.from_pretrained(str(path), dtype=torch_dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:
        raise RagModelError(f"{path}: cannot load a generator and its tokenizer ({type(exc).__name__}: "
                            f"{str(exc)[:160]}); save a seq2seq or causal LM and its tokenizer there") from exc
    return model, tokenizer


def train_last_blocks(model: nn.Module, n: int) -> tuple[int, int]:
    """Freeze the whole generator except its decoder's last ``n`` blocks (all if it has fewer) and the norm after them.

    Gradients then start no lower than the first trained block, so autograd skips the backward
    pass of everything beneath it (about two thirds of a frozen block's training cost); the
    embeddings (and a head tied to them) stay as loaded. Returns (trained blocks, decoder blocks).
    """
    decoder = model.get_decoder()
    blocks = next((m for name in ("layers", "h", "block") if isinstance(m := getattr(decoder, name, None), nn.ModuleList)),
                  None)
    if blocks is None:
        raise RagModelError(f"generator {type(model).__name__}: no list of decoder blocks (layers, h or block) to "
                            "train the last ones of; train every parameter (train_generator_layers=None)")
    if n < 1:
        raise RagModelError(f"train_generator_layers={n}: give a number of decoder blocks >= 1, or None to train "
                            "every parameter")
    n = min(n, len(blocks))  # "the last 10" of a smaller model is all of them
    model.requires_grad_(False)
    blocks[len(blocks) - n:].requires_grad_(True)
    for name, child in decoder.named_children():  # the final norm (norm, ln_f, final_layer_norm), not the input's
        if "norm" in type(child).__name__.lower() and "embed" not in name:
            child.requires_grad_(True)
    return n, len(blocks)


def family_of(model: nn.Module, tokenizer: Any, config: Any) -> Seq2SeqFamily | DecoderOnlyFamily:
    """The family object for ``model`` (``config``: a RagConfig, for lengths and separators)."""
    if model.config.is_encoder_decoder:
        return Seq2SeqFamily(model, tokenizer, max_context_length=config.max_context_length,
                             max_answer_length=config.max_answer_length, title_sep=config.title_sep,
                             doc_sep=config.doc_sep)
    return DecoderOnlyFamily(model, tokenizer, max_answer_length=config.max_answer_length)
