"""RAG decoding: answers from a seq2seq generator and the documents retrieved for each question.

Free functions over tensors; retrieval has already happened: the caller passes the
generator inputs of every (document, question) pair and the raw doc scores. Modes
(Lewis et al., 2020, section 2.4), with p(z|x) = softmax(doc_scores):

- ``rag_token_generate(num_beams=1)``: greedy decoding of the marginal next-token
  distribution p(y_t | x, y_<t) = sum_z p(z|x) p(y_t | x, z, y_<t);
- ``rag_token_generate(num_beams=k)``: beam search over that same distribution;
- ``rag_sequence_generate(mode="thorough")``: a beam search per document, then every
  distinct candidate y is scored under every document (extra decoder passes) and
  ranked by log p(y|x) = logsumexp_z [log p(z|x) + log p(y|x,z)];
- ``rag_sequence_generate(mode="fast")``: the same candidates, with p(y|x,z) taken
  from document z's beam search and 0 where z's beam did not produce y.

Settings come from ``generator.generation_config`` (or a ``generation_config``),
overridden by keyword arguments named as in transformers (``_SETTINGS``). Greedy and
beam search follow transformers' ``generate`` step for step (same constraints, same
beam bookkeeping), so outputs equal ``RagTokenForGeneration.generate`` and, in
thorough mode, ``RagSequenceForGeneration.generate`` on unpadded contexts.
Deliberate differences from that reference: the context attention mask is always
used; candidates are always deduplicated; the document prior enters a sequence's
score once (the reference adds it at target position 1, which 1-token answers
lack); tokens after the first eos are padding (not pad ids inside an answer);
when there are fewer distinct candidates than ``num_return_sequences`` the missing
rows are pad with score -inf (the reference raises). Call in eval mode.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import GenerationConfig
from transformers.modeling_outputs import BaseModelOutput

__all__ = ["SequenceHypotheses", "rag_sequence_generate", "rag_token_generate"]

_SETTINGS = {"max_length", "max_new_tokens", "min_length", "num_beams", "length_penalty", "early_stopping",
             "decoder_start_token_id", "bos_token_id", "eos_token_id", "pad_token_id",
             "forced_bos_token_id", "forced_eos_token_id"}
# generation_config fields that change token scores and that RAG-Token decoding does not implement
_UNSUPPORTED = ("do_sample", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "repetition_penalty",
                "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "min_new_tokens")


@dataclass(frozen=True)
class SequenceHypotheses:
    """RAG-Sequence answers: the best ``num_return_sequences`` per question, best first."""

    sequences: Tensor  # (batch * num_return_sequences, T): decoder start first, pad after eos
    scores: Tensor  # (batch * num_return_sequences,) log p(y|x); -inf for a missing candidate


@torch.no_grad()
def rag_token_generate(generator, context_input_ids: Tensor, context_attention_mask: Tensor | None,
                       doc_scores: Tensor, n_docs: int, *, num_return_sequences: int = 1,
                       generation_config: GenerationConfig | None = None, **settings) -> Tensor:
    """RAG-Token decoding: greedy (num_beams=1) or beam search over the marginal next-token distribution.

    Args:
        generator: a transformers encoder-decoder model (BART, T5, EncoderDecoderModel).
        context_input_ids: (batch * n_docs, L) generator inputs; the n_docs rows of an example are contiguous.
        context_attention_mask: (batch * n_docs, L), or None for no padding.
        doc_scores: (batch, n_docs) raw retrieval scores (softmax taken here).
        n_docs: documents per example.
        num_return_sequences: best beams returned per example (at most num_beams).
        generation_config, settings: see the module docstring.

    Returns:
        (batch * num_return_sequences, T) token ids starting with the decoder start token, pad after eos.
    """
    mask = _check_inputs(context_input_ids, context_attention_mask, doc_scores, n_docs)
    config = _resolve(generator, generation_config, settings)
    defaults = GenerationConfig._get_default_generation_params()
    unsupported = [f"{name}={getattr(config, name)!r}" for name in _UNSUPPORTED
                   if getattr(config, name) not in (None, defaults.get(name))]
    if unsupported:
        raise ValueError(f"rag_token_generate does not implement {', '.join(unsupported)}: "
                         "pass a generation_config without them")
    if not 1 <= num_return_sequences <= config.num_beams:
        raise ValueError(f"num_return_sequences must be in [1, num_beams={config.num_beams}], "
                         f"got {num_return_sequences}")
    decoder = _MarginalDecoder(generator, context_input_ids, mask, doc_scores, n_docs, config.num_beams)
    if config.num_beams == 1:
        return _greedy(decoder, config, doc_scores.shape[0])[0]
    return _beam_search(decoder, config, doc_scores.shape[0], num_return_sequences)


@torch.no_grad()
def rag_sequence_generate(generator, context_input_ids: Tensor, context_attention_mask: Tensor | None,
                          doc_scores: Tensor, n_docs: int, *, mode: str = "thorough",
                          num_return_sequences: int = 1, score_batch_size: int = 256,
                          generation_config: GenerationConfig | None = None, **settings) -> SequenceHypotheses:
    """RAG-Sequence decoding, ``mode`` "thorough" or "fast" (see the module docstring).

    Arguments as for :func:`rag_token_generate`; ``num_return_sequences`` may reach n_docs * num_beams;
    ``score_batch_size`` caps the (candidate, document) rows of one scoring pass (thorough mode).
    """
    mask = _check_inputs(context_input_ids, context_attention_mask, doc_scores, n_docs)
    if mode not in ("thorough", "fast"):
        raise ValueError(f"mode must be 'thorough' or 'fast', got {mode!r}")
    if num_return_sequences < 1 or score_batch_size < 1:
        raise ValueError("num_return_sequences and score_batch_size must be >= 1, "
                         f"got {num_return_sequences} and {score_batch_size}")
    config = _resolve(generator, generation_config, settings)
    batch, beams, fast, device = doc_scores.shape[0], config.num_beams, mode == "fast", context_input_ids.device
    hidden = generator.get_encoder()(input_ids=context_input_ids, attention_mask=mask)[0]
    per_doc = copy.deepcopy(config)  # (batch * n_docs, L, d) hidden states, shared with the scoring passes
    per_doc.update(num_return_sequences=beams, return_dict_in_generate=True, output_logits=fast)
    out = generator.generate(input_ids=context_input_ids, attention_mask=mask, generation_config=per_doc,
                             encoder_outputs=BaseModelOutput(last_hidden_state=hidden))
    beam_outputs = _pad_after_eos(out.sequences, config)  # (batch * n_docs * beams, T), doc-major per example
    token_mask = _token_mask(beam_outputs, config)  # (batch * n_docs * beams, T - 1)
    if fast:  # per-token log p(y_t | x, z, y_<t) along each beam, from the logits generate already computed
        steps = generator.compute_transition_scores(out.sequences, out.logits, getattr(out, "beam_indices", None),
                                                    normalize_logits=True)  # (batch * n_docs * beams, <= T - 1)
        token_ll = torch.zeros(token_mask.shape, dtype=steps.dtype, device=device)  # (rows, T - 1)
        token_ll[:, : steps.shape[1]] = steps
    doc_logprobs = torch.log_softmax(doc_scores.float(), dim=1).to(device)  # (batch, n_docs)
    found = []  # per example: distinct candidates (C, T_b) and log p(y|x) (C,)
    for b in range(batch):
        rows = slice(b * n_docs * beams, (b + 1) * n_docs * beams)
        outputs = beam_outputs[rows]  # (n_docs * beams, T); row r comes from document r // beams
        keys = [tuple(tokens) for tokens in outputs.tolist()]
        position = {key: i for i, key in enumerate(dict.fromkeys(keys))}  # first-occurrence order
        candidates = outputs[[keys.index(key) for key in position]]  # (C, T)
        candidates = candidates[:, : 1 + int(_token_mask(candidates, config).sum(dim=1).max())]  # (C, T_b)
        if fast:
            beam_ll = _sum_ll(token_ll[rows], token_mask[rows], outputs, config)  # (n_docs * beams,)
            seq_ll = torch.full((len(position), n_docs), -torch.inf, device=device)  # (C, n_docs): -inf = unseen
            seq_ll[[position[key] for key in keys], torch.arange(n_docs * beams, device=device) // beams] = beam_ll
        else:
            docs = slice(b * n_docs, (b + 1) * n_docs)
            seq_ll = _score_candidates(generator, hidden[docs], mask[docs], candidates, config, score_batch_size)
        found.append((candidates, torch.logsumexp(seq_ll + doc_logprobs[b], dim=1)))  # (C, T_b), (C,)
    return _select(found, num_return_sequences, config)


class _MarginalDecoder:
    """Steps the generator's decoder for every (example, beam, document) row and marginalises over documents."""

    def __init__(self, generator, context_input_ids, mask, doc_scores, n_docs, beams):
        batch, self.device = doc_scores.shape[0], context_input_ids.device
        hidden = generator.get_encoder()(input_ids=context_input_ids, attention_mask=mask)[0]
        rows = torch.arange(batch * n_docs, device=self.device).view(batch, 1, n_docs)  # (batch, 1, n_docs)
        rows = rows.expand(batch, beams, n_docs).reshape(-1)  # (batch * beams * n_docs,) example-beam-doc order
        self.encoder_outputs = BaseModelOutput(last_hidden_state=hidden[rows])  # (batch * beams * n_docs, L, d)
        self.mask = mask[rows]  # (batch * beams * n_docs, L)
        doc_logprobs = torch.log_softmax(doc_scores.to(self.device), dim=1)  # (batch, n_docs)
        self.doc_logprobs = doc_logprobs.repeat_interleave(beams, dim=0)  # (batch * beams, n_docs)
        self.generator, self.n_docs, self.cache = generator, n_docs, None

    def next_logprobs(self, last_tokens: Tensor) -> Tensor:
        """(rows,) last tokens -> (rows, vocab) log sum_z p(z|x) p(. | x, z, y_<t)."""
        decoder_input_ids = last_tokens.repeat_interleave(self.n_docs).unsqueeze(1)  # (rows * n_docs, 1)
        out = self.generator(encoder_outputs=self.encoder_outputs, attention_mask=self.mask,
                             decoder_input_ids=decoder_input_ids, cache=self.cache, use_cache=True)
        self.cache = out.cache
        logprobs = torch.log_softmax(out.logits[:, -1], dim=-1)  # (rows * n_docs, vocab)
        logprobs = logprobs.view(-1, self.n_docs, logprobs.shape[-1])  # (rows, n_docs, vocab)
        return torch.logsumexp(logprobs + self.doc_logprobs.unsqueeze(-1), dim=1).float()  # (rows, vocab)

    def reorder(self, rows: Tensor) -> None:
        """Keep the decoder states of beam rows ``rows``; each beam's n_docs cache rows move together."""
        cache_rows = rows.unsqueeze(1) * self.n_docs + torch.arange(self.n_docs, device=self.device)  # (rows, n_docs)
        self.cache.reorder_cache(cache_rows.reshape(-1))  # (rows * n_docs,)

    def keep(self, rows: Tensor) -> None:
        """Step only rows ``rows`` (a subset, in order) from now on: the others have stopped."""
        self.reorder(rows)
        cache_rows = (rows.unsqueeze(1) * self.n_docs + torch.arange(self.n_docs, device=self.device)).reshape(-1)
        hidden = self.encoder_outputs.last_hidden_state[cache_rows]  # (rows * n_docs, L, d)
        self.encoder_outputs, self.mask = BaseModelOutput(last_hidden_state=hidden), self.mask[cache_rows]
        self.doc_logprobs = self.doc_logprobs[rows]  # (rows, n_docs)


