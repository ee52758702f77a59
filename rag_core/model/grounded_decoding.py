"""Grounded decoding: a short answer is a span of the passages it was retrieved with, enforced while decoding.

A small generator's parametric prior can outvote the passage in its own prompt ("capital of Alaska"
-> "Anchorage" beside a passage that says Juneau). With ``RagConfig.grounded`` (off by default: when
the passages do not hold the answer, a forced span is a wrong answer read from an unrelated passage)
the reader decodes such a reply again under a logits mask: at every step only the tokens that
continue some span of the passages are allowed, and a stop token only after a complete word. The
generator still chooses the span (its likelihoods, the doc-score marginalisation and the ranking of
RAG-Sequence candidates by p(y|x) are unchanged); it cannot leave the passages.

:class:`PassageSpans` is the prefix trie of a set of passages' spans: for every word start of every
passage, the token ids of the text from there on (up to ``max_words`` words), once as the word
opens a reply ("Juneau, Alaska") and once with the space before it ("ĠJuneau"), as tokenizers
differ on a reply's first word. A node may end the answer when its token ends a word (the next
character of the passage is not a letter or digit). :meth:`PassageSpans.after` puts forced tokens in
front (a free reply's lead-in, "The capital of Alaska is"), so that the generator fills the answer
slot of its own sentence with a passage span. :class:`SpanConstrainedStepper` wraps a
decoding stepper of :mod:`rag_core.model.decoding` (``next_logprobs`` / ``reorder``) and masks its
log-probs row by row; a row whose span has run out (``max_words`` reached mid-word, or decoding
past a stop token) may only stop.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["PassageSpans", "SpanConstrainedStepper"]

MAX_SPAN_WORDS = 12  # an answer of more words than this is no short answer
_END = -1  # the trie key that marks "a stop token may follow"
_WORD_START = re.compile(r"(?:(?<=\s)|^)\S|(?<=[^\w\s])\w")  # a chunk after a space, or a word after punctuation
_CHUNKS = re.compile(r"\S+")


class PassageSpans:
    """The prefix trie of every word-start span (``max_words`` words at most) of ``passages``, in token ids."""

    def __init__(self, tokenizer: Any, passages: Sequence[str], *, max_words: int = MAX_SPAN_WORDS) -> None:
        self.root: dict[int, dict] = {}
        texts, ends = [], []
        for passage in passages:
            passage = " ".join(passage.split())
            chunk_ends = [m.end() for m in _CHUNKS.finditer(passage)]
            for match in _WORD_START.finditer(passage):
                start = match.start()
                later = [end for end in chunk_ends if end > start]
                stop = later[min(max_words, len(later)) - 1]  # the end of the max_words-th chunk from here
                texts.append(passage[start:stop])
                ends.append(passage[stop:stop + 1])
                if start and passage[start - 1] == " ":  # the same span behind its space
                    texts.append(passage[start - 1:stop])
                    ends.append(passage[stop:stop + 1])
        if not texts:
            return
        encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        for text, after, ids, offsets in zip(texts, ends, encoded["input_ids"], encoded["offset_mapping"],
                                             strict=True):
            node = self.root
            for token, (_, end) in zip(ids, offsets, strict=True):
                node = node.setdefault(token, {})
                following = text[end:end + 1] if end < len(text) else after
                if not following.isalnum():
                    node[_END] = True

    def after(self, prefix: Sequence[int]) -> PassageSpans:
        """The same spans behind the forced tokens ``prefix`` (a reply's lead-in); the trie is shared, not copied."""
        spans = PassageSpans.__new__(PassageSpans)
        spans.root = self.root
        for token in reversed(prefix):
            spans.root = {token: spans.root}
        return spans

    def __bool__(self) -> bool:
        return bool(self.root)

    def contains(self, ids: Sequence[int]) -> bool:
        """Whether ``ids`` (no stop token) is a whole span: in the trie, ending where a word ends."""
        node = self.root
        for token in ids:
            if token not in node:
                return False
            node = node[token]
        return _END in node


class SpanConstrainedStepper:
    """A decoding stepper whose rows may only emit spans of their passages (module docstring).

    ``spans[e]`` constrains the ``beams`` rows of example ``e`` (rows are example-major, as the
    decoding loops order them); an empty :class:`PassageSpans` leaves its rows free. ``stop_ids``:
    the tokens that end an answer.
    """

    def __init__(self, inner: Any, spans: Sequence[PassageSpans], beams: int, stop_ids: Sequence[int]) -> None:
        self.inner, self.device = inner, inner.device
        self.stop_ids = list(stop_ids)
        self.tries = [trie for trie in spans for _ in range(beams)]  # [rows]
        self.nodes: list[dict | None] | None = None  # None before the first step

    def next_logprobs(self, last_tokens: Tensor) -> Tensor:
        """The inner stepper's ``[rows, V]`` log-probs, -inf outside each row's allowed tokens."""
        logprobs = self.inner.next_logprobs(last_tokens)  # [rows, V]
        if self.nodes is None:  # the first call reads the start token: every row at its trie's root
            self.nodes = [trie.root if trie else None for trie in self.tries]
        else:
            self.nodes = [None if node is None else node.get(token, {})
                          for node, token in zip(self.nodes, last_tokens.tolist(), strict=True)]
        allowed = torch.zeros_like(logprobs, dtype=torch.bool)  # [rows, V]
        for row, node in enumerate(self.nodes):
            if node is None:  # no passages: free decoding
                allowed[row] = True
                continue
            ids = [token for token in node if token != _END]
            if _END in node or not ids:  # a word ends here, or the span ran out: stopping is allowed
                ids += self.stop_ids
            allowed[row, ids] = True
        return logprobs.masked_fill(~allowed, -torch.inf)

    def reorder(self, rows: Tensor) -> None:
        """Keep beam rows ``rows`` (their trie positions move with them)."""
        self.inner.reorder(rows)
        order = rows.tolist()
        self.tries = [self.tries[i] for i in order]
        if self.nodes is not None:
            self.nodes = [self.nodes[i] for i in order]
