"""Grounded decoding: a real tiny Llama over real FAISS indexes of real Wikipedia passages emits only passage spans.

The spans' trie is checked on hand-worked cases with two real tokenizers (the packaged WordPiece one, and a
byte-level BPE trained here, whose first word differs with and without its space).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rag_core.evaluate.normalize import normalize_answer
from rag_core.index.encoders import packaged_model_path
from rag_core.model.causal_decoding import causal_sequence_generate, causal_token_generate
from rag_core.model.generators import IGNORE
from rag_core.model.grounded_decoding import PassageSpans
from tests.helpers.rag_models import QUESTIONS, llama_model

PASSAGE = "Alaska: The capital of Alaska is Juneau, Alaska. It was bought in 1867 (for $7.2 million)."
SPANS = [  # (span, is a whole span of PASSAGE)
    ("Juneau", True), ("Juneau, Alaska", True), ("capital of Alaska is Juneau", True), ("1867", True),
    ("for $7.2 million", True), ("Alaska", True), ("The capital", True),
    ("June", False),  # inside a word: no stop allowed there
    ("186", False),  # a number cut short
    ("Anchorage", False), ("capital Juneau", False),  # not in the passage / not contiguous
    ("apital", False),  # no word starts there
]


def byte_level_bpe() -> PreTrainedTokenizerFast:
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([PASSAGE, "Anchorage is the largest city. June is a month."] * 4, vocab_size=300,
                            show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)


@pytest.mark.parametrize("tokenizer", ["wordpiece", "byte-level BPE"])
def test_spans_start_at_words_and_end_where_words_end(tokenizer: str) -> None:
    tok = AutoTokenizer.from_pretrained(str(packaged_model_path())) if tokenizer == "wordpiece" else byte_level_bpe()
    spans = PassageSpans(tok, [PASSAGE], max_words=6)
    for span, whole in SPANS:
        assert spans.contains(tok(span, add_special_tokens=False)["input_ids"]) is whole, span
        # the spelling behind its space ("ĠJuneau" in byte-level BPE) is a span too, where a space is before it
        if f" {span}" in PASSAGE:
            assert spans.contains(tok(" " + span, add_special_tokens=False)["input_ids"]) is whole, span
    # max_words: six words from "The" are a span, seven are not
    assert spans.contains(tok("The capital of Alaska is Juneau,", add_special_tokens=False)["input_ids"])
    assert not spans.contains(tok("The capital of Alaska is Juneau, Alaska", add_special_tokens=False)["input_ids"])
    assert not PassageSpans(tok, [""]) and not PassageSpans(tok, [])


def _answer_ids(row: list[int], stop: list[int]) -> list[int]:
    """A decoded row without its placeholder column, up to (not including) its first stop token."""
    row = row[1:]
    return row[: next((i for i, t in enumerate(row) if t in stop), len(row))]


def _passage_spans(model, batch, per_doc: bool) -> list[PassageSpans]:
    tok = model.generator_tokenizer
    if per_doc:
        return [PassageSpans(tok, [title, text]) for titles, texts in zip(batch.titles, batch.texts, strict=True)
                for title, text in zip(titles, texts, strict=True)]
    return [PassageSpans(tok, [*titles, *texts]) for titles, texts in zip(batch.titles, batch.texts, strict=True)]


@pytest.mark.parametrize("beams", [1, 3])
def test_token_decoding_emits_only_spans_of_the_questions_passages(indexes: SimpleNamespace,
                                                                   llama_dir: Path, beams: int) -> None:
    model = llama_model(indexes, llama_dir, n_docs=3, kind="token")
    batch = model.retrieve(QUESTIONS)
    stop, pad = model.family.stop_token_ids, model.family.pad_token_id
    settings = {"num_beams": beams, "max_new_tokens": 48, "eos_token_id": stop, "pad_token_id": pad}
    inputs = (model.generator, batch.context_input_ids, batch.context_attention_mask, batch.doc_scores, 3)
    spans = _passage_spans(model, batch, per_doc=False)
    grounded = causal_token_generate(*inputs, spans=spans, **settings).tolist()
    free = causal_token_generate(*inputs, **settings).tolist()
    for row, trie in zip(grounded, spans, strict=True):
        assert trie.contains(_answer_ids(row, stop))
    # the random Llama left free leaves its passages: the mask is what keeps it inside them
    assert not all(trie.contains(_answer_ids(row, stop)) for row, trie in zip(free, spans, strict=True))


@pytest.mark.parametrize("mode", ["thorough", "fast"])
def test_sequence_candidates_are_their_passages_spans_ranked_by_the_unconstrained_marginal(
        indexes: SimpleNamespace, llama_dir: Path, mode: str) -> None:
    model = llama_model(indexes, llama_dir, n_docs=3, kind="sequence")
    batch = model.retrieve(QUESTIONS)
    stop = model.family.stop_token_ids
    spans = _passage_spans(model, batch, per_doc=True)  # [3 questions * 3 docs]
    found = causal_sequence_generate(model.generator, batch.context_input_ids, batch.context_attention_mask,
                                     batch.doc_scores, 3, mode=mode, num_beams=2, max_new_tokens=48,
                                     num_return_sequences=6, eos_token_id=stop, pad_token_id=model.family.pad_token_id,
                                     spans=spans)
    rows = found.sequences.tolist()
    for i, row in enumerate(rows):
        if found.scores[i] > -torch.inf:  # a real candidate: a span of one of its question's passages
            question = i // 6
            assert any(trie.contains(_answer_ids(row, stop)) for trie in spans[question * 3: question * 3 + 3])
    if mode == "thorough":  # scores are log p(y|x) of the free model: minus RAG-Sequence's loss of the candidate
        best = [rows[q * 6] for q in range(3)]
        labels = torch.full((3, found.sequences.shape[1]), IGNORE)
        for q, row in enumerate(best):
            kept = row[1: len(_answer_ids(row, stop)) + 2]  # the answer and the stop token that ended it
            labels[q, : len(kept)] = torch.tensor(kept)
        with torch.no_grad():
            loss = model(batch, labels)
        torch.testing.assert_close(found.scores[::6], -loss, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_generate_answers_from_the_passages_and_closed_book_stays_free(indexes: SimpleNamespace,
                                                                      llama_dir: Path, kind: str) -> None:
    model = llama_model(indexes, llama_dir, n_docs=2, kind=kind, grounded=True)  # opt-in (off by default)
    batch = model.retrieve(QUESTIONS)
    answers = model.generate(batch, max_new_tokens=48)
    for row, answer in enumerate(answers):
        said = normalize_answer(answer)
        texts = [normalize_answer(f"{title} {text}") for title, text in zip(batch.titles[row], batch.texts[row],
                                                                          strict=True)]
        assert said and any(f" {said} " in f" {text} " for text in texts), (answer, batch.titles[row])
    free = model.config.model_copy(update={"grounded": False})
    model.config = free
    assert model.generate(batch, max_new_tokens=48) != answers  # the switch is the only change
    closed = model.generate(model.closed_book(QUESTIONS), max_new_tokens=8)
    model.config = free.model_copy(update={"grounded": True})
    assert model.generate(model.closed_book(QUESTIONS), max_new_tokens=8) == closed  # no passages, nothing to ground