def _greedy(decoder: _MarginalDecoder, config: GenerationConfig, batch: int) -> tuple[Tensor, Tensor]:
    """transformers' greedy search (GenerationMixin._sample without sampling), stepping ``decoder``; the tokens
    ``(batch, T)`` and each row's summed log-prob of its answer tokens, its stop token included ``(batch,)`` (the
    raw log-probs, before any forced token or minimum length, as the scoring passes sum them).

    A row that has stopped leaves the decoder (:meth:`_MarginalDecoder.keep`): one long reply does not keep every
    other row of its batch stepping to ``max_length``, and a step with few rows left costs a fraction of a full one."""
    device = decoder.device
    tokens = torch.full((batch, 1), config.decoder_start_token_id, device=device)  # (batch, 1)
    eos = torch.tensor(config.eos_token_id, device=device)
    running = torch.arange(batch, device=device)  # the rows still in the decoder, in its row order
    total = torch.zeros(batch, device=device)  # (batch,)
    while True:
        logprobs = decoder.next_logprobs(tokens[running, -1])  # (running, vocab)
        picked = _constrain(logprobs.clone(), tokens.shape[1], config).argmax(dim=-1)  # (running,)
        total[running] += logprobs.gather(1, picked.unsqueeze(1)).squeeze(1)  # float32, as the decoders return
        next_tokens = torch.full((batch,), config.pad_token_id, dtype=tokens.dtype, device=device)
        next_tokens[running] = picked
        tokens = torch.cat([tokens, next_tokens.unsqueeze(1)], dim=1)  # (batch, t + 1)
        going = ~torch.isin(picked, eos)  # (running,)
        if not going.any() or tokens.shape[1] >= config.max_length:
            return tokens, total
        if not going.all():
            decoder.keep(going.nonzero().squeeze(1))
            running = running[going]


