"""A malformed task file is one TaskDataError naming the file and the line: small corrupted copies of real files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rag_core.errors import WikiragError
from rag_core.train import Example, TaskDataError, load_task, write_examples
from tests.rag_core.train.qafiles import qa_file


def _lines(relative: str, n: int) -> list[str]:
    return qa_file(relative).read_text(encoding="utf-8").splitlines()[:n]


def _fails(kind: str, path: Path, line: int, problem: str) -> str:
    with pytest.raises(TaskDataError) as info:
        load_task(kind, str(path))
    message = str(info.value)
    assert isinstance(info.value, WikiragError)
    assert re.match(rf"{re.escape(str(path))}, line {line}( \(record \d+\))?: ", message), message
    assert problem in message, message
    assert "\n" not in message and "expected" in message  # one line, with the format to fix it to
    return message


@pytest.mark.parametrize(("line", "replacement", "problem"), [
    (3, '{"question": "who", "answer": ["x"]', "not JSON"),
    (2, '{"question": "who wrote it"}', "missing field 'answer'"),
    (4, '{"question": "who wrote it", "answer": "Bob"}', "field 'answer' is str"),
    (5, '{"question": 7, "answer": ["Bob"]}', "field 'question' is int"),
    (2, '{"question": "   ", "answer": ["Bob"]}', "empty 'question'"),
    (3, '{"question": "who wrote it", "answer": []}', "empty 'answer'"),
    (3, '{"question": "who wrote it", "answer": ["Bob", ""]}', "empty answer[1]"),
    (4, '["who wrote it", ["Bob"]]', "not a JSON object"),
])
def test_nq_open(tmp_path: Path, line: int, replacement: str, problem: str) -> None:
    lines = _lines("nq_open/NQ-open.dev.jsonl", 6)
    lines[line - 1] = replacement
    path = tmp_path / "nq.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _fails("nq", path, line, problem)


def test_fever_unknown_label(tmp_path: Path) -> None:
    lines = _lines("fever/paper_dev.jsonl", 5)
    record = json.loads(lines[3])
    record["label"] = "MAYBE"
    lines[3] = json.dumps(record)
    path = tmp_path / "fever.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    for kind in ("fever3", "fever2"):  # fever2 leaves NEI out but still knows it is a label
        assert "unknown label 'MAYBE'" in _fails(kind, path, 4, "unknown label")


def test_curatedtrec_regex_that_does_not_compile_and_short_rows(tmp_path: Path) -> None:
    lines = _lines("curatedtrec/large2180-train.tsv", 4)
    path = tmp_path / "trec.tsv"
    path.write_text("\n".join([*lines[:2], "77\tfactoid\tWho?\t(unclosed|group", lines[3]]), encoding="utf-8")
    _fails("curatedtrec", path, 3, "does not compile")
    path.write_text("\n".join([*lines[:1], "77\tfactoid\tWho?"]), encoding="utf-8")
    _fails("curatedtrec", path, 2, "3 tab-separated fields, not 4")
    path.write_text("\n".join([*lines[:1], "77\tfactoid\t \tBob"]), encoding="utf-8")
    _fails("curatedtrec", path, 2, "empty question")


def test_triviaqa_record_is_named_by_its_line_in_a_pretty_printed_file(tmp_path: Path) -> None:
    data = json.loads(qa_file("triviaqa/web-dev-sample.json").read_text(encoding="utf-8"))
    del data["Data"][2]["Answer"]["Value"]
    text = json.dumps(data, indent=4)
    path = tmp_path / "trivia.json"
    path.write_text(text, encoding="utf-8")
    starts = [i + 1 for i, line in enumerate(text.splitlines()) if line == " " * 8 + "{"]  # records open here
    _fails("triviaqa", path, starts[2], "missing field 'Value'")
    path.write_text(json.dumps({"Version": 1.0}), encoding="utf-8")
    _fails("triviaqa", path, 1, "missing field 'Data'")


def test_webquestions_truncated_json(tmp_path: Path) -> None:
    text = qa_file("webquestions/main_val.json").read_text(encoding="utf-8")
    path = tmp_path / "wq.json"
    path.write_text("\n".join(text.splitlines()[:5]), encoding="utf-8")  # cut after the 4th record
    _fails("webquestions", path, 5, "not JSON")


def test_jeopardy_answer_of_the_wrong_type(tmp_path: Path) -> None:
    records = json.loads(qa_file("searchqa/jeopardy_tiny.json").read_text(encoding="utf-8"))
    records[1]["answer"] = 1912
    path = tmp_path / "jeopardy.json"
    path.write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]", encoding="utf-8")
    _fails("jeopardy", path, 3, "field 'answer' is int")
    path.write_text(json.dumps(records), encoding="utf-8")  # minified: every record on line 1
    assert "line 1 (record 2): field 'answer' is int" in _fails("jeopardy", path, 1, "field 'answer' is int")


def test_kilt_without_answers_or_with_an_empty_one(tmp_path: Path) -> None:
    lines = _lines("kilt/nq-dev-kilt.jsonl", 3)
    record = json.loads(lines[1])
    record["output"] = [o for o in record["output"] if "answer" not in o]
    path = tmp_path / "kilt.jsonl"
    path.write_text("\n".join([lines[0], json.dumps(record), lines[2]]), encoding="utf-8")
    _fails("kilt", path, 2, "no answer in 'output'")
    record["output"] = [{"answer": " "}]
    path.write_text("\n".join([lines[0], lines[2], json.dumps(record)]), encoding="utf-8")
    _fails("kilt", path, 3, "empty output[0].answer")


def test_examples_file_of_another_kind(tmp_path: Path) -> None:
    path = tmp_path / "cloze.jsonl"
    write_examples([Example("1", "A: [MASK] is here.", ("Bob",), "cloze"), Example("2", "q", ("a",), "nq")],
                   str(path))
    _fails("cloze", path, 2, "an example of kind 'nq' in a 'cloze' file")


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskDataError, match="no such file"):
        load_task("nq", str(tmp_path / "absent.jsonl"))
    with pytest.raises(TaskDataError, match="unknown task kind 'squad'"):
        load_task("squad", str(tmp_path / "absent.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"empty.jsonl: no nq examples in the file"):
        load_task("nq", str(empty))
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(b'{"question": "ok", "answer": ["a"]}\n{"question": "caf\xe9", "answer": ["a"]}\n')
    with pytest.raises(TaskDataError, match=r"latin1.jsonl, line 2: not UTF-8"):
        load_task("nq", str(latin))
