"""RAG marginalisation: the negative log marginal likelihood over retrieved documents.

Two free functions over tensors, one per RAG variant (Lewis et al., 2020). Both
take the generator's logits for every (passage, question) input and the raw
retrieval scores, and return one loss per example:

- ``rag_sequence_nll``: p(y|x) = sum_z p(z|x) prod_i p(y_i | x, z, y_<i)
  (one document explains the whole answer);
- ``rag_token_nll``:    p(y|x) = prod_i sum_z p(z|x) p(y_i | x, z, y_<i)
  (each answer token may come from a different document);

where p(z|x) = softmax(doc_scores) over the ``n_docs`` documents of one
example. Everything is computed in log space (log_softmax + logsumexp), so huge
logits or doc scores stay finite, and both functions are differentiable in
``seq_logits`` and ``doc_scores``.

Conventions (they differ from transformers' ``get_nll``):

- No shift: ``target[:, t]`` is the token that ``seq_logits[:, t]`` predicts.
  transformers shifts its ``labels`` left internally; pass it
  ``labels = [decoder_start, target...]`` to compare.
- The document prior of RAG-Sequence enters once per sequence, whatever the
  target length. transformers adds it at target position 1, so there a
  1-token target loses the prior and an all-pad row gets -log(n_docs).
- Positions where ``target == pad_token_id`` are ignored. A row with no
  target token at all has loss exactly 0 (the empty product is 1) and zero
  gradient.
- Computation happens in the dtype of the inputs; upcast half-precision logits
  first if you need float32 accuracy.

Label smoothing (``epsilon`` > 0, off by default) follows the RAG paper's code
(transformers' ``get_nll``). With V the vocabulary size, the loss of a row is
``(1 - epsilon) * nll + (epsilon / V) * smooth`` where, summing t over the
non-pad positions of the row:

- RAG-Token: ``smooth = -sum_t sum_v log q_t(v)`` with
  ``q_t(v) = sum_z p(z|x) p(v | x, z, y_<t)`` the marginal next-token
  distribution: ordinary label smoothing towards the uniform distribution,
  applied to the marginal.
- RAG-Sequence: ``smooth = -logsumexp_z( V * log p(z|x)
  + sum_t sum_v log p(v | x, z, y_<t) )``: the per-document sum of all
  log-probabilities, with the prior added to each of the V entries of one
  position (hence V times), marginalised over documents with logsumexp. It is a
  heuristic, not a proper smoothed likelihood; it is kept because it is what
  the reference trains with.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["rag_sequence_nll", "rag_token_nll"]


def rag_sequence_nll(
    seq_logits: Tensor,
    doc_scores: Tensor,
    target: Tensor,
    n_docs: int,
    pad_token_id: int,
    epsilon: float = 0.0,
) -> Tensor:
    """RAG-Sequence loss: -log sum_z p(z|x) prod_t p(y_t | x, z, y_<t), per example.

    Args:
        seq_logits: (batch * n_docs, T, vocab) generator logits; the n_docs rows
            of one example are contiguous (row b * n_docs + z is document z of
            example b).
        doc_scores: (batch, n_docs) raw retrieval scores (softmax taken here).
        target: (batch, T) integer token ids; ``target[:, t]`` is predicted by
            ``seq_logits[:, t]``; ``pad_token_id`` positions are ignored.
        n_docs: documents retrieved per example.
        pad_token_id: the id that marks ignored target positions.
        epsilon: label smoothing in [0, 1); see the module docstring.

    Returns:
        (batch,) negative log marginal likelihood; 0 for an all-pad row.
    """
    _, _, vocab = _check_inputs(seq_logits, doc_scores, target, n_docs, pad_token_id, epsilon)
    seq_logprobs, doc_logprobs, pad_mask, token_logprobs = _log_terms(
        seq_logits, doc_scores, target, n_docs, pad_token_id
    )
    seq_ll = token_logprobs.sum(dim=-1) + doc_logprobs  # (batch, n_docs)
    loss = -torch.logsumexp(seq_ll, dim=1)  # (batch,)
    if epsilon > 0.0:
        vocab_sums = seq_logprobs.sum(dim=-1)  # (batch, n_docs, T)
        vocab_sums = vocab_sums.masked_fill(pad_mask.unsqueeze(1), 0.0)  # (batch, n_docs, T)
        smooth_ll = vocab_sums.sum(dim=-1) + vocab * doc_logprobs  # (batch, n_docs)
        smooth = -torch.logsumexp(smooth_ll, dim=1)  # (batch,)
        loss = (1.0 - epsilon) * loss + (epsilon / vocab) * smooth  # (batch,)
    has_tokens = (~pad_mask).any(dim=1)  # (batch,)
    return torch.where(has_tokens, loss, torch.zeros_like(loss))  # (batch,)


def rag_token_nll(
    seq_logits: Tensor,
    doc_scores: Tensor,
    target: Tensor,
    n_docs: int,
    pad_token_id: int,
    epsilon: float = 0.0,
) -> Tensor:
    """RAG-Token loss: -sum_t log sum_z p(z|x) p(y_t | x, z, y_<t), per example.

    Arguments and result as for :func:`rag_sequence_nll`.
    """
    _, _, vocab = _check_inputs(seq_logits, doc_scores, target, n_docs, pad_token_id, epsilon)
    seq_logprobs, doc_logprobs, pad_mask, token_logprobs = _log_terms(
        seq_logits, doc_scores, target, n_docs, pad_token_id
    )
    # Marginalising only the gathered target tokens equals gathering from the
    # full marginal distribution, without building (batch, T, vocab) for it.
    joint = token_logprobs + doc_logprobs.unsqueeze(-1)  # (batch, n_docs, T)
    marginal = torch.logsumexp(joint, dim=1)  # (batch, T)
    marginal = marginal.masked_fill(pad_mask, 0.0)  # (batch, T)
    loss = -marginal.sum(dim=1)  # (batch,)
    if epsilon > 0.0:
        full_joint = seq_logprobs + doc_logprobs[:, :, None, None]  # (batch, n_docs, T, vocab)
        full_marginal = torch.logsumexp(full_joint, dim=1)  # (batch, T, vocab)
        vocab_sums = full_marginal.sum(dim=-1).masked_fill(pad_mask, 0.0)  # (batch, T)
        smooth = -vocab_sums.sum(dim=1)  # (batch,)
        loss = (1.0 - epsilon) * loss + (epsilon / vocab) * smooth  # (batch,)
    return loss


def _log_terms(
    seq_logits: Tensor, doc_scores: Tensor, target: Tensor, n_docs: int, pad_token_id: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Log-probabilities shared by both variants.

    Returns seq_logprobs (batch, n_docs, T, vocab), doc_logprobs (batch, n_docs),
    pad_mask (batch, T) and token_logprobs (batch, n_docs, T): log p(y_t | x, z, y_<t),
    0 at pad positions.
    """
    batch = doc_scores.shape[0]
    _, length, vocab = seq_logits.shape
    seq_logprobs = torch.log_softmax(seq_logits, dim=-1)  # (batch * n_docs, T, vocab)
    seq_logprobs = seq_logprobs.reshape(batch, n_docs, length, vocab)  # (batch, n_docs, T, vocab)
    doc_logprobs = torch.log_softmax(doc_scores, dim=1)  # (batch, n_docs)
    pad_mask = target.eq(pad_token_id)  # (batch, T)
    # Pad positions gather index 0 (always valid) and are zeroed below, so the
    # pad id need not be a valid vocabulary index.
    index = target.masked_fill(pad_mask, 0)  # (batch, T)
    index = index[:, None, :, None].expand(batch, n_docs, length, 1)  # (batch, n_docs, T, 1)
    token_logprobs = seq_logprobs.gather(dim=-1, index=index).squeeze(-1)  # (batch, n_docs, T)
    token_logprobs = token_logprobs.masked_fill(pad_mask.unsqueeze(1), 0.0)  # (batch, n_docs, T)
    return seq_logprobs, doc_logprobs, pad_mask, token_logprobs


