"""The reader half of the generated-QA round trip: the generator answers each question from its best passage.

Optional (``GeneratedQAConfig.reader="generator"``): the retriever half already asks that the
question finds its own passage and that the best passage holds the answer; this asks, beyond
that, that the project's generator gives the answer back when it reads that passage. A pair
passes when the normalised answer shows in the generator's short answer
(:func:`rag_core.model.extract.short_answer`). Decoder-only generators only: it is the
prompt the project's reader uses (:meth:`DecoderOnlyFamily.prompt`), greedy, one question at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rag_core.errors import WikiragError
from rag_core.evaluate.normalize import normalize_answer

# (question, title, text) of each pair's best passage -> the reader's short answer to each.
Read = Callable[[Sequence[tuple[str, str, str]]], list[str]]


def generator_reader(path: str, max_new_tokens: int = 16) -> Read:
    """A :data:`Read` that prompts the decoder-only generator at ``path`` with one passage per question."""
    replies = generator_replies(path, max_new_tokens)
    return lambda items: [short for _, short in replies(items)]


def generator_replies(path: str, max_new_tokens: int = 16) -> Callable[[Sequence[tuple[str, str, str]]],
                                                                     list[tuple[str, str]]]:
    """Like :func:`generator_reader`, but each answer comes with the reply it was cut from (its first line,
    lead-in included: what the generator itself says; ``bench/train_choice_bench.py`` trains on such replies)."""
    import torch

    from rag_core.model.extract import short_answer
    from rag_core.model.generators import DecoderOnlyFamily, load_generator

    model, tokenizer = load_generator(Path(path))
    if model.config.is_encoder_decoder:
        raise WikiragError(f"{path}: the reader check prompts a decoder-only generator; this one is seq2seq "
                           "(give a causal LM folder, or leave the reader check off)")
    model.eval()
    family = DecoderOnlyFamily(model, tokenizer, max_answer_length=max_new_tokens)

    def replies(items: Sequence[tuple[str, str, str]]) -> list[tuple[str, str]]:
        out = []
        for question, title, text in items:
            ids = tokenizer(family.prompt(question, title, text), return_tensors="pt").input_ids
            with torch.inference_mode():
                generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                           do_sample=False, eos_token_id=family.stop_token_ids,
                                           pad_token_id=family.pad_token_id)
            # the stop rule ends a reply at its first token holding a line break, which may carry a word after it
            reply = tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True).strip().split("\n")[0]
            out.append((reply.strip(), short_answer(reply, question)))
        return out

    return replies


def reader_agrees(answer: str, read: str) -> bool:
    """The pair's answer, normalised, is a whole-word part of what the reader answered."""
    a = normalize_answer(answer)
    return bool(a) and f" {a} " in f" {normalize_answer(read)} "
