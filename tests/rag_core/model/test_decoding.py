"""Tests for rag_core.model.decoding.

References:
- transformers' RagTokenForGeneration.generate (greedy and beam search) and
  RagSequenceForGeneration.generate (thorough decoding), built around the same
  tiny random BART generator, with no retriever (contexts and doc scores passed
  in); its get_nll for the RAG-Sequence scores;
- the plain generator's ``generate`` for one document (BART, T5, a BERT2BERT
  EncoderDecoderModel);
- each example decoded alone, without padding, for batches of padded contexts;
- a float64 brute force (one forward per candidate and document) for log p(y|x);
- thorough decoding for fast decoding (agreement rate, score bounds, call counts).

The reference's RAG-Token beam search is exact (its _reorder_cache moves each
beam's n_docs cache rows together), so beam search is compared with it directly.

The generator uses init_std=0.5 (with the default 0.02 the output barely depends
on the context) and a -1e4 bias on the pad token, which it then never emits
(the reference ignores pad ids inside a candidate when it scores it; we do not).
RAG-Sequence comparisons use unpadded contexts (the reference drops the
attention mask for per-document beams) and min_length=2 (the reference adds the
document prior at target position 1, so 1-token answers lose it), with n_docs =
the reference's config.n_docs (its scoring forward pass ignores the n_docs argument).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rag_core.model.decoding import rag_sequence_generate, rag_token_generate

VOCAB = 48
PAD, BOS, EOS = 1, 0, 2  # BartConfig's defaults; decoder_start_token_id is EOS too
LENGTH = 7  # context tokens


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny models on a shared 2-core machine: more threads only add contention.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models():
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        DPRConfig,
        DPRQuestionEncoder,
        RagConfig,
        RagSequenceForGeneration,
        RagTokenForGeneration,
    )
    from transformers.utils import logging

    logging.set_verbosity_error()
    question = DPRConfig(vocab_size=8, hidden_size=4, num_hidden_layers=1, num_attention_heads=1,
                         intermediate_size=4, max_position_embeddings=8)
    bart = BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                      decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                      max_position_embeddings=64, init_std=0.5)
    torch.manual_seed(0)
    generator = BartForConditionalGeneration(bart).eval()
    with torch.no_grad():
        generator.final_logits_bias[0, PAD] = -1e4
    config = RagConfig.from_question_encoder_generator_configs(question, bart, n_docs=3)
    kwargs = dict(config=config, question_encoder=DPRQuestionEncoder(question), generator=generator)
    return {"generator": generator, "token": RagTokenForGeneration(**kwargs).eval(),
            "sequence": RagSequenceForGeneration(**kwargs).eval()}


def make_inputs(seed, batch, n_docs, *, padded=False):
    """Random contexts (never PAD inside), their mask and doc scores; padded rows have ragged lengths."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch * n_docs, LENGTH), generator=gen)  # (batch * n_docs, L)
    mask = torch.ones_like(ids)
    if padded:
        lengths = torch.randint(2, LENGTH + 1, (batch * n_docs,), generator=gen)
        lengths[0] = LENGTH
        mask = (torch.arange(LENGTH).unsqueeze(0) < lengths.unsqueeze(1)).long()  # (batch * n_docs, L)
        ids = ids.masked_fill(mask == 0, PAD)
    return ids, mask, 2.0 * torch.randn(batch, n_docs, generator=gen)


def strip(sequences, pad=PAD):
    """Drop trailing columns that are pad in every row (outputs may differ only in such padding)."""
    keep = (sequences != pad).any(dim=0).nonzero()
    return sequences[:, : int(keep.max()) + 1] if keep.numel() else sequences[:, :1]


def assert_same_tokens(actual, expected):
    actual, expected = strip(actual), strip(expected)
    assert actual.shape == expected.shape and torch.equal(actual, expected), f"\n{actual}\n!=\n{expected}"


