"""The project's real questions about the sample, and their fixed dev / test split.

Sources, read in place at run time (../shared/data is never copied into the project):

- **written**: bench/data/sample_questions.jsonl, questions written about the sample's articles;
- **NQ-open**: ../shared/data/qa/nq_open/*.jsonl (``{"question", "answer": [...]}``);
- **WebQuestions**: ../shared/data/qa/webquestions/*.json (``[{"qText", "answers": [...]}]``);
- **CuratedTrec**: ../shared/data/qa/curatedtrec/*.tsv (``id, factoid, question, answer regex``).

A public question is kept when it names one of the sample's articles (the title, whole words, 4
characters or more; the longest such title wins) and one of its answers (3 characters or more after
normalisation) occurs, whole words, in that article's passages. CuratedTrec answers are regular
expressions: their gold strings are the distinct whole-word spans the regex matches in the article.
A question is dropped when a gold answer occurs in the question itself (echoing the question would
count as an answer), and so are the questions the reader's prompt was first chosen on. A question
asked twice (after normalisation) is kept once, from the first source in the order above.

The split is a pure function of the normalised question (:func:`split_of`: sha256, even -> dev,
odd -> test), so it does not depend on which sources are present, on their order or on the sample:
a question is in the same split on every machine. Tune on dev; report test.

    python bench/questions.py [--home ~/.wikirag] [--show dev|test]   # counts per source and split
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rag_core.evaluate.normalize import normalize_answer as normalize  # noqa: E402  (SQuAD's, as the metrics)

WRITTEN = ROOT / "bench" / "data" / "sample_questions.jsonl"
QA_DIR = ROOT.parent / "shared" / "data" / "qa"
SPLITS = ("dev", "test")
MIN_TITLE, MIN_ANSWER = 4, 3  # characters: shorter titles and answers match by accident
# the questions the reader's prompt was first chosen on (rag_core/model/generators.py): in no split
PROMPT_QUESTIONS = (
    "Who tutored Alexander the Great?", "What is the capital of Alabama?", "In which year did Abraham Lincoln die?",
    "Who wrote Atlas Shrugged?", "Where was Albert Einstein born?", "What sport did Andre Agassi play?",
    "Who was the first president of the United States?", "When did the American Civil War end?")


def contains(haystack: str, needle: str) -> bool:
    """Whole-word containment of normalised strings."""
    return bool(needle) and f" {needle} " in f" {haystack} "


def split_of(question: str) -> str:
    """``"dev"`` or ``"test"``: a fixed function of the normalised question."""
    digest = hashlib.sha256(normalize(question).encode()).digest()
    return SPLITS[digest[0] % 2]


def article_texts(retriever) -> dict[str, str]:
    """title -> the text of all its passages, in index order (from an IndexRetriever's index)."""
    texts: dict[str, list[str]] = {}
    for shard in range(len(retriever.index.shards)):
        for row in range(len(retriever.index.passage_ids(shard))):
            hit = retriever.index.hit(shard, row, 0.0)
            texts.setdefault(hit.title, []).append(hit.text or "")
    return {title: " ".join(parts) for title, parts in texts.items()}


def _public(qa_dir: Path) -> Iterator[tuple[str, str, list[str] | str]]:
    """(source, question, answers or an answer regex) of every public question present, in source order."""
    for path in sorted((qa_dir / "nq_open").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            yield "NQ-open", record["question"], list(record["answer"])
    for path in sorted((qa_dir / "webquestions").glob("*.json")):
        for record in json.loads(path.read_text()):
            yield "WebQuestions", record["qText"], list(record["answers"])
    for path in sorted((qa_dir / "curatedtrec").glob("*.tsv")):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) >= 4:
                yield "CuratedTrec", fields[2], fields[3]


def _regex_answers(pattern: str, text: str) -> list[str]:
    """The distinct whole-word spans of ``text`` that ``pattern`` matches (at most 3)."""
    try:
        regex = re.compile(rf"\b(?:{pattern})\b", re.IGNORECASE)
    except re.error:
        return []
    found: dict[str, str] = {}
    for match in regex.finditer(text):
        span = match.group(0).strip()
        if len(normalize(span)) >= MIN_ANSWER:
            found.setdefault(normalize(span), span)
    return list(found.values())[:3]


def sample_questions(articles: dict[str, str], qa_dir: Path = QA_DIR) -> tuple[list[dict], list[str]]:
    """Every kept question (module docstring) as ``{question, answers, article, source, split}``, and notes."""
    normalized = {title: normalize(text) for title, text in articles.items()}
    titles = sorted(((normalize(t), t) for t in articles if len(normalize(t)) >= MIN_TITLE),
                    key=lambda pair: (-len(pair[1]), pair[1]))  # the longest title that a question names wins
    notes, items, seen = [], [], {normalize(q) for q in PROMPT_QUESTIONS}

    def keep(question: str, answers: list[str], article: str, source: str) -> None:
        q = normalize(question)
        if q in seen or any(contains(q, normalize(a)) for a in answers):
            return
        seen.add(q)
        items.append({"question": question, "answers": answers, "article": article, "source": source,
                      "split": split_of(question)})

    for line in WRITTEN.read_text().splitlines():
        item = json.loads(line)
        if any(contains(normalized.get(item["article"], ""), normalize(a)) for a in item["answers"]):
            keep(item["question"], item["answers"], item["article"], "written")
        else:
            notes.append(f"written question dropped (answer not in its article): {item['question']}")
    if not qa_dir.is_dir():
        notes.append(f"{qa_dir} not found: written questions only")
        return items, notes
    for source, question, answers in _public(qa_dir):
        q = normalize(question)
        for name, title in titles:
            if not contains(q, name) or len(q.replace(name, " ").split()) <= 2:  # "who was X?" asks for no fact
                continue
            golds = (_regex_answers(answers, articles[title]) if isinstance(answers, str) else
                     [a for a in answers if len(normalize(a)) >= MIN_ANSWER and contains(normalized[title], normalize(a))])
            if golds:
                keep(question, golds, title, source)
                break
    return items, notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="wikirag workspace with the sample index (default $WIKIRAG_HOME)")
    parser.add_argument("--show", choices=SPLITS, help="also print that split's questions")
    args = parser.parse_args()
    from flows.settings import Settings, quiet_environment
    from rag_core.model.retriever import IndexRetriever

    quiet_environment()
    settings = Settings(**({"home": args.home} if args.home else {}))
    items, notes = sample_questions(article_texts(IndexRetriever.load(settings.open_store())))
    for note in notes:
        print(f"note: {note}")
    counts = Counter((i["source"], i["split"]) for i in items)
    for source in dict.fromkeys(i["source"] for i in items):
        print(f"{source}: " + ", ".join(f"{s} {counts[source, s]}" for s in SPLITS))
    print("all: " + ", ".join(f"{s} {sum(i['split'] == s for i in items)}" for s in SPLITS))
    for item in items if args.show else []:
        if item["split"] == args.show:
            print(f"[{item['source']}] {item['question']} -> {item['answers']} ({item['article']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