def _beam_search(decoder: _MarginalDecoder, config: GenerationConfig, batch: int, n_return: int) -> Tensor:
    """transformers' vectorised beam search (GenerationMixin._beam_search), stepping ``decoder``."""
    beams, length, penalty, stop = config.num_beams, config.max_length, config.length_penalty, config.early_stopping
    device = decoder.device
    eos = torch.tensor(config.eos_token_id, device=device)
    keep = max(2, 1 + eos.numel()) * beams  # candidates kept per step, so that `beams` stay unfinished
    running = torch.full((batch, beams, length), config.pad_token_id, device=device)  # (batch, beams, T)
    running[:, :, 0] = config.decoder_start_token_id
    running_scores = torch.zeros(batch, beams, device=device)  # (batch, beams); copies of beam 0 start at -1e9
    running_scores[:, 1:] = -1e9
    done, done_scores = running.clone(), torch.full((batch, beams), -1e9, device=device)  # finished, best first
    done_flags = torch.zeros(batch, beams, dtype=torch.bool, device=device)
    done_lengths = torch.ones(batch, beams, dtype=torch.long, device=device)
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)
    batch_offsets = beams * torch.arange(batch, device=device).unsqueeze(1)  # (batch, 1)
    in_top = torch.arange(keep, device=device) < beams  # (keep,)
    cur = 1
    while True:
        logprobs = torch.log_softmax(decoder.next_logprobs(running[:, :, cur - 1].reshape(-1)), dim=-1)
        logprobs = _constrain(logprobs, cur, config)  # (batch * beams, vocab)
        vocab = logprobs.shape[-1]
        totals = logprobs.view(batch, beams, vocab) + running_scores.unsqueeze(-1)  # (batch, beams, vocab)
        top_scores, top_index = totals.view(batch, beams * vocab).topk(keep)  # (batch, keep)
        source, token = top_index // vocab, top_index % vocab  # (batch, keep)
        candidates = running.gather(1, source.unsqueeze(-1).expand(batch, keep, length)).clone()  # (batch, keep, T)
        candidates[:, :, cur] = token
        hits = torch.isin(token, eos) | (cur + 1 >= length)  # (batch, keep) finished with this token
        # the best `beams` unfinished candidates run on
        masked = top_scores - 1e9 * hits.float()  # (batch, keep)
        order = masked.topk(beams).indices  # (batch, beams)
        running = candidates.gather(1, order.unsqueeze(-1).expand(batch, beams, length))  # (batch, beams, T)
        running_scores = masked.gather(1, order)  # (batch, beams)
        decoder.reorder((source.gather(1, order) + batch_offsets).reshape(-1))  # (batch * beams,)
        # finished candidates among the top `beams` join the finished set if they beat its members
        new = hits & in_top  # (batch, keep)
        normed = top_scores / cur**penalty  # cur tokens generated, eos included
        normed = normed - 1e9 * (done_flags.all(dim=1, keepdim=True) & (stop is True)).float()
        normed = normed - 1e9 * (~improvable).float() - 1e9 * (~new).float()
        merged_scores = torch.cat([done_scores, normed], dim=1)  # (batch, beams + keep)
        best = merged_scores.topk(beams).indices  # (batch, beams)
        done = torch.cat([done, candidates], dim=1).gather(1, best.unsqueeze(-1).expand(batch, beams, length))
        done_scores = merged_scores.gather(1, best)  # (batch, beams)
        done_flags = torch.cat([done_flags, new], dim=1).gather(1, best)  # (batch, beams)
        done_lengths = torch.cat([done_lengths, torch.full_like(top_index, cur + 1)], dim=1).gather(1, best)
        cur += 1
        hypothetical = length - 1 if stop == "never" and penalty > 0.0 else cur - 1
        best_running = running_scores[:, :1] / hypothetical**penalty  # (batch, 1)
        worst_done = torch.where(done_flags, done_scores.min(dim=1, keepdim=True).values, -1e9)  # (batch, beams)
        improvable &= (best_running > worst_done).any(dim=1, keepdim=True)
        if not improvable.any() or (done_flags.all() and stop is True) or hits.all():
            break
    out_length = int(done_lengths[:, :n_return].max())
    return done[:, :n_return, :out_length].reshape(batch * n_return, out_length)  # (batch * n_return, T)


