"""Tests for rag_core.model.marginalize.

Three references:
- transformers' RagSequenceForGeneration.get_nll / RagTokenForGeneration.get_nll
  (values and gradients), with inputs built so that both label conventions
  describe the same quantity;
- a brute-force float64 computation with explicit loops over documents and
  positions (exp/log of probabilities, no logsumexp), for the math itself;
- torch.nn.functional.cross_entropy for n_docs = 1.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rag_core.model.marginalize import rag_sequence_nll, rag_token_nll

PAD = 1  # BartConfig's default pad_token_id, which the reference masks
DECODER_START = 2  # BartConfig's default decoder_start_token_id
VOCAB = 7
LENGTH = 5
BATCH = 4
SEEDS = [0, 1, 2]
N_DOCS = [1, 2, 5]
VARIANTS = {"sequence": rag_sequence_nll, "token": rag_token_nll}


# ----------------------------------------------------------------------------- helpers


def make_inputs(seed, n_docs, *, min_len=0, batch=BATCH, length=LENGTH, vocab=VOCAB, dtype=torch.float32):
    """Random logits/scores and a right-padded target with ragged lengths in [min_len, length].

    Row 0 always has the full length so every logit position is used.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_logits = (2.0 * torch.randn(batch * n_docs, length, vocab, generator=gen)).to(dtype)
    doc_scores = (2.0 * torch.randn(batch, n_docs, generator=gen)).to(dtype)
    tokens = torch.randint(0, vocab - 1, (batch, length), generator=gen)
    tokens = tokens + (tokens >= PAD).long()  # (batch, T), every id but PAD
    lengths = torch.randint(min_len, length + 1, (batch,), generator=gen)
    lengths[0] = length
    positions = torch.arange(length).unsqueeze(0)  # (1, T)
    target = torch.where(positions < lengths.unsqueeze(1), tokens, torch.full_like(tokens, PAD))
    return seq_logits, doc_scores, target


def loss_and_grads(fn, seq_logits, doc_scores, target, n_docs, epsilon=0.0, weights=None):
    """fn's loss and the gradients of (loss * weights).sum() wrt fresh copies of the inputs."""
    logits = seq_logits.detach().clone().requires_grad_(True)
    scores = doc_scores.detach().clone().requires_grad_(True)
    loss = fn(logits, scores, target, n_docs, PAD, epsilon)
    if weights is None:
        weights = torch.linspace(0.5, 1.5, loss.shape[0], dtype=loss.dtype)
    (loss * weights).sum().backward()
    return loss.detach(), logits.grad, scores.grad


def reference_fn(model):
    """Wrap transformers' get_nll in our calling convention.

    get_nll shifts its labels left and pads the last position with PAD, so
    ``labels = [DECODER_START, target...]`` (T + 1 tokens) gives it our target
    at positions 0..T-1, plus a PAD at position T whose logits are masked away:
    we append one dummy logit slice for it.
    """

    def call(seq_logits, doc_scores, target, n_docs, pad_token_id, epsilon):
        assert pad_token_id == model.config.generator.pad_token_id
        start = torch.full((target.shape[0], 1), DECODER_START, dtype=target.dtype)
        labels = torch.cat([start, target], dim=1)  # (batch, T + 1)
        dummy = torch.zeros(seq_logits.shape[0], 1, seq_logits.shape[2], dtype=seq_logits.dtype)
        ref_logits = torch.cat([seq_logits, dummy], dim=1)  # (batch * n_docs, T + 1, vocab)
        return model.get_nll(
            ref_logits, doc_scores, labels, reduce_loss=False, epsilon=epsilon, n_docs=n_docs
        )  # (batch,)

    return call


def brute_force(variant, seq_logits, doc_scores, target, n_docs, epsilon=0.0):
    """Textbook RAG losses in float64: explicit loops, probabilities via exp and log."""
    logits = seq_logits.double()
    scores = doc_scores.double()
    losses = []
    for b in range(target.shape[0]):
        weights = torch.exp(scores[b])
        prior = [weights[z] / weights.sum() for z in range(n_docs)]  # p(z|x)
        positions = [t for t in range(target.shape[1]) if int(target[b, t]) != PAD]
        if not positions:  # empty answer: defined as loss 0
            losses.append(torch.zeros((), dtype=torch.float64))
            continue

        def probs(z, t):  # p(. | x, z, y_<t) over the vocabulary
            e = torch.exp(logits[b * n_docs + z, t])
            return e / e.sum()

        vocab = logits.shape[-1]
        if variant == "sequence":
            likelihood = 0.0
            smooth_mass = 0.0
            for z in range(n_docs):
                answer_prob = prior[z]
                all_vocab_prob = prior[z] ** vocab
                for t in positions:
                    p = probs(z, t)
                    answer_prob = answer_prob * p[int(target[b, t])]
                    all_vocab_prob = all_vocab_prob * torch.prod(p)
                likelihood = likelihood + answer_prob
                smooth_mass = smooth_mass + all_vocab_prob
            nll = -torch.log(likelihood)
            smooth = -torch.log(smooth_mass)
        else:
            nll = 0.0
            smooth = 0.0
            for t in positions:
                marginal = sum(prior[z] * probs(z, t) for z in range(n_docs))  # q_t(.)
                nll = nll - torch.log(marginal[int(target[b, t])])
                smooth = smooth - torch.log(marginal).sum()
        losses.append((1.0 - epsilon) * nll + (epsilon / vocab) * smooth)
    return torch.stack(losses)