def answer_tokens(sequence):
    """The tokens after the decoder start, up to and including the first eos."""
    tokens = sequence[1:].tolist()
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


# ----------------------------------------------------------------------------- RAG-Token vs transformers


TOKEN_SETTINGS = {
    "defaults": dict(max_length=10),
    "min_length_forced_bos": dict(max_length=9, min_length=4, forced_bos_token_id=BOS),
    "no_forced_eos": dict(max_length=8, forced_eos_token_id=None),
}


@pytest.mark.parametrize("setting", list(TOKEN_SETTINGS))
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_token_greedy_matches_transformers(models, setting, padded, seed):
    ids, mask, scores = make_inputs(seed, 3, 3, padded=padded)
    settings = TOKEN_SETTINGS[setting]
    expected = models["token"].generate(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores,
                                        n_docs=3, num_beams=1, **settings)
    ours = rag_token_generate(models["generator"], ids, mask, scores, 3, num_beams=1, **settings)
    assert torch.equal(ours, expected)  # same width too: both stop when every row has finished


def test_token_greedy_rows_that_stop_early_leave_the_batch(models):
    """The stop token is one that row 0 picks at its second step: rows then stop at different steps, and each
    leaves the decoder when it does; the tokens are still transformers' own."""
    ids, mask, scores = make_inputs(11, 4, 3, padded=True)  # the mask is narrowed too
    free = rag_token_generate(models["generator"], ids, mask, scores, 3, num_beams=1, max_length=10,
                              forced_eos_token_id=None)
    stop = int(free[0, 2])
    settings = dict(num_beams=1, max_length=10, eos_token_id=stop, forced_eos_token_id=None)
    expected = models["token"].generate(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores,
                                        n_docs=3, **settings)
    ours = rag_token_generate(models["generator"], ids, mask, scores, 3, **settings)
    assert torch.equal(ours, expected)
    stopped_at = [row[1:].index(stop) if stop in row[1:] else None for row in ours.tolist()]
    assert stopped_at[0] == 1 and any(at != 1 for at in stopped_at), stopped_at  # one early, one later or never


BEAM_SETTINGS = {
    "beams2": dict(num_beams=2, max_length=10),
    "beams4_return2": dict(num_beams=4, num_return_sequences=2, max_length=10),
    "short_length_penalty": dict(num_beams=3, max_length=9, length_penalty=0.3, min_length=3),
    "early_stopping": dict(num_beams=3, max_length=10, early_stopping=True, forced_eos_token_id=None),
    "never_stop_early": dict(num_beams=3, max_length=10, early_stopping="never", length_penalty=2.0),
}


@pytest.mark.parametrize("setting", list(BEAM_SETTINGS))
@pytest.mark.parametrize("seed", range(3))
def test_token_beam_search_matches_transformers(models, setting, seed):
    # The reference's beam search is exact here (its _reorder_cache moves each beam's
    # n_docs cache rows together), so no brute-force stand-in is needed.
    ids, mask, scores = make_inputs(seed, 2, 3, padded=seed == 2)
    settings = dict(BEAM_SETTINGS[setting])
    expected = models["token"].generate(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores,
                                        n_docs=3, **settings)
    n_return = settings.pop("num_return_sequences", 1)
    ours = rag_token_generate(models["generator"], ids, mask, scores, 3, num_return_sequences=n_return, **settings)
    assert_same_tokens(ours, expected)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_token_one_doc_is_the_plain_generator(models, num_beams):
    ids, mask, scores = make_inputs(10, 4, 1, padded=True)
    expected = models["generator"].generate(ids, attention_mask=mask, num_beams=num_beams, max_length=10)
    ours = rag_token_generate(models["generator"], ids, mask, scores, 1, num_beams=num_beams, max_length=10)
    assert_same_tokens(ours, expected)


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(1)
    config = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1,
                      num_heads=2, initializer_factor=5.0, decoder_start_token_id=0)
    return T5ForConditionalGeneration(config).eval()


