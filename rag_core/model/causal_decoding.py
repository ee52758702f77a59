"""RAG decoding with a decoder-only generator: the modes of :mod:`rag_core.model.decoding`, with a KV cache per document.

Inputs are left-padded prompts ``[batch * n_docs, L]`` (one per question and document). Every prompt
is run once (the *prefill*); its cache then serves every later step:

- ``causal_token_generate``: RAG-Token greedy (``num_beams=1``) or beam search. Each (example, beam,
  document) row keeps its own cache; the next-token distribution is the doc-weighted mixture
  sum_z p(z|x) p(y_t | x, z, y_<t). The search loops are :mod:`rag_core.model.decoding`'s (the
  bookkeeping of transformers' ``generate``), so one document gives what ``generate`` gives.
- ``causal_sequence_generate``: RAG-Sequence. Each document's prompt is decoded on its own (the
  same loops with one document), then "thorough" scores every distinct candidate under every
  document, and "fast" only under the documents whose search produced it (-inf elsewhere); both
  rank by log p(y|x) = logsumexp_z [log p(z|x) + log p(y|x,z)]. Scoring reuses the prefill cache,
  so only answer tokens run again; "fast" with greedy search runs none: a reply's log p(y|x,z) is the sum
  its search took while choosing it.
- ``causal_span_scores``: the same log p(y|x), either marginalisation, of answers given from outside
  (a reply and its passages' spans: span choice, :mod:`rag_core.model.rag_model`), all of a question's
  candidates in one row per document behind the prompt's cache.

Sequences returned start with a placeholder column (``pad``, standing where a seq2seq decoder's
start token stands), then the answer tokens, pad after the first stop token. Call in eval mode.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor

from rag_core.model.decoding import (
    SequenceHypotheses,
    _beam_search,
    _check_inputs,
    _greedy,
    _pad_after_eos,
    _resolve,
    _select,
    _token_mask,
)
from rag_core.model.generators import positions

__all__ = ["Prefill", "causal_sequence_generate", "causal_span_scores", "causal_token_generate"]


class Prefill:
    """Every prompt run once: its cache, mask, next position and the first answer token's log-probs. Decoding
    and span scoring only read it (each takes its own copies of cache rows), so one serves both."""

    def __init__(self, model, input_ids: Tensor, mask: Tensor) -> None:
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions(mask), use_cache=True,
                    logits_to_keep=1)
        self.cache, self.mask = out.cache, mask  # cache rows = prompts, [n, L]
        self.next_position = mask.long().sum(dim=1)  # [n]: position id of the first answer token
        self.first_logprobs = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # [n, V]

    def cache_rows(self, rows: Tensor):
        """A copy of the cache holding prompt ``rows[i]`` in row i (rows may repeat)."""
        cache = copy.copy(self.cache)
        cache.layers = [copy.copy(layer) for layer in self.cache.layers]
        cache.batch_select_indices(rows)  # indexes each layer's tensors: new tensors, the prefill's stay
        return cache


class _MarginalStepper:
    """``decoding``'s decoder interface over a prefill: steps every (example, beam, document) row."""

    def __init__(self, model, prefill: Prefill, prompt_rows: Tensor, doc_scores: Tensor, n_docs: int, beams: int):
        batch, self.device = doc_scores.shape[0], prompt_rows.device
        rows = prompt_rows.view(batch, 1, n_docs).expand(batch, beams, n_docs).reshape(-1)  # [batch*beams*n_docs]
        self.model, self.n_docs, self.started = model, n_docs, False
        self.cache, self.mask = prefill.cache_rows(rows), prefill.mask[rows]  # rows' caches, [R, L]
        self.position, self.first = prefill.next_position[rows], prefill.first_logprobs[rows]  # [R], [R, V]
        doc_logprobs = torch.log_softmax(doc_scores.float(), dim=1)  # [batch, n_docs]
        self.doc_logprobs = doc_logprobs.repeat_interleave(beams, dim=0)  # [batch * beams, n_docs]

    def next_logprobs(self, last_tokens: Tensor) -> Tensor:
        """[rows] last tokens -> [rows, V] log sum_z p(z|x) p(. | x, z, y_<t); the first call reads the prefill."""
        if not self.started:  # the placeholder start token is never fed
            self.started, logprobs = True, self.first  # [rows * n_docs, V]
        else:
            ids = last_tokens.repeat_interleave(self.n_docs).unsqueeze(1)  # [rows * n_docs, 1]
            self.mask = torch.cat([self.mask, torch.ones_like(ids)], dim=1)  # [rows * n_docs, L + t]
            out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=self.position.unsqueeze(1),
                             cache=self.cache, use_cache=True)
            self.position = self.position + 1
            logprobs = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # [rows * n_docs, V]
        logprobs = logprobs.view(-1, self.n_docs, logprobs.shape[-1])  # [rows, n_docs, V]
        return torch.logsumexp(logprobs + self.doc_logprobs.unsqueeze(-1), dim=1)  # [rows, V]

    def reorder(self, rows: Tensor) -> None:
        """Keep beam rows ``rows``; each beam's n_docs cache rows move together."""
        cache_rows = (rows.unsqueeze(1) * self.n_docs + torch.arange(self.n_docs, device=self.device)).reshape(-1)
        self.cache.reorder_cache(cache_rows)
        self.mask, self.position = self.mask[cache_rows], self.position[cache_rows]
        if not self.started:
            self.first = self.first[cache_rows]

    def keep(self, rows: Tensor) -> None:
        """Step only rows ``rows`` (a subset, in order) from now on: the others have stopped."""
        self.reorder(rows)
        self.doc_logprobs = self.doc_logprobs[rows]  # [rows, n_docs]