def brute_force_fn(variant):
    def call(seq_logits, doc_scores, target, n_docs, pad_token_id, epsilon):
        return brute_force(variant, seq_logits, doc_scores, target, n_docs, epsilon)

    return call


def assert_same(actual, expected, **tol):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e.to(a.dtype), **tol)


@pytest.fixture(scope="module")
def reference_models():
    from transformers import BartConfig, DPRConfig, RagConfig, RagSequenceForGeneration, RagTokenForGeneration

    question_encoder = DPRConfig(
        vocab_size=8, hidden_size=4, num_hidden_layers=1, num_attention_heads=1,
        intermediate_size=4, max_position_embeddings=8,
    )
    generator = BartConfig(
        vocab_size=VOCAB, d_model=4, encoder_layers=1, decoder_layers=1, encoder_attention_heads=1,
        decoder_attention_heads=1, encoder_ffn_dim=4, decoder_ffn_dim=4, max_position_embeddings=8,
    )
    config = RagConfig.from_question_encoder_generator_configs(question_encoder, generator, n_docs=2)
    assert config.generator.pad_token_id == PAD
    torch.manual_seed(0)
    return {
        "sequence": RagSequenceForGeneration(config=config).eval(),
        "token": RagTokenForGeneration(config=config).eval(),
    }


# ----------------------------------------------------------------------------- differential: transformers


