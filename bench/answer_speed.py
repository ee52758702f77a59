"""Speed of one ``wikirag ask`` (model and index loaded), side by side with transformers' ``generate`` doing the same work.

Both answer each question by RAG-Sequence (thorough, greedy per document, n_docs passages, up to
``--max-new-tokens`` answer tokens, the same stop rule) with the same loaded model:

- **wikirag**: ``rag_core.model.answers.answer``: retrieval, one batched prefill of the n_docs prompts, one
  greedy search over all documents at once (a KV cache per document), then every candidate scored
  under every document from the prefill's cache (only answer tokens run again);
- **transformers**: the same retrieval, then ``generator.generate`` on each of the n_docs prompts
  separately, then every (candidate, document) pair scored in one batched forward of prompt +
  candidate (as transformers' ``RagSequenceForGeneration.generate`` does for seq2seq), and the same
  mixture log p(y|x) = logsumexp_z [log p(z|x) + log p(y|x,z)].

Each repeat times every question once per engine (interleaved); a figure is min / median / max over
repeats of the median seconds per question. The replies of both engines are compared (wikirag's before
its short-answer cut and span choice, which only its timed rows run), and, when the
precision rule picks bf16 here, a third row times ``--dtype auto`` and counts its answers equal to float32's. Goal (issue 10): >= 1.3x.

    python bench/answer_speed.py [--home H] [--questions 4] [--repeats 3] [--threads 2] [--markdown F [--append]]
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python bench/answer_speed.py ...   # an AVX2-only CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo, spread

ROOT = Path(__file__).resolve().parents[1]


def transformers_answer(model, question: str, n_docs: int, max_new_tokens: int) -> str:
    """RAG-Sequence thorough with transformers' ``generate`` per document and a batched scoring forward."""
    import torch

    from rag_core.model.generators import left_pad, positions

    family, generator = model.family, model.generator
    batch = model.retrieve([question], n_docs)
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(batch.context_input_ids, batch.context_attention_mask)]
    stops = family.stop_token_ids
    candidates = []
    for prompt in prompts:  # n_docs separate prompts
        out = generator.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                 dtype=torch.long), max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                 eos_token_id=stops, pad_token_id=family.pad_token_id)[0, len(prompt):].tolist()
        end = next((i + 1 for i, t in enumerate(out) if t in stops), len(out))
        if out[:end] not in candidates:
            candidates.append(out[:end])
    pairs = [(c, z) for c in range(len(candidates)) for z in range(n_docs)]
    ids, mask = left_pad([prompts[z] + candidates[c] for c, z in pairs], family.pad_token_id)
    logits = generator(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [pairs, L, V]
    seq_ll = torch.zeros(len(candidates), n_docs)
    for row, (c, z) in enumerate(pairs):
        n = len(candidates[c])
        targets = torch.tensor(candidates[c])
        seq_ll[c, z] = logprobs[row, -n - 1:-1].gather(1, targets.unsqueeze(1)).sum()
    prior = torch.log_softmax(batch.doc_scores[0].detach().float(), dim=0)  # [n_docs]
    best = int(torch.logsumexp(seq_ll + prior, dim=1).argmax())
    return model.generator_tokenizer.decode(candidates[best], skip_special_tokens=True).strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="wikirag workspace with the sample index and the fetched generator")
    parser.add_argument("--questions", type=int, default=4, help="questions from rag_core/evaluate/sample_questions.jsonl")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-docs", type=int, default=None, help="passages per question (default: `wikirag ask`'s)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2: the 2 cores)")
    parser.add_argument("--markdown", help="write the table to this file")
    parser.add_argument("--append", action="store_true", help="append to --markdown instead of replacing it")
    args = parser.parse_args()
    if args.n_docs is None:
        from rag_core.train.jobs import ShortRun  # ask's default (cli/ask.py)

        args.n_docs = ShortRun().n_docs

    import torch

    torch.set_num_threads(args.threads)
    info = RunInfo.start()
    from cli.ask import load_model
    from runtime.settings import Settings, quiet_environment
    from rag_core.perf.precision import choose_precision
    from rag_core.model.answers import answer

    quiet_environment()
    settings = Settings(**({"home": args.home} if args.home else {}))
    lines_of = (ROOT / "rag_core" / "evaluate" / "sample_questions.jsonl").read_text().splitlines()
    questions = [json.loads(line)["question"] for line in lines_of[: args.questions]]
    model = load_model(settings, n_docs=args.n_docs, kind="sequence")  # float32, as `wikirag ask`
    precision = choose_precision("auto", "cpu")
    fast = load_model(settings, n_docs=args.n_docs, kind="sequence", dtype="auto") if precision.dtype != "float32" \
        else None
    ours_answers = [a["answer"] for a in answer(model, questions, max_new_tokens=args.max_new_tokens)]  # warm-up
    theirs_answers = [transformers_answer(model, q, args.n_docs, args.max_new_tokens) for q in questions]
    # the peer decodes only: compare it with wikirag's best reply before its short-answer cut and span choice
    asked = model.config
    model.config = asked.model_copy(update={"short_answers": False})
    ours_replies = [a["answer"] for a in answer(model, questions, max_new_tokens=args.max_new_tokens)]
    model.config = asked
    fast_answers = [a["answer"] for a in answer(fast, questions, max_new_tokens=args.max_new_tokens)] if fast else []
    times = {"wikirag": [], "transformers": [], "wikirag bf16": []}
    for _ in range(args.repeats):
        per_question = {"wikirag": [], "transformers": [], "wikirag bf16": []}
        for question in questions:
            start = time.perf_counter()
            answer(model, [question], max_new_tokens=args.max_new_tokens)
            per_question["wikirag"].append(time.perf_counter() - start)
            start = time.perf_counter()
            transformers_answer(model, question, args.n_docs, args.max_new_tokens)
            per_question["transformers"].append(time.perf_counter() - start)
            if fast:
                start = time.perf_counter()
                answer(fast, [question], max_new_tokens=args.max_new_tokens)
                per_question["wikirag bf16"].append(time.perf_counter() - start)
        for engine, values in per_question.items():
            if values:
                times[engine].append(statistics.median(values))
    same_engines = sum(a == b for a, b in zip(ours_replies, theirs_answers))
    precision_line = f"the precision rule here: {precision.dtype} ({precision.reason})"
    if fast:  # the rule's promise would be the same answers as float32: count them
        same = sum(a == b for a, b in zip(ours_answers, fast_answers))
        precision_line += f"; bf16 answers equal to float32's: {same}/{len(questions)}"
        if same < len(questions):
            precision_line += " (differ: " + "; ".join(f"{b!r} vs {a!r}" for a, b in zip(ours_answers, fast_answers)
                                                       if a != b) + ")"
    info.finish()
    ratio = [t / o for t, o in zip(times["transformers"], times["wikirag"])]  # both float32
    lines = [f"## One `ask` (RAG-Sequence, n_docs={args.n_docs}, <= {args.max_new_tokens} new tokens), "
             f"capability {info.hardware.capability}", "", *info.markdown_header(),
             f"{len(questions)} questions x {args.repeats} repeats, {args.threads} torch threads; both engines run "
             f"the float32 generator (as `wikirag ask`); {precision_line}.",
             f"Replies equal between the engines (wikirag's best reply before its short-answer cut and span "
             f"choice, which the peer does not do; the timed rows include them): {same_engines}/{len(questions)}.",
             "",
             "| engine | s per question (min / median / max of repeats) |", "|---|---|",
             f"| wikirag (`rag_core.model.answers.answer`) | {spread(times['wikirag'], '{:.2f}')} |",
             f"| transformers `generate` per document + batched scoring | {spread(times['transformers'], '{:.2f}')} |",
             *([f"| wikirag, bf16 generator (`--dtype auto`) | {spread(times['wikirag bf16'], '{:.2f}')} |"]
               if fast else []),
             "", f"Speed-up: {spread(ratio, '{:.2f}')}x (goal >= 1.3x: "
                 f"{'PASS' if statistics.median(ratio) >= 1.3 else 'FAIL'}).", "",
             "Answers: " + "; ".join(f"{q} -> {a!r}" for q, a in zip(questions, ours_answers)), ""]
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "a" if args.append else "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
