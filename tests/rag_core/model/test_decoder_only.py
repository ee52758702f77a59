"""RAG with a decoder-only generator: a real tiny random Llama over real FAISS indexes of real Wikipedia passages.

References: the Llama's own ``labels=`` loss, its own ``generate`` (greedy and beam), and for several
documents a plain re-implementation here that runs every prompt from scratch (no cache) at each step.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rag_core.model.causal_decoding import causal_sequence_generate, causal_token_generate
from rag_core.model.extract import short_answer
from rag_core.model.generators import IGNORE
from rag_core.model.rag_model import RagModel
from tests.helpers.rag_models import ANSWERS, QUESTIONS, llama_model


def test_prompts_hold_passage_and_question_left_padded(indexes: SimpleNamespace, llama_dir: Path) -> None:
    model = llama_model(indexes, llama_dir, n_docs=2)
    batch = model.retrieve(QUESTIONS)
    assert batch.context_input_ids.shape[0] == 6
    mask = batch.context_attention_mask
    assert (mask[:, -1] == 1).all() and (mask[:, 0] == 0).any()  # left padding: every prompt ends at the same column
    first = model.generator_tokenizer.decode(batch.context_input_ids[0][mask[0].bool()])
    assert batch.texts[0][0].split()[0].lower() in first and "anarchism" in first and "assistant" in first
    closed = model.closed_book(QUESTIONS)
    assert closed.n_docs == 1 and "anarchism" in model.generator_tokenizer.decode(closed.context_input_ids[0])


def test_one_document_loss_is_the_llamas_own_labels_loss(indexes: SimpleNamespace, llama_dir: Path) -> None:
    """Per question, unpadded: prompt + answer + eos with labels=-100 on the prompt; ours sums, theirs averages."""
    model = llama_model(indexes, llama_dir, n_docs=1)
    batch = model.retrieve(QUESTIONS)
    ours = model(batch, ANSWERS)  # [3]
    labels = model.answer_labels(ANSWERS)  # [3, T], IGNORE-padded
    assert (labels == model.family.eos_token_id).sum() == 3 and model.pad_token_id == IGNORE
    for i in range(3):
        prompt = batch.context_input_ids[i][batch.context_attention_mask[i].bool()]
        answer = labels[i][labels[i] != IGNORE]
        ids = torch.cat([prompt, answer]).unsqueeze(0)
        own = model.generator(input_ids=ids, labels=torch.cat([torch.full_like(prompt, -100), answer]).unsqueeze(0))
        torch.testing.assert_close(ours[i], own.loss * len(answer), rtol=1e-5, atol=1e-4)


def test_rows_one_by_one_give_the_padded_batchs_losses_and_gradients(indexes: SimpleNamespace,
                                                                     llama_dir: Path) -> None:
    """The CPU default runs each prompt without its left padding; it must compute what the padded batch does."""
    model = llama_model(indexes, llama_dir, n_docs=2)
    batch = model.retrieve(QUESTIONS)
    assert (batch.context_attention_mask == 0).any()  # prompts of different lengths: there is padding to skip
    assert model.family.row_by_row(batch.context_input_ids, batch.context_attention_mask)  # the default on a CPU
    results = {}
    for way in ("batched", "rows"):
        model.family.unpadding = way
        model.zero_grad()
        loss = model(model.retrieve(QUESTIONS), ANSWERS)  # [3]; retrieved again: its doc scores' graph is spent
        loss.sum().backward()
        results[way] = loss.detach(), {n: p.grad.clone() for n, p in model.generator.named_parameters()}
    model.family.unpadding = "auto"
    (batched, batched_grads), (rows, rows_grads) = results["batched"], results["rows"]
    torch.testing.assert_close(rows, batched, rtol=1e-5, atol=1e-5)
    assert batched_grads.keys() == rows_grads.keys()
    for name, grad in batched_grads.items():
        # float32 sums in another order (a GEMM per row, not per batch): the rounding grows with the gradient's
        # size (on an AMD EPYC: 3.5e-5 off in k_proj's gradient of magnitude 24, 1.5e-6 of it)
        scale = max(1.0, float(grad.abs().max()))
        torch.testing.assert_close(rows_grads[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("beams", [1, 3])
def test_one_document_decoding_equals_generate(indexes: SimpleNamespace, llama_dir: Path, beams: int) -> None:
    model = llama_model(indexes, llama_dir, n_docs=1)
    batch = model.retrieve(QUESTIONS)
    ids, mask = batch.context_input_ids, batch.context_attention_mask
    eos, pad = model.family.stop_token_ids, model.family.pad_token_id
    reference = model.generator.generate(input_ids=ids, attention_mask=mask, num_beams=beams, max_new_tokens=8,
                                         do_sample=False, eos_token_id=eos, pad_token_id=pad)[:, ids.shape[1]:]
    settings = {"num_beams": beams, "max_new_tokens": 8, "eos_token_id": eos, "pad_token_id": pad}
    token = causal_token_generate(model.generator, ids, mask, batch.doc_scores, 1, **settings)[:, 1:]
    thorough = causal_sequence_generate(model.generator, ids, mask, batch.doc_scores, 1, **settings).sequences[:, 1:]
    for ours in (token, thorough):
        width = max(ours.shape[1], reference.shape[1])
        assert torch.equal(*(torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad) for t in (ours, reference)))
    assert len({tuple(r) for r in reference.tolist()}) == 3  # the prompts matter: a real check


def _reference_token_greedy(model: RagModel, ids, mask, doc_scores, n_docs: int, steps: int) -> torch.Tensor:
    """RAG-Token greedy with no cache: every prompt + answer so far runs in full at every step."""
    prior = torch.log_softmax(doc_scores, dim=1)  # [b, n]
    answers = [[] for _ in range(doc_scores.shape[0])]
    for _ in range(steps):
        rows = []
        for r in range(ids.shape[0]):
            prompt = ids[r][mask[r].bool()].tolist()
            rows.append(torch.log_softmax(model.generator(input_ids=torch.tensor([prompt + answers[r // n_docs]]))
                                          .logits[0, -1], dim=-1))
        mixed = torch.logsumexp(torch.stack(rows).view(-1, n_docs, rows[0].shape[0]) + prior.unsqueeze(-1), dim=1)
        for b, token in enumerate(mixed.argmax(dim=-1).tolist()):
            answers[b].append(token)
    return torch.tensor(answers)


def test_several_documents_token_greedy_equals_a_cacheless_mixture(indexes: SimpleNamespace,
                                                                   llama_dir: Path) -> None:
    model = llama_model(indexes, llama_dir, n_docs=3)
    batch = model.retrieve(QUESTIONS)
    scores = batch.doc_scores.detach() * 20  # sharper than cosines: every document's weight shows
    ids, mask = batch.context_input_ids, batch.context_attention_mask
    ours = causal_token_generate(model.generator, ids, mask, scores, 3, max_new_tokens=6, eos_token_id=[10**6],
                                 pad_token_id=0)[:, 1:]  # an eos that never comes: all 6 steps
    with torch.no_grad():
        torch.testing.assert_close(ours, _reference_token_greedy(model, ids, mask, scores, 3, 6), rtol=0, atol=0)


def test_several_documents_token_greedy_rows_that_stop_leave_the_others_unchanged(indexes: SimpleNamespace,
                                                                                 llama_dir: Path) -> None:
    """RAG-Token over 3 documents with a stop token that the first question picks at its second step: each row is
    the never-stopping search's up to its stop token, then padding; the rows that go on after others left (each
    with its 3 documents' cache rows and doc scores) are unchanged."""
    model = llama_model(indexes, llama_dir, n_docs=3)
    batch = model.retrieve(QUESTIONS)
    # sharp, and a different document leads each question: a row stepped with another row's doc scores shows
    scores = torch.stack([row.roll(i) for i, row in enumerate(batch.doc_scores.detach() * 200)])
    ids, mask = batch.context_input_ids, batch.context_attention_mask
    free = causal_token_generate(model.generator, ids, mask, scores, 3, max_new_tokens=6, eos_token_id=[10**6],
                                 pad_token_id=0)[:, 1:]
    stop = int(free[0, 1])
    ours = causal_token_generate(model.generator, ids, mask, scores, 3, max_new_tokens=6, eos_token_id=[stop],
                                 pad_token_id=0)[:, 1:]
    ends = [row.index(stop) + 1 if stop in row else len(row) for row in free.tolist()]
    assert ends[0] == 2 and any(end > 2 for end in ends), ends  # one stops early, another goes on
    for row, expected, end in zip(ours.tolist(), free.tolist(), ends, strict=True):
        assert row[:end] == expected[:end] and set(row[end:]) <= {0}


