"""The paper's central comparison on the project's real questions: RAG-Sequence, RAG-Token and closed-book.

One run, one model (the index's question encoder, the published sample index, the default
generator from ``wikirag models fetch``, zero-shot), the same questions for all three: a split
(``--split``, default test) of bench/questions.py's set (the written questions, and the NQ-open,
WebQuestions and CuratedTrec questions answerable from the sample; dev is what the reader was tuned
on, test is held out).

The reader is rag_core's default: short answers (rag_core.model.extract), RAG-Sequence's best
candidate whose answer is in its passages, grounded decoding off (RagConfig.grounded). Reported: exact match and token F1 (SQuAD normalisation:
lower case, no punctuation or articles),
answer-in-output (a normalised answer occurs in the normalised output, whole words), mean and
median answer words, seconds per question (one torch thread), and retrieval recall@n_docs (an
answer occurs in one of the retrieved passages). Goals (issue 37): RAG >= 65% answer-in-output and
>= 2.5x closed-book, median answer length <= 6 words.

    python bench/answer_quality.py [--home ~/.wikirag] [--split test] [--n-docs 5] [--limit N] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from questions import SPLITS, article_texts, contains, normalize, sample_questions  # noqa: E402
from report import RunInfo  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("RAG-Sequence", "RAG-Token", "closed-book")
GOAL_IN_OUTPUT, GOAL_RATIO, GOAL_MEDIAN_WORDS = 0.65, 2.5, 6


def score(output: str, answers: list[str]) -> dict[str, float]:
    from rag_core.evaluate.metrics import exact_match, f1_score

    out = normalize(output)
    return {"em": exact_match(output, answers), "f1": f1_score(output, answers),
            "in_output": float(any(contains(out, normalize(a)) for a in answers)),
            "words": len(output.split())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="wikirag workspace with the sample index and the fetched generator")
    parser.add_argument("--split", choices=SPLITS, default="test", help="which split (default test, the held-out one)")
    parser.add_argument("--n-docs", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "auto", "bfloat16"],
                        help="generator weights (default float32, as `wikirag ask`)")
    parser.add_argument("--limit", type=int, help="first N questions only (a quick look)")
    parser.add_argument("--markdown", help="write the tables to this file")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # s / question on one thread: comparable on a shared machine (and in the header)
    info = RunInfo.start()
    info.notes.append("s / question: one torch thread, on a machine shared with other jobs at the load above; not a "
                      "timing figure (bench/answer_speed.py times answers). The accuracy columns do not depend on "
                      "the load.")

    from cli.ask import load_model
    from runtime.settings import Settings, quiet_environment

    quiet_environment()
    settings = Settings(**({"home": args.home} if args.home else {}))
    model = load_model(settings, n_docs=args.n_docs, kind="sequence", dtype=args.dtype)
    items, notes = sample_questions(article_texts(model.retriever))
    items = [item for item in items if item["split"] == args.split][: args.limit]
    kinds = {"RAG-Sequence": "sequence", "RAG-Token": "token"}
    if not items:
        parser.error(f"no {args.split} questions in this workspace's index (bench/questions.py counts them)")
    rows, seconds = [], dict.fromkeys(SYSTEMS, 0.0)
    for i, item in enumerate(items):
        with torch.no_grad():
            batch = model.retrieve([item["question"]], args.n_docs)
        passages = [normalize(t + " " + x) for t, x in zip(batch.titles[0], batch.texts[0], strict=True)]
        order = batch.doc_scores[0].argsort(descending=True, stable=True).tolist()  # p(z|x) order
        row = {**item, "recall": float(any(contains(p, normalize(a)) for p in passages for a in item["answers"])),
               "provenance": [batch.titles[0][z] for z in order], "outputs": {}}
        for name, kind in kinds.items():
            model.config = model.config.model_copy(update={"kind": kind})
            start = time.perf_counter()
            row["outputs"][name] = model.generate(batch, max_new_tokens=args.max_new_tokens)[0]
            seconds[name] += time.perf_counter() - start
        start = time.perf_counter()
        row["outputs"]["closed-book"] = model.generate(model.closed_book([item["question"]]),
                                                       max_new_tokens=args.max_new_tokens)[0]
        seconds["closed-book"] += time.perf_counter() - start
        rows.append(row)
        print(f"{i + 1}/{len(items)} {item['question']} -> " + " | ".join(
            f"{k}: {v}" for k, v in row["outputs"].items()), file=sys.stderr, flush=True)
        info.finish()
        lines = report(rows, seconds, notes, info, args, str(model.generator.dtype).removeprefix("torch."),
                       model.config.grounded, len(items))
        if args.markdown:  # after every question: a run stopped early still leaves its table, with its count
            Path(args.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def report(rows: list[dict], seconds: dict[str, float], notes: list[str], info: RunInfo, args,
           dtype: str, grounded: bool, total: int) -> list[str]:
    n = len(rows)
    sources = Counter(r["source"] for r in rows)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(sources.items()))
    done = f"{n}" if n == total else f"the first {n} of {total}, a run stopped early"
    lines = [f"## Answer quality on the {args.split} split of the project's questions ({done}: {counts}; "
             f"n_docs={args.n_docs}, zero-shot, generator {dtype}, grounded decoding "
             f"{'on' if grounded else 'off'})", "",
             *info.markdown_header(), *(f"- {note}" for note in notes), "",
             "| system | exact match | token F1 | answer in output | mean words | median words | s / question |",
             "|---|---|---|---|---|---|---|"]
    rates, medians = {}, {}
    for name in SYSTEMS:
        scores = [score(r["outputs"][name], r["answers"]) for r in rows]
        mean = {k: sum(s[k] for s in scores) / n for k in ("em", "f1", "in_output", "words")}
        rates[name], medians[name] = mean["in_output"], statistics.median(s["words"] for s in scores)
        lines.append(f"| {name} | {mean['em']:.1%} | {mean['f1']:.1%} | {mean['in_output']:.1%} | "
                     f"{mean['words']:.1f} | {medians[name]:g} | {seconds[name] / n:.2f} |")
    recall = sum(r["recall"] for r in rows) / n
    lines += ["", f"Retrieval recall@{args.n_docs} (an answer in one of the passages): {recall:.1%}.", ""]
    for source in sorted(sources):
        part = [r for r in rows if r["source"] == source]
        cells = ", ".join(f"{name} {sum(score(r['outputs'][name], r['answers'])['in_output'] for r in part) / len(part):.0%}"
                          for name in SYSTEMS)
        lines.append(f"- {source} ({len(part)}): answer in output {cells}; recall@{args.n_docs} "
                     f"{sum(r['recall'] for r in part) / len(part):.0%}")
    best = max(rates["RAG-Sequence"], rates["RAG-Token"])
    ratio = best / rates["closed-book"] if rates["closed-book"] else float("inf")
    median = min(medians["RAG-Sequence"], medians["RAG-Token"])
    verdict = {True: "PASS", False: "FAIL"}
    lines += ["", f"Goals (best RAG row): answer-in-output >= {GOAL_IN_OUTPUT:.0%}: {best:.1%} "
                  f"({verdict[best >= GOAL_IN_OUTPUT]}); >= {GOAL_RATIO}x closed-book: {ratio:.2f}x "
                  f"({verdict[ratio >= GOAL_RATIO]}); median words <= {GOAL_MEDIAN_WORDS}: {median:g} "
                  f"({verdict[median <= GOAL_MEDIAN_WORDS]}).",
              "", "### Example answers", "",
              "| question | gold | RAG-Sequence | RAG-Token | closed-book | provenance (top 3 by p(z\\|x)) |",
              "|---|---|---|---|---|---|"]
    for r in [r for r in rows if r["source"] == "written"][:6] + [r for r in rows if r["source"] != "written"][:6]:
        cells = [r["question"], r["answers"][0], *(r["outputs"][k] for k in SYSTEMS), ", ".join(r["provenance"][:3])]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return lines


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
