"""RAG decoding side by side: rag_core.model.decoding vs transformers' RAG classes, and fast vs thorough RAG-Sequence.

One run, one random (untrained) BART generator, the same contexts and doc scores for
every row: d_model 256, 2 encoder + 2 decoder layers, vocabulary 1,000, init_std 0.5
(so that the documents change the output), ``--n-docs`` documents of ``--context``
tokens per question, ``--batch`` questions, answers up to ``--max-length`` tokens.
Rows:

* RAG-Token greedy and beam search (``--beams``): ``rag_token_generate`` vs
  ``RagTokenForGeneration.generate`` (same outputs expected);
* RAG-Sequence thorough: ``rag_sequence_generate(mode="thorough")`` vs
  ``RagSequenceForGeneration.generate`` (same outputs expected);
* RAG-Sequence fast: ``rag_sequence_generate(mode="fast")``, with its top-1
  agreement with thorough.

Each row takes turns with the others ``--reps`` times; the fastest call counts, so
that a busy machine slows all rows alike. Contexts are unpadded (the reference drops
the attention mask for RAG-Sequence's per-document beams).

    python bench/decoding_bench.py --quick     # batch 4, 1 repetition (~20-40 s)
    python bench/decoding_bench.py             # batch 16, best of 3 (~2-4 min)
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rag_core.model.decoding import rag_sequence_generate, rag_token_generate  # noqa: E402


def build(n_docs: int):
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
    bart = BartConfig(vocab_size=1000, d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
                      max_position_embeddings=256, init_std=0.5)
    torch.manual_seed(0)
    generator = BartForConditionalGeneration(bart).eval()
    with torch.no_grad():
        generator.final_logits_bias[0, bart.pad_token_id] = -1e4  # never emit pad (see tests/rag_core/model/test_decoding.py)
    config = RagConfig.from_question_encoder_generator_configs(question, bart, n_docs=n_docs)
    parts = dict(config=config, question_encoder=DPRQuestionEncoder(question), generator=generator)
    return generator, RagTokenForGeneration(**parts).eval(), RagSequenceForGeneration(**parts).eval()


def strip(sequences: torch.Tensor, pad: int = 1) -> torch.Tensor:
    keep = (sequences != pad).any(dim=0).nonzero()
    return sequences[:, : int(keep.max()) + 1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="batch 4, one repetition")
    p.add_argument("--batch", type=int, help="questions (default 16; --quick 4)")
    p.add_argument("--reps", type=int, help="timed repetitions per row, fastest kept (default 3; --quick 1)")
    p.add_argument("--n-docs", type=int, default=5)
    p.add_argument("--context", type=int, default=64, help="tokens per (document, question) input")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--max-length", type=int, default=20)
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2, this machine's cores)")
    args = p.parse_args(argv)
    batch, reps = args.batch or (4 if args.quick else 16), args.reps or (1 if args.quick else 3)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    generator, token_model, sequence_model = build(args.n_docs)
    n = args.n_docs
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1000, (batch * n, args.context), generator=gen)  # (batch * n_docs, L), no pad
    mask = torch.ones_like(ids)
    scores = 2.0 * torch.randn(batch, n, generator=gen)
    common = dict(context_input_ids=ids, context_attention_mask=mask, doc_scores=scores, n_docs=n)
    ours = dict(max_length=args.max_length, min_length=2)
    rows = {
        "token greedy / transformers": lambda: token_model.generate(**common, num_beams=1, **ours),
        "token greedy / wikirag": lambda: rag_token_generate(generator, ids, mask, scores, n, num_beams=1, **ours),
        "token beam / transformers": lambda: token_model.generate(**common, num_beams=args.beams, **ours),
        "token beam / wikirag": lambda: rag_token_generate(generator, ids, mask, scores, n, num_beams=args.beams,
                                                           **ours),
        "sequence thorough / transformers": lambda: sequence_model.generate(**common, num_beams=args.beams, **ours),
        "sequence thorough / wikirag": lambda: rag_sequence_generate(generator, ids, mask, scores, n,
                                                                     num_beams=args.beams, **ours).sequences,
        "sequence fast / wikirag": lambda: rag_sequence_generate(generator, ids, mask, scores, n, mode="fast",
                                                                 num_beams=args.beams, **ours).sequences,
    }
    best, outputs = {name: float("inf") for name in rows}, {}
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(reps):
            for name, call in rows.items():
                t0 = time.perf_counter()
                outputs[name] = call()
                best[name] = min(best[name], time.perf_counter() - t0)
    print(f"batch {batch} questions x {n} docs x {args.context} tokens, beams {args.beams}, "
          f"max_length {args.max_length}, {args.threads} threads, best of {reps} (run took "
          f"{time.perf_counter() - start:.0f} s)\n")
    print(f"| {'row':34} | {'s/call':>7} | {'questions/s':>11} |\n|{'-' * 36}|{'-' * 9}|{'-' * 13}|")
    for name, seconds in best.items():
        print(f"| {name:34} | {seconds:7.3f} | {batch / seconds:11.1f} |")
    print()
    for kind in ("token greedy", "token beam", "sequence thorough"):
        a, b = strip(outputs[f"{kind} / wikirag"]), strip(outputs[f"{kind} / transformers"])
        same = a.shape == b.shape and torch.equal(a, b)
        ratio = best[f"{kind} / transformers"] / best[f"{kind} / wikirag"]
        print(f"{kind}: wikirag {ratio:.2f}x transformers' speed, same outputs: {same}")
    thorough, fast = strip(outputs["sequence thorough / wikirag"]), strip(outputs["sequence fast / wikirag"])
    width = max(thorough.shape[1], fast.shape[1])
    thorough = torch.nn.functional.pad(thorough, (0, width - thorough.shape[1]), value=1)
    fast = torch.nn.functional.pad(fast, (0, width - fast.shape[1]), value=1)
    agreement = (thorough == fast).all(dim=1).float().mean().item()
    ratio = best["sequence thorough / wikirag"] / best["sequence fast / wikirag"]
    print(f"sequence fast: {ratio:.2f}x thorough's speed, top-1 agreement with thorough {agreement:.0%} "
          f"({int(round(agreement * batch))}/{batch})")


if __name__ == "__main__":
    main()