@pytest.mark.parametrize("mode", ["thorough", "fast"])
def test_sequence_scores_are_the_sequence_loss(indexes: SimpleNamespace, llama_dir: Path, mode: str) -> None:
    """log p(y|x) of the chosen answer is minus RAG-Sequence's loss of that answer (a second code path)."""
    model = llama_model(indexes, llama_dir, n_docs=3, kind="sequence")
    batch = model.retrieve(QUESTIONS)
    eos = model.family.stop_token_ids
    found = causal_sequence_generate(model.generator, batch.context_input_ids, batch.context_attention_mask,
                                     batch.doc_scores, 3, mode=mode, num_beams=2, max_new_tokens=5,
                                     eos_token_id=eos, pad_token_id=model.family.pad_token_id)
    labels = torch.full((3, found.sequences.shape[1] - 1), IGNORE)
    for i, row in enumerate(found.sequences[:, 1:].tolist()):
        kept = row[: next((j + 1 for j, t in enumerate(row) if t in eos), len(row))]
        labels[i, : len(kept)] = torch.tensor(kept)
    with torch.no_grad():
        loss = model(batch, labels)
    if mode == "thorough":
        torch.testing.assert_close(found.scores, -loss, rtol=1e-5, atol=1e-4)
    else:  # fast drops the documents whose search did not produce the answer: never above thorough
        assert (found.scores <= -loss + 1e-4).all()