def _constrain(scores: Tensor, cur_len: int, config: GenerationConfig) -> Tensor:
    """transformers' min-length, forced-BOS and forced-EOS logits processors, in its order."""
    if config.min_length and cur_len < config.min_length:
        scores[:, config.eos_token_id] = -torch.inf
    for forced, position in ((config.forced_bos_token_id, 1), (config.forced_eos_token_id, config.max_length - 1)):
        if forced is not None and cur_len == position:
            scores = torch.full_like(scores, -torch.inf)
            scores[:, forced] = 0.0
    return scores


def _score_candidates(generator, hidden, mask, candidates, config, score_batch_size) -> Tensor:
    """log p(y|x,z) of every candidate (C, T) under every document of one example: (C, n_docs)."""
    n_docs, count = hidden.shape[0], candidates.shape[0]
    docs = torch.arange(n_docs, device=hidden.device).repeat(count)  # (C * n_docs,) candidate-major
    inputs = candidates.repeat_interleave(n_docs, dim=0)  # (C * n_docs, T)
    token_ll = []
    for start in range(0, count * n_docs, score_batch_size):
        part = slice(start, start + score_batch_size)
        logits = generator(encoder_outputs=BaseModelOutput(last_hidden_state=hidden[docs[part]]),
                           attention_mask=mask[docs[part]], decoder_input_ids=inputs[part, :-1],
                           use_cache=False).logits  # (rows, T - 1, vocab)
        logprobs = torch.log_softmax(logits.float(), dim=-1)  # (rows, T - 1, vocab)
        token_ll.append(logprobs.gather(-1, inputs[part, 1:].unsqueeze(-1)).squeeze(-1))  # (rows, T - 1)
    seq_ll = _sum_ll(torch.cat(token_ll), _token_mask(inputs, config), candidates, config)  # (C * n_docs,)
    return seq_ll.view(count, n_docs)  # (C, n_docs)