def _config(model, settings: dict):
    settings = {"decoder_start_token_id": settings.get("pad_token_id", model.generation_config.pad_token_id),
                **settings}
    if settings["decoder_start_token_id"] is None:
        settings["decoder_start_token_id"] = 0
    config = _resolve(model, None, settings)
    config.forced_bos_token_id = None  # a placeholder stands at position 0; nothing is forced after it
    return config


@torch.no_grad()
def causal_token_generate(model, input_ids: Tensor, attention_mask: Tensor, doc_scores: Tensor, n_docs: int, *,
                          num_return_sequences: int = 1, prefill: Prefill | None = None, **settings) -> Tensor:
    """RAG-Token decoding; settings as in :func:`rag_core.model.decoding.rag_token_generate`.

    ``max_length`` counts the placeholder column (``max_new_tokens`` = answer tokens). ``prefill``: the
    prompts' :class:`Prefill`, when the caller made it (else made here).
    Returns ``[batch * num_return_sequences, T]``: placeholder, answer tokens, pad after the stop token.
    """
    mask = _check_inputs(input_ids, attention_mask, doc_scores, n_docs)
    config = _config(model, settings)
    if not 1 <= num_return_sequences <= config.num_beams:
        raise ValueError(f"num_return_sequences must be in [1, num_beams={config.num_beams}], "
                         f"got {num_return_sequences}")
    prefill = prefill or Prefill(model, input_ids, mask)
    prompt_rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    stepper = _MarginalStepper(model, prefill, prompt_rows, doc_scores, n_docs, config.num_beams)
    if config.num_beams == 1:
        return _pad_after_eos(_greedy(stepper, config, doc_scores.shape[0])[0], config)
    return _pad_after_eos(_beam_search(stepper, config, doc_scores.shape[0], num_return_sequences), config)


