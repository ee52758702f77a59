"""Loaders for the RAG paper's tasks, each in its original file format, and the registry of task kinds.

``load_task(kind, url)`` reads a whole file into :class:`Example` records or
raises one :class:`TaskDataError` naming the file, the line and what is
wrong (not JSON, a missing field, a wrong type, an empty question or answer,
an unknown label, a regex that does not compile).

| kind | format | input | targets |
|---|---|---|---|
| nq | NQ-open jsonl | question | answers |
| triviaqa | TriviaQA json (``{"Data": [...]}``) | Question | Answer.Value, then its Aliases |
| webquestions | WebQuestions json array | qText | answers |
| curatedtrec | tsv ``id, type, question, answer regex`` | question | strings the regex accepts |
| msmarco | MS-MARCO jsonl | query | wellFormedAnswers if any, else answers |
| jeopardy | SearchQA's Jeopardy! json array | answer | the clue (the paper generates it) |
| fever3 / fever2 | FEVER jsonl | claim | the label as text; fever2 drops NOT ENOUGH INFO |
| kilt | KILT jsonl | input | output answers (provenance: wikipedia ids, titles) |
| cloze | examples jsonl (``rag_core.train.cloze``) | masked sentence + title | the masked span |
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rag_core.train.examples import Example, Provenance, TaskDataError, provenance_from_json
from rag_core.train.readers import (
    Where,
    as_object,
    get_field,
    get_id,
    get_text,
    get_texts,
    json_array_records,
    jsonl_records,
    read_text,
    tsv_rows,
)
from rag_core.train.regex_answers import regex_targets

FEVER_LABELS = ("SUPPORTS", "REFUTES", "NOT ENOUGH INFO")
# FEVER's page names escape brackets and colons the way the Penn Treebank does.
_PTB = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}", "-COLON-": ":"}


@dataclass(frozen=True)
class TaskKind:
    name: str
    format: str  # what a file of this kind looks like (quoted in errors)
    parse: Callable[[str, str], Iterator[Example]]  # (url, text) -> examples
    labels: tuple[str, ...] | None = None  # the closed set of labels, for classification tasks


def _nq(url: str, text: str) -> Iterator[Example]:
    fmt = TASK_KINDS["nq"].format
    for i, (where, obj) in enumerate(jsonl_records(url, text, fmt)):
        obj = as_object(obj, where)
        yield Example(get_id(obj, "id", i), get_text(obj, "question", where), get_texts(obj, "answer", where), "nq")


def _triviaqa(url: str, text: str) -> Iterator[Example]:
    fmt = TASK_KINDS["triviaqa"].format
    for i, (where, obj) in enumerate(json_array_records(url, text, fmt, member="Data")):
        obj = as_object(obj, where)
        question = get_text(obj, "Question", where)
        answer = get_field(obj, "Answer", dict, where)
        value = get_text(answer, "Value", where)
        aliases = get_texts(answer, "Aliases", where) if answer.get("Aliases") else ()
        targets = tuple(dict.fromkeys((value, *aliases)))
        yield Example(get_id(obj, "QuestionId", i), question, targets, "triviaqa")


def _webquestions(url: str, text: str) -> Iterator[Example]:
    fmt = TASK_KINDS["webquestions"].format
    for i, (where, obj) in enumerate(json_array_records(url, text, fmt)):
        obj = as_object(obj, where)
        yield Example(get_id(obj, "qId", i), get_text(obj, "qText", where), get_texts(obj, "answers", where),
                      "webquestions")


def _curatedtrec(url: str, text: str) -> Iterator[Example]:
    fmt = TASK_KINDS["curatedtrec"].format
    for where, fields in tsv_rows(url, text, fmt):
        if len(fields) < 4:
            raise where.error(f"{len(fields)} tab-separated fields, not 4")
        # One real line (id 462) has a tab inside its regex: everything after the question is the regex.
        qid, question, pattern = fields[0].strip(), fields[2].strip(), "\t".join(fields[3:]).strip()
        if not qid:
            raise where.error("empty id")
        if not question:
            raise where.error("empty question")
        if not pattern:
            raise where.error("empty answer regex")
        try:
            targets = regex_targets(pattern)
        except re.error as exc:
            raise where.error(f"the answer regex {pattern[:60]!r} does not compile ({exc})") from None
        if not targets:
            raise where.error(f"the answer regex {pattern[:60]!r} gives no answer text to train on; add a plain "
                              "alternative (a|b)")
        yield Example(qid, question, targets, "curatedtrec", answer_regex=pattern)


def _msmarco(url: str, text: str) -> Iterator[Example]:
    fmt = TASK_KINDS["msmarco"].format
    for i, (where, obj) in enumerate(jsonl_records(url, text, fmt)):
        obj = as_object(obj, where)
        query = get_text(obj, "query", where)
        # v2.1 writes "[]" (a string) where no well-formed answer exists
        well_formed = obj.get("wellFormedAnswers")
        key = "wellFormedAnswers" if isinstance(well_formed, list) and well_formed else "answers"
        yield Example(get_id(obj, "query_id", i), query, get_texts(obj, key, where), "msmarco")


def _jeopardy_text(obj: Mapping[str, Any], key: str, where: Where) -> str:
    # SearchQA's Jeopardy! dump wraps clues in single quotes and backslash-escapes quotes inside.
    value = get_text(obj, key, where)
    if len(value) >= 2 and value[0] == value[-1] == "'":
        value = value[1:-1].strip()
    value = value.replace("\\'", "'").replace('\\"', '"')
    if not value:
        raise where.error(f"empty {key!r}")
    return value


def _jeopardy(url: str, text: str) -> Iterator[Example]:
    fmt = TASK_KINDS["jeopardy"].format
    for i, (where, obj) in enumerate(json_array_records(url, text, fmt)):
        obj = as_object(obj, where)
        answer, clue = _jeopardy_text(obj, "answer", where), _jeopardy_text(obj, "question", where)
        yield Example(str(i), answer, (clue,), "jeopardy")


def fever_title(page: str) -> str:
    """A FEVER page name (``Soul_Food_-LRB-film-RRB-``) as a Wikipedia title (``Soul Food (film)``)."""
    for code, char in _PTB.items():
        page = page.replace(code, char)
    return page.replace("_", " ")


def _fever_provenance(obj: Mapping[str, Any], where: Where) -> tuple[Provenance, ...]:
    evidence = get_field(obj, "evidence", list, where)
    titles: list[str] = []
    for group in evidence:
        if not isinstance(group, list) or not all(isinstance(item, list) and len(item) == 4 for item in group):
            raise where.error("field 'evidence' is not a list of evidence sets [[annotation, id, page, sentence]]")
        titles.extend(fever_title(item[2]) for item in group if isinstance(item[2], str) and item[2])
    return tuple(Provenance(title=t) for t in dict.fromkeys(titles))


def _fever(kind: str) -> Callable[[str, str], Iterator[Example]]:
    def parse(url: str, text: str) -> Iterator[Example]:
        spec = TASK_KINDS[kind]
        for i, (where, obj) in enumerate(jsonl_records(url, text, spec.format)):
            obj = as_object(obj, where)
            claim, label = get_text(obj, "claim", where), get_text(obj, "label", where)
            if label not in FEVER_LABELS:
                raise where.error(f"unknown label {label!r} (labels: {', '.join(FEVER_LABELS)})")
            if label in spec.labels:  # fever2 leaves out NOT ENOUGH INFO
                yield Example(get_id(obj, "id", i), claim, (label,), kind, label=label,
                              provenance=_fever_provenance(obj, where))

    return parse


def _kilt(url: str, text: str) -> Iterator[Example]:
    fmt = TASK_KINDS["kilt"].format
    for where, obj in jsonl_records(url, text, fmt):
        obj = as_object(obj, where)
        qid, question = str(get_field(obj, "id", (str, int), where)), get_text(obj, "input", where)
        answers: list[str] = []
        pages: list[Provenance] = []
        for j, out in enumerate(get_field(obj, "output", list, where)):
            out = as_object(out, where)
            if "answer" in out:
                answer = get_field(out, "answer", str, where).strip()
                if not answer:
                    raise where.error(f"empty output[{j}].answer")
                answers.append(answer)
            for item in get_field(out, "provenance", list, where) if "provenance" in out else []:
                item = as_object(item, where)
                page_id, title = item.get("wikipedia_id"), item.get("title")
                if page_id is None and title is None:
                    raise where.error(f"output[{j}].provenance has neither 'wikipedia_id' nor 'title'")
                pages.append(Provenance(None if page_id is None else str(page_id), title))
        if not answers:
            raise where.error("no answer in 'output'")
        yield Example(qid, question, tuple(dict.fromkeys(answers)), "kilt", provenance=tuple(dict.fromkeys(pages)))


def _examples(kind: str) -> Callable[[str, str], Iterator[Example]]:
    def parse(url: str, text: str) -> Iterator[Example]:
        for where, obj in jsonl_records(url, text, TASK_KINDS[kind].format):
            obj = as_object(obj, where)
            found = get_text(obj, "kind", where)
            if found != kind:
                raise where.error(f"an example of kind {found!r} in a {kind!r} file")
            provenance = get_field(obj, "provenance", list, where) if "provenance" in obj else []
            if not all(isinstance(p, dict) for p in provenance):
                raise where.error("field 'provenance' is not a list of objects")
            optional = {key: get_text(obj, key, where) for key in ("answer_regex", "label") if key in obj}
            yield Example(get_text(obj, "id", where), get_text(obj, "input", where), get_texts(obj, "targets", where),
                          kind, provenance=provenance_from_json(provenance), **optional)

    return parse


TASK_KINDS: dict[str, TaskKind] = {
    spec.name: spec
    for spec in (
        TaskKind("nq", 'NQ-open jsonl, one {"question": str, "answer": [str, ...]} per line', _nq),
        TaskKind("triviaqa", 'TriviaQA json {"Data": [{"Question": str, "Answer": {"Value": str, "Aliases": '
                             "[str, ...]}}, ...]}", _triviaqa),
        TaskKind("webquestions", 'WebQuestions json [{"qId": str, "qText": str, "answers": [str, ...]}, ...]',
                 _webquestions),
        TaskKind("curatedtrec", "CuratedTrec tsv: id <tab> type <tab> question <tab> answer regex", _curatedtrec),
        TaskKind("msmarco", 'MS-MARCO jsonl, one {"query": str, "answers": [str, ...]} per line', _msmarco),
        TaskKind("jeopardy", 'SearchQA Jeopardy! json [{"question": clue, "answer": str, ...}, ...]', _jeopardy),
        TaskKind("fever3", 'FEVER jsonl, one {"id", "claim": str, "label": SUPPORTS|REFUTES|NOT ENOUGH INFO, '
                           '"evidence": [...]} per line', _fever("fever3"), FEVER_LABELS),
        TaskKind("fever2", 'FEVER jsonl, one {"id", "claim": str, "label": SUPPORTS|REFUTES|NOT ENOUGH INFO, '
                           '"evidence": [...]} per line', _fever("fever2"), FEVER_LABELS[:2]),
        TaskKind("kilt", 'KILT jsonl, one {"id": str, "input": str, "output": [{"answer": str, "provenance": '
                         '[{"wikipedia_id", "title"}]}]} per line', _kilt),
        TaskKind("cloze", 'examples jsonl, one {"id": str, "input": str, "targets": [str, ...], "kind": "cloze"} '
                          "per line (rag_core.train.cloze writes it)", _examples("cloze")),
        TaskKind("generated-qa", 'examples jsonl, kind "generated-qa" (rag_core.train.generated_qa_store writes it)',
                 _examples("generated-qa")),
    )
}


def task_kind(kind: str) -> TaskKind:
    if kind not in TASK_KINDS:
        raise TaskDataError(f"unknown task kind {kind!r}; choose one of {', '.join(TASK_KINDS)}")
    return TASK_KINDS[kind]


def load_task(kind: str, url: str, options: Mapping[str, Any] | None = None) -> list[Example]:
    """Every example of a task file (a path or URL; ``options`` reach fsspec, e.g. S3 credentials)."""
    spec = task_kind(kind)
    examples = list(spec.parse(url, read_text(url, options)))
    if not examples:
        raise TaskDataError(f"{url}: no {kind} examples in the file; expected {spec.format}")
    return examples
