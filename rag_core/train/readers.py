"""Records of a task file with the line each starts on, and field checks that name it.

jsonl and tsv files are read line by line. Files that are one JSON document
(TriviaQA, WebQuestions, SearchQA's Jeopardy) are walked element by element
with :meth:`json.JSONDecoder.raw_decode`, so that each record still knows its
line and a bad one is reported where it is, not as "somewhere in the file".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fsspec.core import url_to_fs

from rag_core.storage import translate_errors, watch_retries
from rag_core.train.examples import TaskDataError

_DECODER = json.JSONDecoder()
_TYPE_NAMES = {str: "a string", list: "a list", dict: "an object", int: "an integer"}


@dataclass(frozen=True)
class Where:
    """A record's place: the file, its line, and the format the file should have (for the fix)."""

    url: str
    line: int
    format: str
    record: int | None = None  # 1-based position in a JSON array (a minified file is all on line 1)

    def error(self, problem: str) -> TaskDataError:
        record = f" (record {self.record})" if self.record is not None else ""
        return TaskDataError(f"{self.url}, line {self.line}{record}: {problem}; expected {self.format}")


def read_text(url: str, options: Mapping[str, Any] | None = None) -> str:
    """The whole file as text (UTF-8); a missing file or bad encoding is a TaskDataError."""
    with translate_errors(url, "reading"):
        try:
            fs, path = url_to_fs(url, **dict(options or {}))
            watch_retries(fs, options or {})
            data = fs.cat_file(path)
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise TaskDataError(f"{url}: no such file; check the path or URL") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TaskDataError(f"{url}, line {line}: not UTF-8 text ({exc.reason}); save the file as UTF-8") from exc


def _lines(text: str) -> Iterator[tuple[int, str]]:
    # Not str.splitlines: JSON strings may hold U+2028 and other characters it would split on.
    for number, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if line.strip():
            yield number, line


def jsonl_records(url: str, text: str, fmt: str) -> Iterator[tuple[Where, Any]]:
    """One JSON value per non-blank line."""
    for number, line in _lines(text):
        where = Where(url, number, fmt)
        try:
            yield where, json.loads(line)
        except json.JSONDecodeError as exc:
            raise where.error(f"not JSON ({exc.msg} at column {exc.colno})") from None


def tsv_rows(url: str, text: str, fmt: str) -> Iterator[tuple[Where, list[str]]]:
    """Tab-separated fields of each non-blank line."""
    for number, line in _lines(text):
        yield Where(url, number, fmt), line.split("\t")


class _Cursor:
    """A position in a JSON text and its line, counted incrementally (linear in the file)."""

    def __init__(self, url: str, text: str, fmt: str) -> None:
        self.url, self.text, self.fmt = url, text, fmt
        self.pos, self.line, self._counted = 0, 1, 0

    def where(self) -> Where:
        self.line += self.text.count("\n", self._counted, self.pos)
        self._counted = self.pos
        return Where(self.url, self.line, self.fmt)

    def skip_space(self) -> str:
        while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, chars: str, what: str) -> str:
        char = self.skip_space()
        if not char or char not in chars:
            found = repr(char) if char else "the end of the file"
            raise self.where().error(f"not JSON: {what} expected, found {found}")
        self.pos += 1
        return char

    def value(self) -> Any:
        self.skip_space()
        try:
            obj, self.pos = _DECODER.raw_decode(self.text, self.pos)
        except json.JSONDecodeError as exc:
            self.pos = exc.pos
            raise self.where().error(f"not JSON ({exc.msg})") from None
        return obj


def _array(cursor: _Cursor) -> Iterator[tuple[Where, Any]]:
    cursor.expect("[", "'['")
    if cursor.skip_space() == "]":
        cursor.pos += 1
        return
    record = 0
    while True:
        cursor.skip_space()
        record += 1
        where = dataclasses.replace(cursor.where(), record=record)
        yield where, cursor.value()
        if cursor.expect(",]", "',' or ']'") == "]":
            return


def json_array_records(url: str, text: str, fmt: str, member: str | None = None) -> Iterator[tuple[Where, Any]]:
    """The elements of a top-level JSON array, or of the array in the top-level object's ``member``."""
    cursor = _Cursor(url, text, fmt)
    if member is None:
        yield from _array(cursor)
    else:
        cursor.expect("{", "'{'")
        found = False
        while cursor.skip_space() != "}":
            key = cursor.value()
            cursor.expect(":", "':'")
            if key == member:
                found = True
                yield from _array(cursor)
            else:
                cursor.value()
            if cursor.expect(",}", "',' or '}'") == "}":
                break
        else:
            cursor.pos += 1
        if not found:
            raise Where(url, 1, fmt).error(f"missing field {member!r} in the top-level object")
    if cursor.skip_space():
        raise cursor.where().error("not JSON: extra data after the document")


# -- field checks ------------------------------------------------------------------------------
def as_object(obj: Any, where: Where) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise where.error(f"a record is {type(obj).__name__}, not a JSON object")
    return obj


def get_field(obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: Where) -> Any:
    if key not in obj:
        raise where.error(f"missing field {key!r}")
    value = obj[key]
    if not isinstance(value, types) or isinstance(value, bool):
        wanted = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in (types if isinstance(types, tuple) else (types,)))
        raise where.error(f"field {key!r} is {type(value).__name__} {json.dumps(value)[:40]}, not {wanted}")
    return value


def get_text(obj: Mapping[str, Any], key: str, where: Where) -> str:
    """A non-empty string field, whitespace-trimmed."""
    value = get_field(obj, key, str, where).strip()
    if not value:
        raise where.error(f"empty {key!r}")
    return value


def get_texts(obj: Mapping[str, Any], key: str, where: Where) -> tuple[str, ...]:
    """A non-empty list of non-empty strings, trimmed, duplicates dropped (order kept)."""
    values = get_field(obj, key, list, where)
    out: list[str] = []
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise where.error(f"{key}[{i}] is {type(value).__name__}, not a string")
        if not value.strip():
            raise where.error(f"empty {key}[{i}]")
        if value.strip() not in out:
            out.append(value.strip())
    if not out:
        raise where.error(f"empty {key!r} (no answers)")
    return tuple(out)


def get_id(obj: Mapping[str, Any], key: str, fallback: int) -> str:
    """The dataset's own id as a string when present, else the record's position."""
    value = obj.get(key)
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value) else str(fallback)