@torch.no_grad()
def causal_sequence_generate(model, input_ids: Tensor, attention_mask: Tensor, doc_scores: Tensor, n_docs: int, *,
                             mode: str = "thorough", num_return_sequences: int = 1, prefill: Prefill | None = None,
                             **settings) -> SequenceHypotheses:
    """RAG-Sequence decoding, ``mode`` "thorough" or "fast"; the best candidates and their log p(y|x).
    ``prefill`` as in :func:`causal_token_generate`."""
    mask = _check_inputs(input_ids, attention_mask, doc_scores, n_docs)
    if mode not in ("thorough", "fast"):
        raise ValueError(f"mode must be 'thorough' or 'fast', got {mode!r}")
    config = _config(model, settings)
    batch, beams, device = doc_scores.shape[0], config.num_beams, input_ids.device
    prefill = prefill or Prefill(model, input_ids, mask)
    prompts = torch.arange(batch * n_docs, device=device)  # [batch * n_docs]: every prompt on its own
    alone = torch.zeros(batch * n_docs, 1, device=device)  # one document each: p(z|x) = 1
    stepper = _MarginalStepper(model, prefill, prompts, alone, 1, beams)
    searched_ll = None  # [batch * n_docs]: each greedy search's own log p(y|x,z) (beam search: scored below)
    if beams == 1:
        outputs, searched_ll = _greedy(stepper, config, batch * n_docs)  # [batch * n_docs, T], [batch * n_docs]
    else:
        outputs = _beam_search(stepper, config, batch * n_docs, beams)  # [batch * n_docs * beams, T]
    outputs = _pad_after_eos(outputs, config)  # row r: document (r // beams) % n_docs of example r // (n * beams)
    doc_logprobs = torch.log_softmax(doc_scores.float(), dim=1)  # [batch, n_docs]
    found = []
    for b in range(batch):
        rows = outputs[b * n_docs * beams: (b + 1) * n_docs * beams]  # [n_docs * beams, T], doc-major
        keys = [tuple(tokens) for tokens in rows.tolist()]
        position = {key: i for i, key in enumerate(dict.fromkeys(keys))}  # first-occurrence order
        candidates = rows[[keys.index(key) for key in position]]  # [C, T]
        candidates = candidates[:, : 1 + int(_token_mask(candidates, config).sum(dim=1).max())]  # [C, T_b]
        if mode == "thorough":  # every candidate under every document
            cand = torch.arange(len(position), device=device).repeat_interleave(n_docs)  # [C * n_docs]
            docs = torch.arange(n_docs, device=device).repeat(len(position))  # [C * n_docs]
        else:  # each candidate under the documents whose search produced it
            cand = torch.tensor([position[key] for key in keys], device=device)  # [n_docs * beams]
            docs = torch.arange(n_docs * beams, device=device) // beams  # [n_docs * beams]
        if mode == "fast" and searched_ll is not None:  # a document's greedy reply, scored as it was searched
            ll = searched_ll[b * n_docs + docs]  # [pairs]
        else:
            ll = _score(model, prefill, b * n_docs + docs, candidates[cand], config)  # [pairs]
        seq_ll = torch.full((len(position), n_docs), -torch.inf, device=device)  # [C, n_docs]
        seq_ll[cand, docs] = ll
        found.append((candidates, torch.logsumexp(seq_ll + doc_logprobs[b], dim=1)))  # [C, T_b], [C]
    return _select(found, num_return_sequences, config)


def _score(model, prefill: Prefill, prompt_rows: Tensor, sequences: Tensor, config) -> Tensor:
    """log p(y | prompt) of each (prompt row, sequence) pair, from the prefill cache: ``[pairs]``."""
    answer = sequences[:, 1:]  # [pairs, T - 1]: without the placeholder
    token_ll = prefill.first_logprobs[prompt_rows].gather(1, answer[:, :1])  # [pairs, 1]: the first token
    if answer.shape[1] > 1:
        feed = answer[:, :-1]  # [pairs, T - 2]: each predicts the next answer token
        mask = torch.cat([prefill.mask[prompt_rows], torch.ones_like(feed)], dim=1)  # [pairs, L + T - 2]
        pos = prefill.next_position[prompt_rows].unsqueeze(1) + torch.arange(feed.shape[1], device=feed.device)
        logits = model(input_ids=feed, attention_mask=mask, position_ids=pos, cache=prefill.cache_rows(prompt_rows),
                       use_cache=True).logits  # [pairs, T - 2, V]
        rest = torch.log_softmax(logits.float(), dim=-1).gather(-1, answer[:, 1:].unsqueeze(-1)).squeeze(-1)
        token_ll = torch.cat([token_ll, rest], dim=1)  # [pairs, T - 1]
    return token_ll.masked_fill(~_token_mask(sequences, config), 0.0).sum(dim=1)  # [pairs]