@pytest.mark.parametrize("variant", ["sequence", "token"])
@pytest.mark.parametrize("n_docs", N_DOCS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_matches_transformers_get_nll(reference_models, variant, n_docs, seed, epsilon):
    # RAG-Sequence: the reference adds the prior at target position 1, so keep
    # every answer at least 2 tokens long (see test_reference_sequence_quirks).
    min_len = 2 if variant == "sequence" else 0
    inputs = make_inputs(seed, n_docs, min_len=min_len)
    ours = loss_and_grads(VARIANTS[variant], *inputs, n_docs, epsilon)
    reference = loss_and_grads(reference_fn(reference_models[variant]), *inputs, n_docs, epsilon)
    assert_same(ours, reference, rtol=1e-5, atol=1e-5)


def test_reference_sequence_quirks(reference_models):
    """Where we deliberately differ from RagSequenceForGeneration.get_nll.

    It adds log p(z|x) at target position 1: a 1-token answer loses the prior
    (the loss is -logsumexp_z log p(y_0|z), not a mixture), and an all-pad row
    gets -log(n_docs). We keep the textbook quantity: prior always, 0 for empty.
    """
    n_docs = 3
    seq_logits, doc_scores, _ = make_inputs(0, n_docs, batch=2)
    target = torch.full((2, LENGTH), PAD)
    target[0, 0] = 4  # a 1-token answer; row 1 is all pad
    reference = reference_fn(reference_models["sequence"])(
        seq_logits, doc_scores, target, n_docs, PAD, 0.0
    )
    first_token = torch.log_softmax(seq_logits[:n_docs, 0], dim=-1)[:, 4]  # (n_docs,)
    torch.testing.assert_close(reference[0], -torch.logsumexp(first_token, dim=0))
    torch.testing.assert_close(reference[1], torch.tensor(-math.log(n_docs)))

    ours = rag_sequence_nll(seq_logits, doc_scores, target, n_docs, PAD)
    expected = brute_force("sequence", seq_logits, doc_scores, target, n_docs)
    torch.testing.assert_close(ours, expected.float())
    assert ours[1].item() == 0.0


# ----------------------------------------------------------------------------- brute force float64


@pytest.mark.parametrize("variant", ["sequence", "token"])
@pytest.mark.parametrize("n_docs", N_DOCS)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("epsilon", [0.0, 0.2])
def test_matches_brute_force_float64(variant, n_docs, seed, epsilon):
    inputs = make_inputs(seed, n_docs, dtype=torch.float64)  # lengths 0..T, all allowed here
    ours = loss_and_grads(VARIANTS[variant], *inputs, n_docs, epsilon)
    expected = loss_and_grads(brute_force_fn(variant), *inputs, n_docs, epsilon)
    assert_same(ours, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant", ["sequence", "token"])
def test_float32_close_to_brute_force(variant):
    inputs = make_inputs(3, 5)
    torch.testing.assert_close(
        VARIANTS[variant](*inputs, 5, PAD), brute_force(variant, *inputs, 5).float(), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("variant", ["sequence", "token"])
@pytest.mark.parametrize("epsilon", [0.0, 0.3])
def test_gradcheck(variant, epsilon):
    seq_logits, doc_scores, target = make_inputs(4, 2, batch=2, length=3, vocab=5, dtype=torch.float64)
    seq_logits.requires_grad_(True)
    doc_scores.requires_grad_(True)

    def fn(logits, scores):
        return VARIANTS[variant](logits, scores, target, 2, PAD, epsilon)

    assert torch.autograd.gradcheck(fn, (seq_logits, doc_scores))


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("variant", ["sequence", "token"])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_all_pad_row_has_zero_loss_and_zero_gradient(variant, epsilon):
    n_docs = 3
    seq_logits, doc_scores, target = make_inputs(5, n_docs, min_len=1)
    target[2] = PAD
    fn = VARIANTS[variant]
    loss, logits_grad, scores_grad = loss_and_grads(fn, seq_logits, doc_scores, target, n_docs, epsilon)
    assert loss[2].item() == 0.0
    assert torch.all(logits_grad[2 * n_docs : 3 * n_docs] == 0)
    assert torch.all(scores_grad[2] == 0)
    # The other rows are unaffected by the empty one.
    keep = [0, 1, 3]
    rows = [b * n_docs + z for b in keep for z in range(n_docs)]
    alone = fn(seq_logits[rows], doc_scores[keep], target[keep], n_docs, PAD, epsilon)
    torch.testing.assert_close(loss[keep], alone)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_one_doc_is_plain_cross_entropy(epsilon):
    seq_logits, doc_scores, target = make_inputs(6, 1)
    per_token = F.cross_entropy(
        seq_logits.reshape(-1, VOCAB), target.reshape(-1), ignore_index=PAD,
        reduction="none", label_smoothing=epsilon,
    )  # (batch * T,)
    expected = per_token.view(BATCH, LENGTH).sum(dim=1)  # (batch,)
    for fn in VARIANTS.values():
        loss, _, scores_grad = loss_and_grads(fn, seq_logits, doc_scores, target, 1, epsilon)
        torch.testing.assert_close(loss, expected)
        assert torch.all(scores_grad == 0)


@pytest.mark.parametrize("variant", ["sequence", "token"])
def test_uniform_prior_from_equal_scores(variant):
    n_docs = 4
    seq_logits, _, target = make_inputs(7, n_docs)
    index = target.repeat_interleave(n_docs, dim=0).unsqueeze(-1)  # (batch * n_docs, T, 1)
    token_ll = torch.log_softmax(seq_logits, dim=-1).gather(-1, index)  # (batch * n_docs, T, 1)
    token_ll = token_ll.squeeze(-1).view(BATCH, n_docs, LENGTH)  # (batch, n_docs, T)
    token_ll = token_ll.masked_fill(target.eq(PAD).unsqueeze(1), 0.0)  # (batch, n_docs, T)
    log_n = math.log(n_docs)
    if variant == "sequence":
        expected = -(torch.logsumexp(token_ll.sum(-1), dim=1) - log_n)
    else:
        per_position = (torch.logsumexp(token_ll, dim=1) - log_n).masked_fill(target.eq(PAD), 0.0)
        expected = -per_position.sum(dim=1)
    for value in [0.0, 7.5, -1e4, 1e4]:
        doc_scores = torch.full((BATCH, n_docs), value)
        torch.testing.assert_close(VARIANTS[variant](seq_logits, doc_scores, target, n_docs, PAD), expected)


@pytest.mark.parametrize("variant", ["sequence", "token"])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_huge_scores_and_logits_stay_finite(variant, epsilon):
    n_docs = 5
    seq_logits, doc_scores, target = make_inputs(8, n_docs, min_len=1)
    fn = VARIANTS[variant]
    # A dominant document (score 1e4 against ~0) gets all the prior mass: the
    # loss is that document's plain NLL.
    doc_scores = doc_scores.round()  # integers: adding 1e4 is exact in float32
    doc_scores[:, 2] = 1e4
    loss, logits_grad, scores_grad = loss_and_grads(fn, seq_logits, doc_scores, target, n_docs)
    alone = fn(seq_logits.view(BATCH, n_docs, LENGTH, VOCAB)[:, 2], torch.zeros(BATCH, 1), target, 1, PAD)
    torch.testing.assert_close(loss, alone)
    assert torch.isfinite(logits_grad).all() and torch.isfinite(scores_grad).all()
    # Shifting every score by 1e4 changes nothing.
    scores = doc_scores.clone()
    scores[:, 2] = 3.0
    torch.testing.assert_close(
        fn(seq_logits, scores + 1e4, target, n_docs, PAD), fn(seq_logits, scores, target, n_docs, PAD)
    )
    # Huge logits and scores: finite values and gradients, float32 close to float64.
    huge_logits, huge_scores = 1e4 * seq_logits, 1e4 * doc_scores
    loss, logits_grad, scores_grad = loss_and_grads(fn, huge_logits, huge_scores, target, n_docs, epsilon)
    assert torch.isfinite(loss).all()
    assert torch.isfinite(logits_grad).all() and torch.isfinite(scores_grad).all()
    loss64 = fn(huge_logits.double(), huge_scores.double(), target, n_docs, PAD, epsilon)
    torch.testing.assert_close(loss, loss64.float(), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("variant", ["sequence", "token"])
def test_pad_id_outside_vocabulary_is_fine(variant):
    seq_logits, doc_scores, target = make_inputs(9, 2)
    fn = VARIANTS[variant]
    expected = fn(seq_logits, doc_scores, target, 2, PAD)
    shifted = target.masked_fill(target.eq(PAD), -100)
    torch.testing.assert_close(fn(seq_logits, doc_scores, shifted, 2, -100), expected)


@pytest.mark.parametrize("variant", ["sequence", "token"])
def test_non_contiguous_logits(variant):
    seq_logits, doc_scores, target = make_inputs(10, 2)
    strided = seq_logits.transpose(0, 1).contiguous().transpose(0, 1)  # (batch * n_docs, T, vocab), not contiguous
    assert not strided.is_contiguous()
    fn = VARIANTS[variant]
    torch.testing.assert_close(fn(strided, doc_scores, target, 2, PAD), fn(seq_logits, doc_scores, target, 2, PAD))


# ----------------------------------------------------------------------------- input checking


def _bad(seq_logits=None, doc_scores=None, target=None, n_docs=2, epsilon=0.0):
    good_logits, good_scores, good_target = make_inputs(0, 2, batch=3)
    return (
        good_logits if seq_logits is None else seq_logits,
        good_scores if doc_scores is None else doc_scores,
        good_target if target is None else target,
        n_docs,
        epsilon,
    )


LONG = torch.long
BAD_INPUTS = {  # case: (arguments, exception, message pattern)
    "logits_2d": (
        _bad(seq_logits=torch.zeros(6, VOCAB)),
        ValueError,
        r"seq_logits must have shape \(batch \* n_docs, T, vocab\)",
    ),
    "logits_rows": (_bad(seq_logits=torch.zeros(7, LENGTH, VOCAB)), ValueError, r"seq_logits .*3 \* 2 = 6 rows"),
    "scores_n_docs": (
        _bad(doc_scores=torch.zeros(3, 3)),
        ValueError,
        r"doc_scores must have shape \(batch, n_docs\) = \(batch, 2\)",
    ),
    "scores_1d": (_bad(doc_scores=torch.zeros(6)), ValueError, r"doc_scores must have shape"),
    "target_length": (
        _bad(target=torch.zeros(3, LENGTH + 1, dtype=LONG)),
        ValueError,
        r"target must have shape \(batch, T\) = \(3, 5\)",
    ),
    "target_batch": (_bad(target=torch.zeros(2, LENGTH, dtype=LONG)), ValueError, r"target must have shape"),
    "target_range": (_bad(target=torch.full((3, LENGTH), VOCAB)), ValueError, r"target ids .*\[0, 7\)"),
    "target_float": (_bad(target=torch.zeros(3, LENGTH)), TypeError, r"target must hold integer"),
    "n_docs_zero": (_bad(n_docs=0), ValueError, r"n_docs must be a positive int"),
    "epsilon_one": (_bad(epsilon=1.0), ValueError, r"epsilon must be in \[0, 1\)"),
}


@pytest.mark.parametrize("variant", ["sequence", "token"])
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_raise(variant, case):
    (seq_logits, doc_scores, target, n_docs, epsilon), error, message = BAD_INPUTS[case]
    with pytest.raises(error, match=message):
        VARIANTS[variant](seq_logits, doc_scores, target, n_docs, PAD, epsilon)
