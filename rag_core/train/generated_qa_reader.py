"""The reader half of the generated-QA round trip: the generator answers each question from its best passage.

Optional, two uses:

- ``GeneratedQAConfig.reader="generator"``: the retriever half already asks that the question
  finds its own passage and that the best passage holds the answer; this asks, beyond that, that
  the project's generator gives the answer back when it reads that passage. A pair passes when
  the normalised answer shows in the generator's short answer
  (:func:`rag_core.model.extract.short_answer`).
- ``GeneratedQAConfig.target="reader-lead"``: each pair's training target is the generator's own
  reply, cut after its short answer, with the pair's answer in place of that short answer
  (:func:`lead_target`).

Decoder-only generators only: it is the prompt the project's reader uses
(:meth:`DecoderOnlyFamily.prompt`), greedy, a few questions at a time. The check runs in each
shard, before the merge thins the pairs; the targets after it, over the pairs that stay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rag_core.errors import WikiragError
from rag_core.evaluate.normalize import normalize_answer

# (question, title, text) of each pair's best passage -> the reader's (reply, short answer) to each.
Replies = Callable[[Sequence[tuple[str, str, str]]], list[tuple[str, str]]]


def generator_replies(path: str, max_new_tokens: int = 16, dtype: str = "float32", batch_size: int = 8) -> Replies:
    """:data:`Replies` of the decoder-only generator at ``path`` (loaded in ``dtype``), one passage per question,
    greedy: each reply is the first line it says, lead-in included, and its short answer is cut from that line.
    Questions go ``batch_size`` at a time, left-padded, similar prompt lengths together: a batch shares each
    decoding step, where one question at a time pays a step's fixed cost per token of each reply."""
    import torch

    from rag_core.model.extract import short_answer
    from rag_core.model.generators import DecoderOnlyFamily, left_pad, load_generator

    model, tokenizer = load_generator(Path(path), dtype)
    if model.config.is_encoder_decoder:
        raise WikiragError(f"{path}: the generated-QA reader prompts a decoder-only generator; this one is seq2seq "
                           "(give a causal LM folder, or leave the reader check and reader-lead targets off)")
    model.eval()
    family = DecoderOnlyFamily(model, tokenizer, max_answer_length=max_new_tokens)

    def replies(items: Sequence[tuple[str, str, str]]) -> list[tuple[str, str]]:
        prompts = [tokenizer(family.prompt(question, title, text), add_special_tokens=False)["input_ids"]
                   for question, title, text in items]
        said: dict[int, str] = {}
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # little padding in each batch
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            ids, mask = left_pad([prompts[i] for i in batch], family.pad_token_id)
            with torch.inference_mode():
                generated = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                           eos_token_id=family.stop_token_ids, pad_token_id=family.pad_token_id)
            for i, row in zip(batch, generated, strict=True):
                # the stop rule ends a reply at its first token holding a line break, which may carry a word after it
                said[i] = tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=True).strip().split("\n")[0].strip()
        return [(said[i], short_answer(said[i], question)) for i, (question, _, _) in enumerate(items)]

    return replies


def reader_agrees(answer: str, read: str) -> bool:
    """The pair's answer, normalised, is a whole-word part of what the reader answered."""
    a = normalize_answer(answer)
    return bool(a) and f" {a} " in f" {normalize_answer(read)} "


def lead_target(reply: str, short: str, answer: str) -> str:
    """The reader's ``reply`` cut after its ``short`` answer, with the pair's ``answer`` in its place: "The capital
    of Algeria is Algiers." Where the reply has no lead-in, the bare answer; where it does not hold its short
    answer, the bare answer too. What follows the short answer goes: in a reply cut at its token limit it is
    noise, and a target that ends at the answer teaches the reader to stop there."""
    at = reply.find(short) if short else -1
    if at < 0:
        return answer
    return reply[:at] + answer + ("." if reply[:at].strip() else "")