def _bert2bert():
    from transformers import BertConfig, BertLMHeadModel, BertModel, EncoderDecoderModel

    torch.manual_seed(2)
    common = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=32, initializer_range=0.5)
    decoder = BertLMHeadModel(BertConfig(is_decoder=True, add_cross_attention=True, **common))
    model = EncoderDecoderModel(encoder=BertModel(BertConfig(**common)), decoder=decoder)
    model.config.decoder_start_token_id, model.config.pad_token_id = 3, 0
    model.generation_config.update(decoder_start_token_id=3, eos_token_id=EOS, pad_token_id=0)
    return model.eval()


@pytest.mark.parametrize("build", [_t5, _bert2bert], ids=["t5", "bert2bert"])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_other_generators_one_doc(build, num_beams):
    model = build()
    ids, mask, scores = make_inputs(11, 3, 1, padded=True)
    ids = ids.masked_fill(mask == 0, model.generation_config.pad_token_id)
    expected = model.generate(ids, attention_mask=mask, num_beams=num_beams, max_length=8)
    ours = rag_token_generate(model, ids, mask, scores, 1, num_beams=num_beams, max_length=8)
    eos = model.generation_config.eos_token_id

    def answers(sequences):  # transformers fills finished T5 beams with eos (its pad id 0 is falsy), we with pad
        return [row[: row.index(eos) + 1] if eos in row else row for row in sequences.tolist()]

    assert answers(ours) == answers(expected)
    # RAG-Sequence over one document: the generator's best beam (up to padding).
    thorough = rag_sequence_generate(model, ids, mask, scores.view(3, 1), 1, num_beams=num_beams, max_length=8)
    assert thorough.sequences.shape[0] == 3 and torch.isfinite(thorough.scores).all()


# ----------------------------------------------------------------------------- RAG-Sequence vs transformers


@pytest.mark.parametrize(("num_beams", "n_return"), [(1, 1), (2, 1), (2, 3), (3, 1), (4, 2)])
@pytest.mark.parametrize("seed", range(3))
def test_sequence_thorough_matches_transformers(models, num_beams, n_return, seed):
    ids, mask, scores = make_inputs(seed, 2, 3)
    settings = dict(num_beams=num_beams, max_length=9, min_length=2)
    if seed == 2:
        settings["forced_bos_token_id"] = BOS  # every candidate starts with bos: its score is excluded
    expected = models["sequence"].generate(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores,
                                           n_docs=3, num_return_sequences=n_return, **settings)
    ours = rag_sequence_generate(models["generator"], ids, mask, scores, 3, num_return_sequences=n_return, **settings)
    assert_same_tokens(ours.sequences, expected)
    assert ours.scores.shape == (2 * n_return,) and torch.all(ours.scores.view(2, n_return).diff(dim=1) <= 0)


@pytest.mark.parametrize("forced_bos", [False, True])
def test_sequence_scores_match_transformers_get_nll(models, forced_bos):
    """Every candidate's log p(y|x) equals minus the reference's loss for it (labels = the candidates)."""
    n_docs, beams = 3, 3
    ids, mask, scores = make_inputs(20, 1, n_docs)
    settings = dict(num_beams=beams, max_length=9, min_length=2, forced_bos_token_id=BOS if forced_bos else None)
    everything = rag_sequence_generate(models["generator"], ids, mask, scores, n_docs,
                                       num_return_sequences=n_docs * beams, **settings)
    found = torch.isfinite(everything.scores)
    candidates = everything.sequences[found]  # (C, T)
    count = candidates.shape[0]
    assert count >= 2
    loss = models["sequence"](context_input_ids=ids.repeat(count, 1), context_attention_mask=mask.repeat(count, 1),
                              doc_scores=scores.repeat(count, 1), labels=candidates, exclude_bos_score=True,
                              n_docs=n_docs).loss  # (C,)
    torch.testing.assert_close(everything.scores[found], -loss, rtol=1e-5, atol=1e-5)