def _sum_ll(token_ll: Tensor, token_mask: Tensor, example_rows: Tensor, config: GenerationConfig) -> Tensor:
    """Sum per-token log-probs (rows, T - 1) over answer tokens. As transformers' exclude_bos_score: a leading
    bos that every candidate of the example starts with (a forced BOS) is not scored."""
    if config.bos_token_id is not None and example_rows[:, 1].eq(config.bos_token_id).all():
        token_mask = token_mask.clone()
        token_mask[:, 0] = False
    return token_ll.masked_fill(~token_mask, 0.0).sum(dim=1)  # (rows,)


def _token_mask(sequences: Tensor, config: GenerationConfig) -> Tensor:
    """(rows, T) -> (rows, T - 1): which tokens after the decoder start are answer tokens (up to the first eos)."""
    is_eos = torch.isin(sequences[:, 1:], torch.tensor(config.eos_token_id, device=sequences.device)).long()
    return (is_eos.cumsum(dim=1) - is_eos) == 0  # (rows, T - 1)


def _pad_after_eos(sequences: Tensor, config: GenerationConfig) -> Tensor:
    keep = torch.cat([torch.ones_like(sequences[:, :1], dtype=torch.bool), _token_mask(sequences, config)], dim=1)
    return sequences.masked_fill(~keep, config.pad_token_id)  # (rows, T)