@torch.no_grad()
def causal_span_scores(model, input_ids: Tensor, attention_mask: Tensor, doc_scores: Tensor, n_docs: int,
                       candidates: Sequence[Sequence[Sequence[int]]], *, kind: str = "sequence", keep: int = 64,
                       always: int = 0, prefill: Prefill | None = None) -> list[tuple[list[int], Tensor]]:
    """RAG's log p(y|x) of given answers: per question, its ``candidates`` (token lists, each ending with its
    stop token) scored under every document, marginalised as ``kind`` says -- "sequence":
    logsumexp_z [log p(z|x) + log p(y|x,z)]; "token": sum_t logsumexp_z [log p(z|x) + log p(y_t|x,z,y_<t)].

    Only the ``keep`` candidates whose first token is likeliest under the marginal are scored in full (a
    passage has hundreds of spans; the one a reader would say starts with a token the generator already
    favours); the first ``always`` of each question's candidates are scored whatever their first token. Each
    prompt runs once (``prefill`` as in :func:`causal_token_generate`), and all of a question's candidates then
    run in one row per document (:func:`_packed_token_scores`). Returns per question the indices of the
    candidates scored, in their order, and their scores ``[kept]`` (none: empty).
    """
    mask = _check_inputs(input_ids, attention_mask, doc_scores, n_docs)
    if kind not in ("sequence", "token"):
        raise ValueError(f"kind must be 'sequence' or 'token', got {kind!r}")
    if len(candidates) != doc_scores.shape[0]:
        raise ValueError(f"candidates: one list per question ({doc_scores.shape[0]}), got {len(candidates)}")
    device = input_ids.device
    prefill = prefill or Prefill(model, input_ids, mask)
    doc_logprobs = torch.log_softmax(doc_scores.float(), dim=1)  # [batch, n_docs]
    found = []
    for b, rows in enumerate(candidates):
        if not rows:
            found.append(([], torch.zeros(0, device=device)))
            continue
        prompts = b * n_docs + torch.arange(n_docs, device=device)  # [n_docs]
        firsts = torch.tensor([row[0] for row in rows], device=device)  # [C]
        first = torch.logsumexp(prefill.first_logprobs[prompts][:, firsts] + doc_logprobs[b, :, None], dim=0)
        first[:always] = torch.inf
        kept = sorted(first.topk(min(keep, len(rows))).indices.tolist())  # [K], in the candidates' order
        ll = _packed_token_scores(model, prefill, prompts, [rows[k] for k in kept])  # [n_docs, K, T]
        if kind == "sequence":
            scores = torch.logsumexp(ll.sum(dim=2) + doc_logprobs[b, :, None], dim=0)  # [K]
        else:  # past a candidate's end each mixture is sum_z p(z|x) = 1
            scores = torch.logsumexp(ll + doc_logprobs[b, :, None, None], dim=0).sum(dim=1)  # [K]
        found.append((kept, scores))
    return found


def _packed_token_scores(model, prefill: Prefill, prompt_rows: Tensor, rows: Sequence[Sequence[int]]) -> Tensor:
    """log p(y_t | prompt, y_<t) of each of ``rows`` (token lists) under each of ``prompt_rows``:
    ``[prompts, rows, T]``, 0 past a row's end.

    All rows ride in one sequence behind each prompt's cache, each token attending to the prompt and to
    its own row's earlier tokens only (a 4D mask; positions restart at the prompt's end for every row), so
    the cache is copied once per prompt, not once per row, and a row costs only its own tokens.
    """
    device = prefill.mask.device
    n, k, width = len(prompt_rows), len(rows), max(len(row) for row in rows)
    scores = torch.zeros(n, k, width, device=device)
    scores[:, :, 0] = prefill.first_logprobs[prompt_rows][:, [row[0] for row in rows]]  # [n, k]
    owner = torch.tensor([r for r, row in enumerate(rows) for _ in row[1:]], device=device, dtype=torch.long)
    if not len(owner):
        return scores
    step = torch.tensor([t for row in rows for t in range(len(row) - 1)], device=device)  # [W]
    feed = torch.tensor([token for row in rows for token in row[:-1]], device=device)  # [W]: predicts the next
    target = torch.tensor([token for row in rows for token in row[1:]], device=device)  # [W]
    own = (owner[:, None] == owner[None, :]) & (step[None, :] <= step[:, None])  # [W, W]
    prompt = prefill.mask[prompt_rows].bool()[:, None, :].expand(n, len(feed), -1)  # [n, W, L]
    allowed = torch.cat([prompt, own.expand(n, -1, -1)], dim=2)[:, None]  # [n, 1, W, L + W]
    if getattr(model.config, "_attn_implementation", "sdpa") == "eager":  # eager adds its mask to the scores
        allowed = torch.zeros(allowed.shape, device=device).masked_fill(~allowed, torch.finfo(torch.float32).min)
    position = prefill.next_position[prompt_rows][:, None] + step[None, :]  # [n, W]
    logits = model(input_ids=feed.expand(n, -1), attention_mask=allowed, position_ids=position,
                   cache=prefill.cache_rows(prompt_rows), use_cache=True).logits  # [n, W, V]
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, target.expand(n, -1)[..., None])[..., 0]
    scores[:, owner, step + 1] = logprobs  # [n, W] into [n, k, width]
    return scores
