"""The paper's central comparison on the real sample: RAG-Sequence, RAG-Token and closed-book, side by side.

One run, one model (the index's question encoder, the published sample index, the default
generator from ``wikirag models fetch``, zero-shot), the same questions for all three:

- **written**: bench/data/sample_questions.jsonl, questions written for this benchmark about the
  sample's articles, with their answers (each checked here to occur in the article's passages);
- **NQ-open**: questions of ../shared/data/qa/nq_open (read in place, never copied) that name one of
  the sample's articles (its title, whole words) and one of whose answers (3 characters or more) occurs in a
  passage of that article. Chosen at run time, so the set follows the sample.

Reported: exact match and token F1 (SQuAD normalisation: lower case, no punctuation or articles),
answer-in-output (a normalised answer occurs in the normalised output, whole words), mean answer
words, and retrieval recall@5 (an answer occurs in one of the 5 retrieved passages). Goals (issue
10): RAG at least doubles closed-book's answer-in-output rate and reaches >= 70%.

    python bench/answer_quality.py [--home ~/.wikirag] [--n-docs 5] [--limit N] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import string
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo

ROOT = Path(__file__).resolve().parents[1]
WRITTEN = ROOT / "bench" / "data" / "sample_questions.jsonl"
NQ_DIR = ROOT.parent / "shared" / "data" / "qa" / "nq_open"
# the questions the prompt was chosen on (rag_core/model/generators.py): never part of the set
PROMPT_QUESTIONS = {"who tutored alexander the great", "what is the capital of alabama",
                    "in which year did abraham lincoln die", "who wrote atlas shrugged", "where was albert einstein born",
                    "what sport did andre agassi play", "who was the first president of the united states",
                    "when did the american civil war end"}


def normalize(text: str) -> str:
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def contains(haystack: str, needle: str) -> bool:
    """Whole-word containment of normalised strings."""
    return bool(needle) and f" {needle} " in f" {haystack} "


def token_f1(prediction: str, answer: str) -> float:
    pred, gold = normalize(prediction).split(), normalize(answer).split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def article_texts(retriever) -> dict[str, str]:
    """title -> normalised text of all its passages."""
    texts: dict[str, list[str]] = {}
    for shard in range(len(retriever.index.shards)):
        for pid in range(len(retriever.index.passage_ids(shard))):
            hit = retriever.index.hit(shard, pid, 0.0)
            texts.setdefault(hit.title, []).append(hit.text or "")
    return {title: normalize(" ".join(parts)) for title, parts in texts.items()}


def dev_set(articles: dict[str, str]) -> tuple[list[dict], list[str]]:
    """The written questions whose answer is in their article, then the NQ-open questions chosen as above."""
    notes, items = [], []
    for line in WRITTEN.read_text().splitlines():
        item = json.loads(line)
        text = articles.get(item["article"], "")
        if any(contains(text, normalize(a)) for a in item["answers"]):
            items.append({**item, "source": "written"})
        else:
            notes.append(f"written question dropped (answer not in its article): {item['question']}")
    seen = {normalize(i["question"]) for i in items} | PROMPT_QUESTIONS
    titles = [t for t in articles if len(t) >= 4]
    for path in sorted(NQ_DIR.glob("*.jsonl")) if NQ_DIR.is_dir() else []:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            question = normalize(record["question"])
            if question in seen:
                continue
            for title in titles:
                if contains(question, normalize(title)) and any(
                        len(normalize(a)) >= 3 and contains(articles[title], normalize(a)) for a in record["answer"]):
                    items.append({"question": record["question"], "answers": record["answer"], "article": title,
                                  "source": f"NQ-open ({path.name})"})
                    seen.add(question)
                    break
    if not NQ_DIR.is_dir():
        notes.append(f"{NQ_DIR} not found: written questions only")
    return items, notes


def score(output: str, answers: list[str]) -> dict[str, float]:
    out = normalize(output)
    return {"em": float(any(out == normalize(a) for a in answers)),
            "f1": max(token_f1(output, a) for a in answers),
            "in_output": float(any(contains(out, normalize(a)) for a in answers)),
            "words": len(output.split())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="wikirag workspace with the sample index and the fetched generator")
    parser.add_argument("--n-docs", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "auto", "bfloat16"],
                        help="generator weights (default float32, as `wikirag ask`)")
    parser.add_argument("--limit", type=int, help="first N questions only (a quick look)")
    parser.add_argument("--markdown", help="write the tables to this file")
    args = parser.parse_args()
    info = RunInfo.start()

    import torch

    from flows.ask import load_model
    from flows.settings import Settings, quiet_environment

    quiet_environment()
    settings = Settings(**({"home": args.home} if args.home else {}))
    model = load_model(settings, n_docs=args.n_docs, kind="sequence", dtype=args.dtype)
    items, notes = dev_set(article_texts(model.retriever))
    items = items[: args.limit] if args.limit else items
    kinds = {"RAG-Sequence": "sequence", "RAG-Token": "token"}
    rows, seconds = [], {name: 0.0 for name in [*kinds, "closed-book"]}
    for i, item in enumerate(items):
        with torch.no_grad():
            batch = model.retrieve([item["question"]], args.n_docs)
        passages = [normalize(t + " " + x) for t, x in zip(batch.titles[0], batch.texts[0])]
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
    lines = report(rows, seconds, notes, info, args, str(model.generator.dtype).removeprefix("torch."))
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0


def report(rows: list[dict], seconds: dict[str, float], notes: list[str], info: RunInfo, args,
           dtype: str) -> list[str]:
    n = len(rows)
    sources = Counter(r["source"].split(" ")[0] for r in rows)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(sources.items()))
    lines = [f"## Answer quality on the real sample ({n} questions: {counts}; n_docs={args.n_docs}, zero-shot, "
             f"generator {dtype})", "",
             *info.markdown_header(), *(f"- {note}" for note in notes), "",
             "| system | exact match | token F1 | answer in output | mean words | s / question |",
             "|---|---|---|---|---|---|"]
    rates = {}
    for name in ("RAG-Sequence", "RAG-Token", "closed-book"):
        scores = [score(r["outputs"][name], r["answers"]) for r in rows]
        mean = {k: sum(s[k] for s in scores) / n for k in ("em", "f1", "in_output", "words")}
        rates[name] = mean["in_output"]
        lines.append(f"| {name} | {mean['em']:.1%} | {mean['f1']:.1%} | {mean['in_output']:.1%} | "
                     f"{mean['words']:.1f} | {seconds[name] / n:.2f} |")
    recall = sum(r["recall"] for r in rows) / n
    lines += ["", f"Retrieval recall@5 (an answer in one of the 5 passages): {recall:.1%}.", ""]
    for source in sorted(sources):
        part = [r for r in rows if r["source"].startswith(source)]
        cells = ", ".join(f"{name} {sum(score(r['outputs'][name], r['answers'])['in_output'] for r in part) / len(part):.0%}"
                          for name in ("RAG-Sequence", "RAG-Token", "closed-book"))
        lines.append(f"- {source} ({len(part)}): answer in output {cells}; recall@5 "
                     f"{sum(r['recall'] for r in part) / len(part):.0%}")
    best = max(rates["RAG-Sequence"], rates["RAG-Token"])
    ratio = best / rates["closed-book"] if rates["closed-book"] else float("inf")
    lines += ["", f"Goal: best RAG answer-in-output >= 2x closed-book: {ratio:.2f}x "
                  f"({'PASS' if ratio >= 2 else 'FAIL'}); >= 70%: {best:.1%} ({'PASS' if best >= 0.7 else 'FAIL'}).",
              "", "### Example answers", "",
              "| question | gold | RAG-Sequence | RAG-Token | closed-book | provenance (top 3 by p(z\\|x)) |",
              "|---|---|---|---|---|---|"]
    for r in rows[:6] + [r for r in rows if r["source"] != "written"][:6]:
        cells = [r["question"], r["answers"][0], *(r["outputs"][k] for k in ("RAG-Sequence", "RAG-Token",
                                                                             "closed-book")), ", ".join(r["provenance"][:3])]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return lines


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