def test_sequence_scores_brute_force(models):
    """log p(y|x) = log sum_z p(z|x) prod_t p(y_t | x, z, y_<t), one (candidate, document) forward at a time."""
    generator, n_docs = models["generator"], 2
    ids, mask, scores = make_inputs(21, 1, n_docs, padded=True)
    result = rag_sequence_generate(generator, ids, mask, scores, n_docs, num_beams=2, num_return_sequences=4,
                                   max_length=8, min_length=2)
    prior = torch.softmax(scores[0].double(), dim=0)
    found = result.sequences[torch.isfinite(result.scores)]  # every candidate (2 documents x 2 beams at most)
    skip_bos = bool((found[:, 1] == BOS).all())  # the reference's exclude_bos_score rule
    for sequence, score in zip(result.sequences, result.scores):
        if not torch.isfinite(score):
            continue
        tokens = answer_tokens(sequence)
        likelihood = 0.0
        for z in range(n_docs):
            keep = mask[z].bool()
            with torch.no_grad():
                logits = generator(input_ids=ids[z, keep].unsqueeze(0),
                                   decoder_input_ids=sequence[: len(tokens)].unsqueeze(0)).logits[0]  # (T, vocab)
            probs = torch.softmax(logits.double(), dim=-1)
            likelihood += prior[z] * math.prod(float(probs[t, y]) for t, y in enumerate(tokens) if t or not skip_bos)
        assert math.isclose(float(score), math.log(likelihood), rel_tol=1e-4, abs_tol=1e-4)


