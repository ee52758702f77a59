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
    import torch

    from rag_core.model.extract import short_answer
    from rag_core.model.generators import DecoderOnlyFamily, load_generator

    model, tokenizer = load_generator(Path(path))
    if model.config.is_encoder_decoder:
        raise WikiragError(f"{path}: the reader check prompts a decoder-only generator; this one is seq2seq "
                           "(give a causal LM folder, or leave the reader check off)")
    model.eval()
    family = DecoderOnlyFamily(model, tokenizer, max_answer_length=max_new_tokens)

    def read(items: Sequence[tuple[str, str, str]]) -> list[str]:
        answers = []
        for question, title, text in items:
            ids = tokenizer(family.prompt(question, title, text), return_tensors="pt").input_ids
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                     do_sample=False, eos_token_id=family.stop_token_ids,
                                     pad_token_id=family.pad_token_id)
            reply = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            answers.append(short_answer(reply, question))
        return answers

    return read


def reader_agrees(answer: str, read: str) -> bool:
    """The pair's answer, normalised, is a whole-word part of what the reader answered."""
    a = normalize_answer(answer)
    return bool(a) and f" {a} " in f" {normalize_answer(read)} "
