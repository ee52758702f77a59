"""The gate's decoding side by side: wikirag's fast RAG-Sequence vs transformers' ``generate`` doing the same work.

The main job's gate answers its held-out questions in batches of ``--batch`` with fast RAG-Sequence (each
passage's prompt decoded greedily on its own; a reply scored only under the passages whose search produced it),
``--n-docs`` passages, up to ``--max-new-tokens`` answer tokens, in the arithmetic the precision rule picks here.
Both engines get the same retrieved batches and the same loaded generator, and stop a reply at eos or a line break:

- **wikirag**: ``rag_core.model.causal_decoding.causal_sequence_generate(mode="fast")``: one prefill, then a greedy
  search whose rows leave the decoder as they stop, each reply keeping the log-prob its search summed;
- **transformers**: ``generator.generate`` on all of the batch's prompts at once (every row steps until the last
  one stops), its per-token log-probs from ``compute_transition_scores``, the same marginalisation
  logsumexp_z [log p(z|x) + log p(y|x,z)] over the passages that produced each reply.

Only decoding is timed (retrieval, span choice and the short-answer cut are the same for both and run outside).
Each repeat times every batch once per engine, interleaved; a figure is min / median / max over repeats of the
seconds per question, and the ratio is taken per repeat. The best replies of both engines are compared.

    python bench/gate_decoding.py [--home H] [--split test] [--limit 40] [--markdown FILE] [--avx2]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from questions import article_texts, sample_questions
from report import RunInfo, emulate_avx2_if_asked, publish, spread

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def up_to_stop(tokens: list[int], stops: list[int]) -> list[int]:
    """A reply's tokens up to and including its first stop token (all of them when none comes)."""
    return tokens[: next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))]


def transformers_fast(generator, family, ids, mask, doc_scores, n_docs: int, max_new_tokens: int) -> list[list[int]]:
    """Fast RAG-Sequence with transformers' greedy ``generate``: each question's best reply, as token lists."""
    import torch

    stops = family.stop_token_ids
    out = generator.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             num_beams=1, eos_token_id=stops, pad_token_id=family.pad_token_id,
                             return_dict_in_generate=True, output_logits=True)
    steps = generator.compute_transition_scores(out.sequences, out.logits, normalize_logits=True)  # [rows, T]
    replies, sums = [], []
    for row, scores in zip(out.sequences[:, ids.shape[1]:].tolist(), steps, strict=True):
        replies.append(up_to_stop(row, stops))
        sums.append(scores[: len(replies[-1])].float().sum())
    prior = torch.log_softmax(doc_scores.detach().float(), dim=1)  # [batch, n_docs]
    best = []
    for b in range(prior.shape[0]):
        rows = range(b * n_docs, (b + 1) * n_docs)
        candidates = list(dict.fromkeys(tuple(replies[r]) for r in rows))
        seq_ll = torch.full((len(candidates), n_docs), -torch.inf)
        for z, r in enumerate(rows):
            seq_ll[candidates.index(tuple(replies[r])), z] = sums[r]
        best.append(list(candidates[int(torch.logsumexp(seq_ll + prior[b], dim=1).argmax())]))
    return best


def wikirag_fast(generator, family, ids, mask, doc_scores, n_docs: int, max_new_tokens: int) -> list[list[int]]:
    """The same with rag_core's decoding: each question's best reply, as token lists."""
    from rag_core.model.causal_decoding import causal_sequence_generate

    stops = family.stop_token_ids
    found = causal_sequence_generate(generator, ids, mask, doc_scores.detach(), n_docs, mode="fast", num_beams=1,
                                     max_new_tokens=max_new_tokens, eos_token_id=stops,
                                     pad_token_id=family.pad_token_id)
    return [up_to_stop(row, stops) for row in found.sequences[:, 1:].tolist()]


