"""The project's real questions about the sample, and their fixed dev / test split, for the benchmarks.

The questions and the split are rag_core.evaluate.real_questions' (the written questions shipped
with the package, plus the NQ-open, WebQuestions and CuratedTrec questions of ../shared/data/qa,
read in place, that name a sample article and whose answer occurs in it), so the benchmarks
measure on exactly the questions the main job's gate uses. Tune on dev; report test.

    python bench/questions.py [--home ~/.wikirag] [--show dev|test]   # counts per source and split
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rag_core.evaluate.normalize import normalize_answer as normalize  # noqa: E402,F401  (SQuAD's, as the metrics)
from rag_core.evaluate.real_questions import SPLITS, contains, real_questions, split_of  # noqa: E402,F401

QA_DIR = ROOT.parent / "shared" / "data" / "qa"


def index_passages(retriever) -> list[tuple[str, str]]:
    """Every ``(title, text)`` of an IndexRetriever's index, in index order."""
    index = retriever.index
    return [(hit.title, hit.text or "") for shard in range(len(index.shards))
            for hit in (index.hit(shard, row, 0.0) for row in range(len(index.passage_ids(shard))))]


def article_texts(retriever) -> dict[str, str]:
    """title -> the text of all its passages, in index order (from an IndexRetriever's index)."""
    texts: dict[str, list[str]] = {}
    for title, text in index_passages(retriever):
        texts.setdefault(title, []).append(text)
    return {title: " ".join(parts) for title, parts in texts.items()}


def sample_questions(articles: dict[str, str], qa_dir: Path = QA_DIR) -> tuple[list[dict], list[str]]:
    """Every kept question as ``{question, answers, article, source, split}``, and notes."""
    return real_questions(articles, qa_dir)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="wikirag workspace with the sample index (default $WIKIRAG_HOME)")
    parser.add_argument("--show", choices=SPLITS, help="also print that split's questions")
    args = parser.parse_args()
    from runtime.settings import Settings, quiet_environment
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