def _check_inputs(
    seq_logits: Tensor,
    doc_scores: Tensor,
    target: Tensor,
    n_docs: int,
    pad_token_id: int,
    epsilon: float,
) -> tuple[int, int, int]:
    """Validate shapes, dtypes and values; return (batch, T, vocab)."""
    if isinstance(n_docs, bool) or not isinstance(n_docs, int) or n_docs < 1:
        raise ValueError(f"n_docs must be a positive int, got {n_docs!r}")
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must be in [0, 1), got {epsilon!r}")
    if seq_logits.dim() != 3:
        raise ValueError(
            "seq_logits must have shape (batch * n_docs, T, vocab), "
            f"got {tuple(seq_logits.shape)} ({seq_logits.dim()} dims)"
        )
    if doc_scores.dim() != 2 or doc_scores.shape[1] != n_docs:
        raise ValueError(
            f"doc_scores must have shape (batch, n_docs) = (batch, {n_docs}), got {tuple(doc_scores.shape)}"
        )
    batch = doc_scores.shape[0]
    rows, length, vocab = seq_logits.shape
    if rows != batch * n_docs:
        raise ValueError(
            f"seq_logits must have shape (batch * n_docs, T, vocab) with batch * n_docs = "
            f"{batch} * {n_docs} = {batch * n_docs} rows (batch from doc_scores), "
            f"got {tuple(seq_logits.shape)}"
        )
    if tuple(target.shape) != (batch, length):
        raise ValueError(
            f"target must have shape (batch, T) = ({batch}, {length}) to match seq_logits "
            f"and doc_scores, got {tuple(target.shape)}"
        )
    if not seq_logits.is_floating_point() or not doc_scores.is_floating_point():
        raise TypeError(
            f"seq_logits and doc_scores must be floating point, got {seq_logits.dtype} and {doc_scores.dtype}"
        )
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"target must hold integer token ids, got dtype {target.dtype}")
    real_tokens = target[target.ne(pad_token_id)]
    if real_tokens.numel() and (real_tokens.min() < 0 or real_tokens.max() >= vocab):
        raise ValueError(
            f"target ids outside pad must lie in [0, vocab) = [0, {vocab}), "
            f"got range [{int(real_tokens.min())}, {int(real_tokens.max())}]"
        )
    return batch, length, vocab