def main() -> int:
    emulate_avx2_if_asked()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="wikirag workspace with the sample index and the fetched generator")
    parser.add_argument("--split", choices=("dev", "test"), default="test", help="the project's questions to answer "
                        "(default test, the gate's)")
    parser.add_argument("--limit", type=int, default=None, help="first N questions of the split (default: the "
                        "gate's count, ShortRun.gate_questions)")
    parser.add_argument("--batch", type=int, default=8, help="questions per batch (evaluation's)")
    parser.add_argument("--n-docs", type=int, default=None, help="passages per question (default: the main job's)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="answer tokens (default: the main job's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2: the 2 cores)")
    parser.add_argument("--markdown", type=Path, help="write the section to this file")
    parser.add_argument("--avx2", action="store_true", help="emulate an AVX2-only CPU (bench/report.py)")
    args = parser.parse_args()

    import torch

    from cli.ask import load_model
    from rag_core.perf.precision import choose_precision
    from rag_core.train.jobs import ShortRun
    from runtime.settings import Settings, quiet_environment

    short = ShortRun()
    args.limit = args.limit or short.gate_questions
    args.n_docs = args.n_docs or short.n_docs
    args.max_new_tokens = args.max_new_tokens or short.max_new_tokens
    torch.set_num_threads(args.threads)
    info = RunInfo.start()
    quiet_environment()
    model = load_model(Settings(**({"home": args.home} if args.home else {})), n_docs=args.n_docs, kind="sequence")
    model.eval()
    items, _ = sample_questions(article_texts(model.retriever))
    questions = [item["question"] for item in items if item["split"] == args.split][: args.limit]
    if not questions:
        parser.error(f"no {args.split} questions in this workspace's index (bench/questions.py counts them)")
    precision = choose_precision("auto", "cpu")
    bf16 = precision.dtype == "bfloat16"
    arithmetic = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    batches = [model.retrieve(questions[at: at + args.batch], args.n_docs)
               for at in range(0, len(questions), args.batch)]
    engines = {"wikirag": wikirag_fast, "transformers": transformers_fast}
    replies: dict[str, list[list[int]]] = {}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    with torch.no_grad(), arithmetic():
        for name, engine in engines.items():  # warm-up, and the replies compared
            replies[name] = [reply for b in batches
                             for reply in engine(model.generator, model.family, b.context_input_ids,
                                                 b.context_attention_mask, b.doc_scores, args.n_docs,
                                                 args.max_new_tokens)]
        for _ in range(args.repeats):
            spent = dict.fromkeys(engines, 0.0)
            for b in batches:
                for name, engine in engines.items():
                    start = time.perf_counter()
                    engine(model.generator, model.family, b.context_input_ids, b.context_attention_mask,
                           b.doc_scores, args.n_docs, args.max_new_tokens)
                    spent[name] += time.perf_counter() - start
            for name in engines:
                seconds[name].append(spent[name] / len(questions))
    info.finish()
    ratio = [theirs / ours for ours, theirs in zip(seconds["wikirag"], seconds["transformers"], strict=True)]
    same = sum(a == b for a, b in zip(replies["wikirag"], replies["transformers"], strict=True))
    lines = [f"## The gate's decoding: fast RAG-Sequence, batches of {args.batch}, capability "
             f"{info.hardware.capability}", "", *info.markdown_header(),
             (f"The first {len(questions)} {args.split} questions of the project's real ones (bench/questions.py), "
              f"retrieved once; n_docs={args.n_docs}, <= {args.max_new_tokens} new tokens, greedy, "
              f"{'bf16 autocast' if bf16 else 'float32'} (the precision rule here: {precision.reason}), "
              f"{args.threads} torch threads; {args.repeats} repeats, engines interleaved per batch."), "",
             "| engine | s per question (min / median / max of repeats) |", "|---|---|",
             f"| wikirag (`causal_sequence_generate`, fast) | {spread(seconds['wikirag'], '{:.3f}')} |",
             f"| transformers `generate` on the batch + `compute_transition_scores` "
             f"| {spread(seconds['transformers'], '{:.3f}')} |", "",
             f"Speed-up (transformers' time / wikirag's): {spread(ratio, '{:.2f}')}x "
             f"(median {statistics.median(ratio):.2f}x). Best replies equal between the engines: "
             f"{same}/{len(questions)}."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
