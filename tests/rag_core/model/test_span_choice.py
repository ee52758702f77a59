"""Span choice: a reply that left its passages gives way to the passage span the generator finds likeliest.

Spans are checked on hand-worked passages; their scores against RAG's own loss (a real tiny Llama over
real FAISS indexes of real Wikipedia passages), for both marginalisations.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rag_core.evaluate.normalize import normalize_answer
from rag_core.model.causal_decoding import causal_span_scores
from rag_core.model.extract import passage_spans
from rag_core.model.generators import IGNORE, positions
from tests.helpers.rag_models import QUESTIONS, llama_model

PASSAGE = ("Lincoln was shot by John Wilkes Booth at Ford's Theatre on April 14, 1865. The Treaty of Paris "
           "ended the war (signed in 1783). Lead-acid batteries hold sulfuric acid.")


def test_spans_are_names_numbers_and_short_phrases_of_the_passage() -> None:
    spans = passage_spans(PASSAGE, "Who shot Abraham Lincoln?")
    for expected in ("John Wilkes Booth", "Booth", "Ford", "Ford's Theatre", "April 14, 1865", "1865",
                     "Treaty of Paris", "1783", "sulfuric acid", "Lead-acid batteries"):
        assert expected in spans, expected
    for absent in ("Lincoln",  # the question's own word
                   "Theatre on April",  # a name run may not hold a function word other than a name's links
                   "of Paris", "Treaty of",  # a function word at either end
                   "1865. The Treaty",  # across a full stop
                   "war (signed", "1783)",  # across or with a bracket
                   "batteries hold sulfuric",  # a run of lower-case words has two at most
                   "John Wilkes Booth at Ford"):  # five words
        assert absent not in spans, absent
    assert all(span in PASSAGE or f"{span}'s" in PASSAGE for span in spans)  # the passage's own text
    assert len(spans) == len(set(spans))
    assert passage_spans("", "anything") == [] and passage_spans("of the (and) .", "") == []


def test_spans_follow_the_word_limit() -> None:
    assert "John Wilkes Booth" not in passage_spans(PASSAGE, max_words=2)
    assert "John Wilkes" in passage_spans(PASSAGE, max_words=2)


def _labels(rows: list[list[int]]) -> torch.Tensor:
    labels = torch.full((len(rows), max(map(len, rows))), IGNORE)
    for i, row in enumerate(rows):
        labels[i, : len(row)] = torch.tensor(row)
    return labels


@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_span_scores_are_minus_rags_own_loss_of_each_span(indexes: SimpleNamespace, llama_dir: Path,
                                                          kind: str) -> None:
    model = llama_model(indexes, llama_dir, n_docs=3, kind=kind)
    batch = model.retrieve(QUESTIONS)
    eos, tok = model.family.eos_token_id, model.generator_tokenizer
    spans = [passage_spans(f"{batch.texts[q][0]} {batch.texts[q][1]}", QUESTIONS[q])[:9] for q in range(3)]
    tokens = [[ids + [eos] for ids in tok(mine, add_special_tokens=False)["input_ids"]] for mine in spans]
    found = causal_span_scores(model.generator, batch.context_input_ids, batch.context_attention_mask,
                               batch.doc_scores, 3, tokens, kind=kind, keep=len(tokens[0]) + len(tokens[1]))
    for q, (kept, scores) in enumerate(found):
        assert kept == list(range(len(tokens[q]))) and len(kept) >= 5  # keep above the count: every span
        one = model.retrieve([QUESTIONS[q]] * len(kept))  # the same question once per span
        with torch.no_grad():
            loss = model(one, _labels(tokens[q]))  # [spans]: RAG's NLL of each span as the answer
        torch.testing.assert_close(scores, -loss, rtol=1e-5, atol=1e-4)
    assert len({round(float(s), 3) for s in found[0][1]}) > 1  # the spans differ: the test can tell them apart


def test_keep_scores_the_spans_with_the_likeliest_first_token(indexes: SimpleNamespace, llama_dir: Path) -> None:
    model = llama_model(indexes, llama_dir, n_docs=2)
    batch = model.retrieve(QUESTIONS[:1])
    eos = model.family.eos_token_id
    spans = passage_spans(batch.texts[0][0], QUESTIONS[0])
    tokens = [ids + [eos] for ids in model.generator_tokenizer(spans, add_special_tokens=False)["input_ids"]]
    args = (model.generator, batch.context_input_ids, batch.context_attention_mask, batch.doc_scores, 2, [tokens])
    (every, every_scores), = causal_span_scores(*args, keep=len(tokens))
    (kept, scores), = causal_span_scores(*args, keep=3)
    (forced, _), = causal_span_scores(*args, keep=3, always=2)  # the first two whatever their first token
    assert len(kept) == 3 and set(kept) < set(every)
    torch.testing.assert_close(scores, every_scores[kept], rtol=1e-5, atol=1e-4)  # the same scores, fewer spans
    with torch.no_grad():
        mask = batch.context_attention_mask
        first = torch.log_softmax(model.generator(input_ids=batch.context_input_ids, attention_mask=mask,
                                                  position_ids=positions(mask)).logits[:, -1], -1)  # [2, V]
    # the pruning ranks by the first token's marginal only
    marginal = torch.logsumexp(first[:, [t[0] for t in tokens]] + torch.log_softmax(batch.doc_scores, 1).T, 0)
    assert min(marginal[kept]) >= max(marginal[[i for i in every if i not in kept]]) - 1e-4
    assert forced[:2] == [0, 1] and len(forced) == 3 and forced[2] == max(every[2:], key=lambda i: marginal[i])


@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_generate_answers_from_the_passages_and_closed_book_stays_free(indexes: SimpleNamespace,
                                                                      llama_dir: Path, kind: str) -> None:
    model = llama_model(indexes, llama_dir, n_docs=2, kind=kind)
    assert model.config.grounded  # the default
    batch = model.retrieve(QUESTIONS)
    answers = model.generate(batch, max_new_tokens=48)
    for row, answer in enumerate(answers):
        said = normalize_answer(answer)
        texts = [normalize_answer(f"{title} {text}") for title, text in zip(batch.titles[row], batch.texts[row],
                                                                          strict=True)]
        # the random Llama's replies leave the passages and lose to their spans (a reply may compete and win)
        assert said and any(f" {said} " in f" {text} " for text in texts), (answer, batch.titles[row])
    free = model.config.model_copy(update={"grounded": False})
    model.config = free
    assert model.generate(batch, max_new_tokens=48) != answers  # the random Llama left free leaves its passages
    closed = model.generate(model.closed_book(QUESTIONS), max_new_tokens=8)
    model.config = free.model_copy(update={"grounded": True})
    assert model.generate(model.closed_book(QUESTIONS), max_new_tokens=8) == closed  # no passages, nothing to ground
