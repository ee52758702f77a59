"""Real, human-written questions about an index's articles, and their fixed dev / test split.

Sources:

- **written**: sample_questions.jsonl beside this module (shipped with the package), questions
  written about the sample's articles (``{"question", "answers", "article"}`` per line);
- **NQ-open**: ``<qa_dir>/nq_open/*.jsonl`` (``{"question", "answer": [...]}``);
- **WebQuestions**: ``<qa_dir>/webquestions/*.json`` (``[{"qText", "answers": [...]}]``);
- **CuratedTrec**: ``<qa_dir>/curatedtrec/*.tsv`` (``id, factoid, question, answer regex``).

The public sources are optional (``qa_dir`` None or absent: written questions only). A public
question is kept when it names one of the articles (the title, whole words, 4 characters or more;
the longest such title wins) and one of its answers (3 characters or more after normalisation)
occurs, whole words, in that article's text. CuratedTrec answers are regular expressions: their
gold strings are the distinct whole-word spans the regex matches in the article. A written
question is kept when one of its answers occurs in its article's text. A question is dropped when
a gold answer occurs in the question itself (echoing the question would count as an answer), and
so are the questions the reader's prompt was first chosen on. A question asked twice (after
normalisation) is kept once, from the first source in the order above.

The split is a pure function of the normalised question (:func:`split_of`: sha256, even -> dev,
odd -> test), so it does not depend on which sources are present, on their order or on the
articles: a question is in the same split on every machine. Tune on dev; gate and report on test;
train on neither.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

from rag_core.evaluate.normalize import normalize_answer as normalize
from rag_core.train.examples import Example, Provenance

WRITTEN = Path(__file__).with_name("sample_questions.jsonl")
SPLITS = ("dev", "test")
SOURCES = ("written", "NQ-open", "WebQuestions", "CuratedTrec")
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


def real_questions(articles: Mapping[str, str], qa_dir: Path | None = None) -> tuple[list[dict], list[str]]:
    """Every kept question (module docstring) as ``{question, answers, article, source, split}``, and notes;
    ``articles``: title -> the text of all its passages."""
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

    dropped = 0
    for line in WRITTEN.read_text().splitlines():
        item = json.loads(line)
        if any(contains(normalized.get(item["article"], ""), normalize(a)) for a in item["answers"]):
            keep(item["question"], item["answers"], item["article"], "written")
        else:
            dropped += 1
    if dropped:
        notes.append(f"{dropped} written questions dropped: their answer is not in their article here")
    if qa_dir is None or not qa_dir.is_dir():
        notes.append(f"public questions (NQ-open, WebQuestions, CuratedTrec) not found at {qa_dir}: written "
                     "questions only")
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


def as_examples(items: list[dict], kind: str = "nq") -> list[Example]:
    """Kept questions as examples of an open-QA ``kind`` (EM and F1 over their gold answers), their article as
    provenance."""
    return [Example(f"{item['source']}-{i}", item["question"], tuple(item["answers"]), kind,
                    provenance=(Provenance(title=item["article"]),)) for i, item in enumerate(items)]


def answer_in_output(prediction: str, golds: tuple[str, ...] | list[str]) -> float:
    """1.0 when a normalised gold answer occurs, whole words, in the normalised prediction."""
    said = normalize(prediction)
    return float(any(contains(said, normalize(g)) for g in golds if normalize(g)))