def test_rows_that_stop_early_leave_the_search_with_their_tokens_and_scores(indexes: SimpleNamespace,
                                                                          llama_dir: Path) -> None:
    """The stop token is one that the first prompt's reply picks at its second step: replies then stop at different
    steps, each leaving the search when it does. Tokens are the Llama's own ``generate``'s, and fast RAG-Sequence's
    score (the search's own sum of log-probs) is minus the one-document loss of the answer."""
    model = llama_model(indexes, llama_dir, n_docs=1, kind="sequence")
    batch = model.retrieve(QUESTIONS)
    ids, mask, pad = batch.context_input_ids, batch.context_attention_mask, model.family.pad_token_id
    free = causal_token_generate(model.generator, ids, mask, batch.doc_scores, 1, max_new_tokens=8,
                                 eos_token_id=[10**6], pad_token_id=pad)  # an eos that never comes
    stop = int(free[0, 2])
    reference = model.generator.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                         eos_token_id=stop, pad_token_id=pad)[:, ids.shape[1]:]
    found = causal_sequence_generate(model.generator, ids, mask, batch.doc_scores, 1, mode="fast", num_beams=1,
                                     max_new_tokens=8, eos_token_id=[stop], pad_token_id=pad)
    ours = found.sequences[:, 1:]
    width = max(ours.shape[1], reference.shape[1])
    assert torch.equal(*(torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pad) for t in (ours, reference)))
    stopped_at = [row.index(stop) if stop in row else None for row in ours.tolist()]
    assert stopped_at[0] == 1 and any(at != 1 for at in stopped_at), stopped_at
    labels = torch.full(ours.shape, IGNORE)
    for i, (row, at) in enumerate(zip(ours.tolist(), stopped_at, strict=True)):
        kept = row if at is None else row[: at + 1]
        labels[i, : len(kept)] = torch.tensor(kept)
    with torch.no_grad():
        loss = model(batch, labels)
    torch.testing.assert_close(found.scores, -loss, rtol=1e-5, atol=1e-4)


def test_gradients_reach_the_question_encoder_through_doc_scores_only(indexes: SimpleNamespace,
                                                                     llama_dir: Path) -> None:
    model = llama_model(indexes, llama_dir, n_docs=3, kind="token").train()
    batch = model.retrieve(QUESTIONS)
    # d doc_scores[b, z] / d q[b] is the stored vector of passage z: the documents enter as constants
    (grad_q,) = torch.autograd.grad(batch.doc_scores.sum(), batch.question_vectors, retain_graph=True)
    vectors = model.retriever.retrieve(batch.question_vectors.detach().numpy(), 3).doc_vectors
    torch.testing.assert_close(grad_q, torch.from_numpy(vectors.sum(axis=1)))
    model(batch, ANSWERS).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.question_encoder.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.generator.parameters())
    # one document: p(z|x) = 1 whatever its score, so nothing reaches the question encoder
    model.zero_grad()
    model(model.retrieve(QUESTIONS, n_docs=1), ANSWERS).sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.question_encoder.parameters())


def test_generate_answers_each_question_and_saves_and_reloads(indexes: SimpleNamespace, llama_dir: Path,
                                                              tmp_path: Path) -> None:
    model = llama_model(indexes, llama_dir, n_docs=2, kind="token")
    answers = model.generate(QUESTIONS, max_new_tokens=4, num_beams=2)
    closed = model.generate(model.closed_book(QUESTIONS), max_new_tokens=4)
    assert len(answers) == len(closed) == 3 and all(isinstance(a, str) for a in answers + closed)
    again = RagModel.from_pretrained(model.save_pretrained(tmp_path / "rag"), model.retriever)
    assert again.family.is_decoder_only and again.generate(QUESTIONS, max_new_tokens=4, num_beams=2) == answers


def test_generate_returns_each_replys_answer_span(indexes: SimpleNamespace, llama_dir: Path) -> None:
    # the cutting itself is checked on hand-worked replies in test_answer_extraction.py; here, that generate()
    # applies it to what was decoded, and only when the config asks
    model = llama_model(indexes, llama_dir, n_docs=2, short_answers=False, grounded=False)
    batch = model.retrieve(QUESTIONS)
    replies = model.generate(batch, max_new_tokens=12)
    model.config = model.config.model_copy(update={"short_answers": True})
    answers = model.generate(batch, max_new_tokens=12)
    assert answers == [short_answer(reply, question) for reply, question in zip(replies, QUESTIONS, strict=True)]