def test_sequence_missing_candidates_are_pad_rows(models):
    """Fewer distinct candidates than num_return_sequences: the reference raises, we return -inf rows."""
    ids, mask, scores = make_inputs(22, 1, 3)  # n_docs = the reference's config.n_docs: its scoring pass ignores n_docs
    ids[1:] = ids[0]  # every document says the same: greedy gives one candidate
    with pytest.raises((IndexError, RuntimeError)):
        models["sequence"].generate(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores, n_docs=3,
                                    num_beams=1, num_return_sequences=2, max_length=8)
    results = {mode: rag_sequence_generate(models["generator"], ids, mask, scores, 3, mode=mode, num_beams=1,
                                           num_return_sequences=2, max_length=8) for mode in ("thorough", "fast")}
    for result in results.values():
        assert torch.isfinite(result.scores[0]) and result.scores[1] == -math.inf
        assert torch.all(result.sequences[1] == PAD)
    # one candidate that every document produced: fast and thorough scores agree
    torch.testing.assert_close(results["fast"].scores, results["thorough"].scores, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- fast vs thorough


def test_fast_agrees_with_thorough_on_most_inputs(models):
    """Top-1 agreement over 30 random questions (5 documents, 3 beams each); measured 29/30 here."""
    n_docs, beams, batch = 5, 3, 30
    ids, mask, scores = make_inputs(30, batch, n_docs)
    settings = dict(num_beams=beams, max_length=9, min_length=2)
    everything = n_docs * beams
    thorough = rag_sequence_generate(models["generator"], ids, mask, scores, n_docs, mode="thorough",
                                     num_return_sequences=everything, **settings)
    fast = rag_sequence_generate(models["generator"], ids, mask, scores, n_docs, mode="fast",
                                 num_return_sequences=everything, **settings)
    top_thorough = strip(thorough.sequences.view(batch, everything, -1)[:, 0])
    top_fast = strip(fast.sequences.view(batch, everything, -1)[:, 0])
    agreement = (top_thorough == top_fast).all(dim=1).float().mean().item()
    assert agreement >= 0.8, f"fast agrees with thorough on {agreement:.0%} of 30 inputs"

    # Same candidate sets; a fast score only drops documents, so it is <= the thorough one,
    # and equal when every document's beam produced the candidate.
    beam_outputs = models["generator"].generate(ids, attention_mask=mask, num_beams=beams,
                                                num_return_sequences=beams, max_length=9, min_length=2)
    beam_outputs = beam_outputs.view(batch, n_docs, beams, -1)
    for b in range(batch):
        rows = slice(b * everything, (b + 1) * everything)
        full = {tuple(answer_tokens(s)): float(v) for s, v in zip(thorough.sequences[rows], thorough.scores[rows])
                if math.isfinite(v)}
        approx = {tuple(answer_tokens(s)): float(v) for s, v in zip(fast.sequences[rows], fast.scores[rows])
                  if math.isfinite(v)}
        assert full.keys() == approx.keys()
        producers = {}
        for z in range(n_docs):
            for sequence in beam_outputs[b, z]:
                producers.setdefault(tuple(answer_tokens(sequence)), set()).add(z)
        assert approx.keys() == producers.keys()  # every output is some document's beam
        for key, value in approx.items():
            assert value <= full[key] + 1e-4
            if len(producers[key]) == n_docs:
                assert math.isclose(value, full[key], abs_tol=1e-4)


def test_fast_skips_the_scoring_passes(models):
    """Fast makes exactly the generator calls of the per-document beam search; thorough adds scoring passes."""
    generator = models["generator"]
    calls = []
    handle = generator.register_forward_hook(lambda *args: calls.append(1))
    try:
        ids, mask, scores = make_inputs(31, 2, 3)
        settings = dict(num_beams=2, max_length=8, min_length=2)
        generator.generate(ids, attention_mask=mask, num_return_sequences=2, **settings)
        plain, calls[:] = len(calls), []
        rag_sequence_generate(generator, ids, mask, scores, 3, mode="fast", **settings)
        fast, calls[:] = len(calls), []
        rag_sequence_generate(generator, ids, mask, scores, 3, mode="thorough", score_batch_size=4, **settings)
        thorough = len(calls)
    finally:
        handle.remove()
    assert fast == plain
    assert thorough >= plain + 2 * math.ceil(2 * 3 / 4)  # >= 2 candidates x 3 documents per example, 4 rows a pass


# ----------------------------------------------------------------------------- batches, padding, lengths


def _alone(ids, mask, scores, n_docs, b):
    rows = slice(b * n_docs, (b + 1) * n_docs)
    width = int(mask[rows].sum(dim=1).max())
    return ids[rows, :width], mask[rows, :width], scores[b : b + 1]


@pytest.mark.parametrize("mode", ["token-greedy", "token-beam", "thorough", "fast"])
def test_padded_batch_equals_each_example_alone(models, mode):
    n_docs, batch = 3, 4
    ids, mask, scores = make_inputs(40, batch, n_docs)
    lengths = torch.tensor([7, 4, 5, 3]).repeat_interleave(n_docs)  # one length per example: alone = unpadded
    mask = (torch.arange(LENGTH).unsqueeze(0) < lengths.unsqueeze(1)).long()
    ids = ids.masked_fill(mask == 0, PAD)
    generator = models["generator"]

    def run(i, m, s):
        if mode.startswith("token"):
            beams = 1 if mode == "token-greedy" else 3
            return rag_token_generate(generator, i, m, s, n_docs, num_beams=beams, max_length=9), None
        result = rag_sequence_generate(generator, i, m, s, n_docs, mode=mode, num_beams=2, num_return_sequences=2,
                                       max_length=9, min_length=2)
        return result.sequences, result.scores

    together, together_scores = run(ids, mask, scores)
    per_example = together.shape[0] // batch
    for b in range(batch):
        i, m, s = _alone(ids, mask, scores, n_docs, b)
        assert (m == 1).all()
        alone, alone_scores = run(i, m, s)
        assert_same_tokens(together[b * per_example : (b + 1) * per_example], alone)
        if alone_scores is not None:
            torch.testing.assert_close(together_scores[b * per_example : (b + 1) * per_example], alone_scores,
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_eos_and_length_limits(models, num_beams):
    ids, mask, scores = make_inputs(50, 6, 2)
    out = rag_token_generate(models["generator"], ids, mask, scores, 2, num_beams=num_beams, max_length=7,
                             min_length=4, forced_eos_token_id=None)
    assert out.shape[1] <= 7 and torch.all(out[:, 0] == EOS)  # BART's decoder start is its eos
    for row in out.tolist():
        answer = row[1:]
        if EOS in answer:
            first = answer.index(EOS) + 1  # position in the row
            assert first >= 4, "min_length=4: no eos before position 4"
            assert all(t == PAD for t in row[first + 1 :])
        else:
            assert len(row) == 7 and PAD not in row
    same = rag_token_generate(models["generator"], ids, mask, scores, 2, num_beams=num_beams, max_new_tokens=6,
                              min_length=4, forced_eos_token_id=None)
    assert torch.equal(out, same)
    forced = rag_token_generate(models["generator"], ids, mask, scores, 2, num_beams=num_beams, max_length=5)
    assert forced.shape[1] <= 5 and all(EOS in row[1:] for row in forced.tolist())  # forced eos at the last step


def test_generation_config_argument(models):
    from transformers import GenerationConfig

    ids, mask, scores = make_inputs(51, 2, 2)
    config = GenerationConfig(max_length=6, decoder_start_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    ours = rag_token_generate(models["generator"], ids, mask, scores, 2, generation_config=config)
    # the passed config replaces the generator's: no forced eos here
    assert torch.equal(ours, rag_token_generate(models["generator"], ids, mask, scores, 2, max_length=6,
                                                forced_eos_token_id=None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rag_sequence_generate(models["generator"], ids, mask, scores, 2, generation_config=config)


# ----------------------------------------------------------------------------- input checking


def _bad_token(**changes):
    ids, mask, scores = make_inputs(0, 2, 3)
    args = dict(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores, n_docs=3)
    args.update(changes)
    return args


BAD_INPUTS = {  # case: (arguments, message pattern)
    "scores_1d": (_bad_token(doc_scores=torch.zeros(6)),
                  r"doc_scores must have shape \(batch, n_docs\) = \(batch, 3\)"),
    "scores_n_docs": (_bad_token(doc_scores=torch.zeros(2, 2)), r"doc_scores must have shape"),
    "context_rows": (_bad_token(context_input_ids=torch.ones(5, LENGTH, dtype=torch.long)),
                     r"context_input_ids must have shape \(batch \* n_docs, L\) with 2 \* 3 = 6 rows"),
    "mask_shape": (_bad_token(context_attention_mask=torch.ones(6, 3)), r"context_attention_mask must have the shape"),
    "n_docs_zero": (_bad_token(n_docs=0), r"n_docs must be a positive int"),
    "unknown_setting": (_bad_token(temperature=0.7), r"unsupported decoding settings \['temperature'\]"),
    "max_length": (_bad_token(max_length=1), r"max_length must be >= 2"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.parametrize("function", [rag_token_generate, rag_sequence_generate])
def test_bad_inputs_raise(models, case, function):
    args, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        function(models["generator"], **args)


def test_bad_mode_and_counts_raise(models):
    generator = models["generator"]
    with pytest.raises(ValueError, match=r"num_return_sequences must be in \[1, num_beams=2\]"):
        rag_token_generate(generator, **_bad_token(num_beams=2, num_return_sequences=3))
    with pytest.raises(ValueError, match=r"mode must be 'thorough' or 'fast'"):
        rag_sequence_generate(generator, **_bad_token(mode="exact"))
    with pytest.raises(ValueError, match=r"does not implement no_repeat_ngram_size=2"):
        rag_token_generate(generator, **_bad_token(), generation_config=_config(no_repeat_ngram_size=2))


def _config(**fields):
    from transformers import GenerationConfig

    return GenerationConfig(decoder_start_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD, **fields)
