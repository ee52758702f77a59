"""The paper's central comparison on the project's real questions: closed-book, RAG-Sequence and RAG-Token,
zero-shot and fine-tuned.

Zero-shot rows: one model (the index's question encoder, the published sample index, the default
generator from ``wikirag models fetch``), read as RAG-Sequence, as RAG-Token and closed-book, and as
RAG-Sequence with span choice off (its free reply: the side-by-side baseline of RagConfig.grounded).
Fine-tuned rows: registered models (``--model LABEL=URI``, e.g. the main job's
``models:/wikirag-qa/1``), each with its own question encoder and kind. All rows answer the same
questions: a split (``--split``, default test) of bench/questions.py's set (the written questions,
and the NQ-open, WebQuestions and CuratedTrec questions answerable from the sample; dev is what the
reader was tuned on, test is held out).

The reader is rag_core's default: short answers (rag_core.model.extract), RAG-Sequence's best
candidate whose answer is in its passages, else the likeliest passage span (RagConfig.grounded), ``--decoding``
fast (the main job's gate) or thorough (``wikirag ask``'s). Reported: exact match and token F1
(SQuAD normalisation: lower case, no punctuation or articles), answer-in-output (a normalised
answer occurs in the normalised output, whole words), mean and median answer words, seconds per
question (batches of ``--batch`` questions), and retrieval recall@k for k = 1..n_docs (an answer
occurs in one of the top k passages) beside the reader's share of the retrieved answers it
returns. Nothing is sampled: decoding is deterministic, and one run gives the table. Goals (issue
37): zero-shot RAG >= 65% answer-in-output and >= 2.5x closed-book, median answer length <= 6
words; fine-tuned >= 10 points over zero-shot in EM and answer-in-output.

    python bench/answer_quality.py [--home ~/.wikirag] [--split test] [--n-docs 2] [--decoding fast]
        [--model "RAG-Sequence fine-tuned=models:/wikirag-qa/1"] [--limit N] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from questions import SPLITS, article_texts, sample_questions  # noqa: E402
from report import RunInfo  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FREE = "RAG-Sequence, free reply"  # span choice off: the side-by-side baseline of RagConfig.grounded
ZERO_SHOT = ("closed-book", FREE, "RAG-Sequence", "RAG-Token")
GOAL_IN_OUTPUT, GOAL_RATIO, GOAL_MEDIAN_WORDS, GOAL_GAIN = 0.65, 2.5, 6, 0.10


def free_of(label: str) -> str:
    """The row of registered model ``label`` read with span choice off."""
    return f"{label}, free reply"


def score(output: str, answers: list[str]) -> dict[str, float]:
    from rag_core.evaluate.metrics import exact_match, f1_score
    from rag_core.evaluate.real_questions import answer_in_output

    return {"em": exact_match(output, answers), "f1": f1_score(output, answers),
            "in_output": answer_in_output(output, answers), "words": len(output.split())}


def recalls(batch, items: list[dict]) -> list[list[float]]:
    """Per question, [recall@1, ..., recall@n]: an answer in one of the top k passages by p(z|x)."""
    from rag_core.evaluate.real_questions import answer_in_output  # the gate's test: whole words, normalised

    out = []
    for row, item in enumerate(items):
        order = batch.doc_scores[row].argsort(descending=True, stable=True).tolist()
        hits = [answer_in_output(batch.titles[row][z] + " " + batch.texts[row][z], item["answers"]) for z in order]
        out.append([float(any(hits[:k])) for k in range(1, len(hits) + 1)])
    return out


def parse_models(specs: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    models = {}
    for spec in specs:
        label, sep, uri = spec.partition("=")
        if not sep or not label.strip() or not uri.strip():
            parser.error(f"--model {spec!r}: write LABEL=URI, e.g. \"RAG-Sequence fine-tuned=models:/wikirag-qa/1\"")
        if label.strip() in (*ZERO_SHOT, "zero-shot"):
            parser.error(f"--model {spec!r}: {label.strip()!r} names a zero-shot row; pick another label")
        models[label.strip()] = uri.strip()
    return models


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="wikirag workspace with the sample index and the fetched generator")
    parser.add_argument("--split", choices=SPLITS, default="test", help="which split (default test, the held-out one)")
    parser.add_argument("--n-docs", type=int, default=2, help="passages per question (default 2, the main job's)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--decoding", choices=["fast", "thorough"], default="fast",
                        help="RAG-Sequence decoding (default fast, as the main job's gate)")
    parser.add_argument("--precision", choices=["auto", "float32"], default="auto",
                        help="auto: bf16 autocast where this CPU runs it natively, as the gate (default)")
    parser.add_argument("--model", action="append", default=[], metavar="LABEL=URI",
                        help="a fine-tuned row: a registered model (models:/NAME/VERSION or @ALIAS); repeatable")
    parser.add_argument("--batch", type=int, default=8, help="questions per generate call (default 8)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--limit", type=int, help="first N questions only (a quick look)")
    parser.add_argument("--markdown", help="write the tables to this file")
    args = parser.parse_args()
    registered = args.registered = parse_models(args.model, parser)
    import torch

    torch.set_num_threads(args.threads)
    info = RunInfo.start()

    from cli.ask import load_model
    from rag_core.perf.precision import choose_precision
    from runtime.settings import Settings, quiet_environment
    from tasks.evaluation import load_registered_model

    quiet_environment()
    settings = Settings(**({"home": args.home} if args.home else {}))
    zero = load_model(settings, n_docs=args.n_docs, kind="sequence")
    tuned = {label: load_registered_model(uri, settings.tracking_uri) for label, uri in registered.items()}
    for model in tuned.values():
        model.config = model.config.model_copy(update={"n_docs": args.n_docs})
    items, notes = sample_questions(article_texts(zero.retriever))
    items = [item for item in items if item["split"] == args.split][: args.limit]
    if not items:
        parser.error(f"no {args.split} questions in this workspace's index (bench/questions.py counts them)")
    bf16 = args.precision == "auto" and choose_precision("auto", "cpu").dtype == "bfloat16"
    arithmetic = "bf16 autocast" if bf16 else "float32"
    info.notes.append(f"{arithmetic}, {args.decoding} decoding, batches of {args.batch} questions: s / question is a "
                      "batch's time over its questions")
    # a model saved with span choice on is also read without it: the side-by-side baseline of its reader
    pairs = {"RAG-Sequence": FREE, **{label: free_of(label) for label, m in tuned.items() if m.config.grounded}}
    systems = [*ZERO_SHOT, *(row for label in tuned for row in (label, pairs.get(label)) if row)]
    outputs: dict[str, list[str]] = {name: [] for name in systems}
    recall: dict[str, list[list[float]]] = {"zero-shot": [], **{label: [] for label in tuned}}
    seconds = dict.fromkeys(systems, 0.0)
    settings_ = {"max_new_tokens": args.max_new_tokens, "mode": args.decoding}

    def timed(name: str, model, batch) -> None:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            outputs[name] += model.generate(batch, **settings_)
        seconds[name] += time.perf_counter() - start

    for at in range(0, len(items), args.batch):
        chunk = items[at: at + args.batch]
        questions = [item["question"] for item in chunk]
        with torch.no_grad():
            batch = zero.retrieve(questions, args.n_docs)
        recall["zero-shot"] += recalls(batch, chunk)
        for name, kind in (("closed-book", "sequence"), (FREE, "sequence"), ("RAG-Sequence", "sequence"),
                           ("RAG-Token", "token")):  # closed-book decodes as the gate's does
            zero.config = zero.config.model_copy(update={"kind": kind, "grounded": name != FREE})
            timed(name, zero, zero.closed_book(questions) if name == "closed-book" else batch)
        for label, model in tuned.items():
            with torch.no_grad():
                own = model.retrieve(questions, args.n_docs)
            recall[label] += recalls(own, chunk)
            timed(label, model, own)
            if label in pairs:
                model.config = model.config.model_copy(update={"grounded": False})
                timed(pairs[label], model, own)
                model.config = model.config.model_copy(update={"grounded": True})
        done = at + len(chunk)
        print(f"{done}/{len(items)} " + " | ".join(f"{name}: {outputs[name][-1]}" for name in systems),
              file=sys.stderr, flush=True)
        info.finish()
        lines = report(items[:done], outputs, recall, seconds, notes, info, args, tuned, len(items), pairs)
        if args.markdown:  # after every batch: a run stopped early still leaves its table, with its count
            Path(args.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def report(items: list[dict], outputs: dict[str, list[str]], recall: dict[str, list[list[float]]],
           seconds: dict[str, float], notes: list[str], info: RunInfo, args, tuned: dict, total: int,
           pairs: dict[str, str]) -> list[str]:
    from rag_core.evaluate.paired import gained_lost, sign_test

    n = len(items)
    sources = Counter(item["source"] for item in items)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(sources.items()))
    done = f"{n}" if n == total else f"the first {n} of {total}, a run stopped early"
    kinds = {label: model.config.kind for label, model in tuned.items()}
    choice = {label: "span choice " + ("on" if model.config.grounded else "off") for label, model in tuned.items()}
    lines = [f"## Answer quality on the {args.split} split of the project's questions ({done}: {counts}; "
             f"n_docs={args.n_docs})", "",
             *info.markdown_header(), *(f"- {note}" for note in notes),
             *(f"- {label}: `{uri}` ({kinds[label]}, {choice[label]})" for label, uri in args.registered.items()),
             "- *, free reply*: the model above it answering with its best reply as generated (RagConfig.grounded "
             "off); the other RAG rows, where no reply is in the passages, answer with the likeliest of the reply "
             "and the passages' spans", "",
             "| system | exact match | token F1 | answer in output | mean words | median words | recall@n_docs "
             "| reader: answer in output where retrieved | s / question |",
             "|---|---|---|---|---|---|---|---|---|"]
    means, medians, exact = {}, {}, {}
    for name in outputs:
        scores = [score(out, item["answers"]) for out, item in zip(outputs[name][:n], items, strict=True)]
        exact[name] = [s["em"] for s in scores]  # per question, for the counts of changed answers below
        means[name] = {k: sum(s[k] for s in scores) / n for k in ("em", "f1", "in_output", "words")}
        medians[name] = statistics.median(s["words"] for s in scores)
        owner = next((label for label, free in pairs.items() if free == name), name)
        found = recall.get("zero-shot" if owner in ZERO_SHOT else owner, [])[:n]
        hit = [s["in_output"] for s, r in zip(scores, found, strict=True) if r and r[-1]]
        recall_cell = "" if name == "closed-book" else f"{sum(r[-1] for r in found) / n:.1%}"
        reader_cell = "" if name == "closed-book" else f"{sum(hit) / max(1, len(hit)):.1%} of {len(hit)}"
        m = means[name]
        lines.append(f"| {name} | {m['em']:.1%} | {m['f1']:.1%} | {m['in_output']:.1%} | {m['words']:.1f} | "
                     f"{medians[name]:g} | {recall_cell} | {reader_cell} | {seconds[name] / n:.2f} |")
    at_k = [sum(r[k] for r in recall["zero-shot"][:n]) / n for k in range(args.n_docs)]
    lines += ["", "Retrieval recall@k, the index's question encoder (an answer in one of the top k passages): "
              + ", ".join(f"@{k + 1} {v:.1%}" for k, v in enumerate(at_k)) + ".", ""]
    for source in sorted(sources):
        rows = [i for i, item in enumerate(items) if item["source"] == source]
        shares = {name: sum(score(outputs[name][i], items[i]["answers"])["in_output"] for i in rows) / len(rows)
                  for name in outputs}
        cells = ", ".join(f"{name} {share:.0%}" for name, share in shares.items())
        lines.append(f"- {source} ({len(rows)}): answer in output {cells}")
    rag = (FREE, "RAG-Sequence", "RAG-Token")
    best = max(means[name]["in_output"] for name in rag)
    closed = means["closed-book"]["in_output"]
    ratio = best / closed if closed else float("inf")
    median = min(medians[name] for name in rag)
    verdict = {True: "PASS", False: "FAIL"}
    lines.append("")

    def changed(first: str, second: str) -> str:  # exact answers second gets and first misses, and the reverse
        gained, lost = gained_lost(exact[first], exact[second])
        return f"per question {gained} gained, {lost} lost; two-sided sign test p = {sign_test(gained, lost):.2f}"

    for label, free in pairs.items():
        gains = {k: (means[label][k] - means[free][k]) * 100 for k in ("em", "in_output")}
        slower = seconds[label] / max(seconds[free], 1e-9)
        lines.append(f"- Span choice against the free reply, {label}: EM {gains['em']:+.1f} points "
                     f"({changed(free, label)}), answer-in-output {gains['in_output']:+.1f} points, "
                     f"time x{slower:.2f}.")
    lines += ["", f"Goals (best zero-shot RAG row): answer-in-output >= {GOAL_IN_OUTPUT:.0%}: {best:.1%} "
                  f"({verdict[best >= GOAL_IN_OUTPUT]}); >= {GOAL_RATIO}x closed-book: {ratio:.2f}x "
                  f"({verdict[ratio >= GOAL_RATIO]}); median words <= {GOAL_MEDIAN_WORDS}: {median:g} "
                  f"({verdict[median <= GOAL_MEDIAN_WORDS]})."]
    for label, kind in kinds.items():
        start_name = "RAG-Sequence" if kind == "sequence" else "RAG-Token"
        gains = {k: means[label][k] - means[start_name][k] for k in ("em", "in_output")}
        ok = all(g >= GOAL_GAIN for g in gains.values())
        lines.append(f"- {label} against zero-shot RAG-{kind.title()}: EM {gains['em'] * 100:+.1f} points "
                     f"({changed(start_name, label)}), answer-in-output {gains['in_output'] * 100:+.1f} points "
                     f"(>= {GOAL_GAIN * 100:.0f} each: {verdict[ok]}).")
    lines += ["", "### Example answers", "",
              "| question | gold | " + " | ".join(outputs) + " |", "|---|---|" + "---|" * len(outputs)]
    picked = [i for i in range(n) if items[i]["source"] == "written"][:6] + \
             [i for i in range(n) if items[i]["source"] != "written"][:6]
    for i in picked:
        cells = [items[i]["question"], items[i]["answers"][0], *(outputs[name][i] for name in outputs)]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return lines


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