def _select(found: list[tuple[Tensor, Tensor]], n_return: int, config: GenerationConfig) -> SequenceHypotheses:
    """The best ``n_return`` candidates of each example, padded to one width."""
    picked = [(candidates[top.indices], top.values) for candidates, scores in found
              for top in [scores.topk(min(n_return, len(scores)))]]
    width = max(1 + int(_token_mask(c, config).sum(dim=1).max()) for c, _ in picked)
    device = picked[0][0].device
    sequences = torch.full((len(found) * n_return, width), config.pad_token_id, device=device)  # (batch * R, T)
    scores = torch.full((len(found) * n_return,), -torch.inf, device=device)  # (batch * R,)
    for b, (candidates, values) in enumerate(picked):
        rows = slice(b * n_return, b * n_return + len(values))
        sequences[rows, : min(width, candidates.shape[1])] = candidates[:, :width]
        scores[rows] = values
    return SequenceHypotheses(sequences, scores)


def _resolve(generator, generation_config: GenerationConfig | None, settings: dict) -> GenerationConfig:
    """The generation settings: ``generation_config`` or the generator's, then ``settings``, then defaults."""
    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise ValueError(f"unsupported decoding settings {unknown}; supported: {sorted(_SETTINGS)}")
    config = copy.deepcopy(generation_config or generator.generation_config)
    config.update(**settings)
    config.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    if config.max_new_tokens is not None:
        config.max_length, config.max_new_tokens = config.max_new_tokens + 1, None
    for name in ("decoder_start_token_id", "eos_token_id"):
        if getattr(config, name) is None:
            setattr(config, name, getattr(generator.config, name, None))
        if getattr(config, name) is None:
            raise ValueError(f"{name} is unset in the generator's generation_config and config: pass {name}=...")
    if isinstance(config.eos_token_id, int):
        config.eos_token_id = [config.eos_token_id]
    if config.pad_token_id is None:
        config.pad_token_id = config.eos_token_id[0]
    if config.max_length < 2:
        raise ValueError(f"max_length must be >= 2 (decoder start + one token), got {config.max_length}")
    return config


def _check_inputs(context_input_ids, context_attention_mask, doc_scores, n_docs) -> Tensor:
    """Validate shapes; return the attention mask (all ones when None)."""
    if isinstance(n_docs, bool) or not isinstance(n_docs, int) or n_docs < 1:
        raise ValueError(f"n_docs must be a positive int, got {n_docs!r}")
    if doc_scores.dim() != 2 or doc_scores.shape[1] != n_docs:
        raise ValueError(f"doc_scores must have shape (batch, n_docs) = (batch, {n_docs}), "
                         f"got {tuple(doc_scores.shape)}")
    batch = doc_scores.shape[0]
    if context_input_ids.dim() != 2 or context_input_ids.shape[0] != batch * n_docs:
        raise ValueError(f"context_input_ids must have shape (batch * n_docs, L) with {batch} * {n_docs} = "
                         f"{batch * n_docs} rows (batch from doc_scores), got {tuple(context_input_ids.shape)}")
    if context_attention_mask is None:
        return torch.ones_like(context_input_ids)
    if context_attention_mask.shape != context_input_ids.shape:
        raise ValueError("context_attention_mask must have the shape of context_input_ids "
                         f"{tuple(context_input_ids.shape)}, got {tuple(context_attention_mask.shape)}")
    return context_attention_mask
