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

Each row takes turns with the others ``--reps`` times (at least 3), so that a busy
machine slows all rows alike; every time is reported as min / median / max over the
repetitions, and every speed ratio is taken within one repetition (the two calls of
the same turn) and then summarised the same way. Contexts are unpadded (the reference
drops the attention mask for RAG-Sequence's per-document beams).

    python bench/decoding_bench.py --quick                      # batch 4, 3 repetitions (~30-60 s)
    python bench/decoding_bench.py --markdown bench/results/decoding.md   # batch 16, 5 repetitions (~3-5 min)
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import MIN_REPEATS, RunInfo, spread

from rag_core.model.decoding import rag_sequence_generate, rag_token_generate

PAIRS = ("token greedy", "token beam", "sequence thorough")  # wikirag vs transformers, same outputs expected


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
    parts = {"config": config, "question_encoder": DPRQuestionEncoder(question), "generator": generator}
    return generator, RagTokenForGeneration(**parts).eval(), RagSequenceForGeneration(**parts).eval()


def strip(sequences: torch.Tensor, pad: int = 1) -> torch.Tensor:
    keep = (sequences != pad).any(dim=0).nonzero()
    return sequences[:, : int(keep.max()) + 1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="batch 4, 3 repetitions")
    p.add_argument("--batch", type=int, help="questions (default 16; --quick 4)")
    p.add_argument("--reps", type=int, help=f"timed repetitions per row (default 5; --quick and minimum {MIN_REPEATS})")
    p.add_argument("--n-docs", type=int, default=5)
    p.add_argument("--context", type=int, default=64, help="tokens per (document, question) input")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--max-length", type=int, default=20)
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2, this machine's cores)")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    args = p.parse_args(argv)
    batch, reps = args.batch or (4 if args.quick else 16), args.reps or (MIN_REPEATS if args.quick else 5)
    if reps < MIN_REPEATS:
        p.error(f"--reps must be at least {MIN_REPEATS}: every figure is a min / median / max")
    torch.set_num_threads(args.threads)
    info = RunInfo.start(argv and [sys.argv[0], *argv])
    warnings.filterwarnings("ignore")
    generator, token_model, sequence_model = build(args.n_docs)
    n = args.n_docs
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1000, (batch * n, args.context), generator=gen)  # (batch * n_docs, L), no pad
    mask = torch.ones_like(ids)
    scores = 2.0 * torch.randn(batch, n, generator=gen)
    common = {"context_input_ids": ids, "context_attention_mask": mask, "doc_scores": scores, "n_docs": n}
    ours = {"max_length": args.max_length, "min_length": 2}
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
    times: dict[str, list[float]] = {name: [] for name in rows}
    outputs = {}
    start = time.perf_counter()
    with torch.no_grad():
        for name, call in rows.items():  # warm-up: first calls allocate and pick kernels
            outputs[name] = call()
        for _ in range(reps):
            for name, call in rows.items():
                t0 = time.perf_counter()
                outputs[name] = call()
                times[name].append(time.perf_counter() - t0)
    took = time.perf_counter() - start
    info.finish()

    def ratios(slow: str, fast: str) -> list[float]:
        return [a / b for a, b in zip(times[slow], times[fast])]

    table = ["| row | seconds per call | questions/s |", "|---|---:|---:|"]
    for name, secs in times.items():
        table.append(f"| {name} | {spread(secs, '{:.3f}')} | {spread([batch / s for s in secs], '{:.1f}')} |")
    comparisons = ["| comparison | speed, per repetition | same outputs |", "|---|---:|---|"]
    for kind in PAIRS:
        a, b = strip(outputs[f"{kind} / wikirag"]), strip(outputs[f"{kind} / transformers"])
        same = a.shape == b.shape and torch.equal(a, b)
        comparisons.append(f"| {kind}: wikirag vs transformers (transformers' time / wikirag's) | "
                           f"{spread(ratios(f'{kind} / transformers', f'{kind} / wikirag'), '{:.2f}x')} | "
                           f"{'yes' if same else 'NO'} |")
    thorough, fast = strip(outputs["sequence thorough / wikirag"]), strip(outputs["sequence fast / wikirag"])
    width = max(thorough.shape[1], fast.shape[1])
    thorough = torch.nn.functional.pad(thorough, (0, width - thorough.shape[1]), value=1)
    fast = torch.nn.functional.pad(fast, (0, width - fast.shape[1]), value=1)
    agree = int((thorough == fast).all(dim=1).sum())
    comparisons.append(f"| sequence fast vs thorough, wikirag (thorough's time / fast's) | "
                       f"{spread(ratios('sequence thorough / wikirag', 'sequence fast / wikirag'), '{:.2f}x')} | "
                       f"top-1 agreement {agree}/{batch} |")
    md = [
        "## RAG decoding: rag_core.model.decoding vs transformers' RAG classes",
        "",
        *info.markdown_header(),
        (f"A random BART (d_model 256, 2 + 2 layers, vocabulary 1,000, init_std 0.5 so documents matter), {batch} "
        f"questions x {n} documents x {args.context} tokens, beams {args.beams}, max_length {args.max_length}, "
        f"{args.threads} torch threads; one warm-up call per row, then {reps} repetitions with the rows taking "
        f"turns ({took:.0f} s). Figures are min / median / max over the repetitions; a speed is the ratio of the two "
        "calls of the same repetition."),
        "",
        *table,
        "",
        *comparisons,
        "",
    ]
    text = "\n".join(md)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
