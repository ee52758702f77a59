"""``wikirag search``'s input and output: questions read from the arguments and a file, answers printed."""

from __future__ import annotations

import itertools
import json
import sys
import textwrap
from collections.abc import Iterable, Iterator
from typing import Any

from rag_core.errors import WikiragError


def read_questions(path: str | None, questions: list[str]) -> Iterator[str]:
    """Questions from the arguments, then one per non-blank line of ``path`` ('-' is stdin).

    The file is read lazily, line by line as the caller asks for questions, so a file of any length (or a pipe
    that is still being written) costs the memory of one batch. Opening it, and finding at least one question,
    happen here, before any work.
    """
    return (question for _, question in located_questions(path, questions))


def located_questions(path: str | None, questions: list[str]) -> Iterator[tuple[str, str]]:
    """:func:`read_questions`' questions, each after where it came from: "question N" for the Nth argument,
    "FILE line N" for a line of the file ("stdin line N"), so that a message about one names what to fix."""
    given = [(f"question {n}", q.strip()) for n, q in enumerate(questions, 1) if q.strip()]
    lines = _question_lines(path, _open_questions(path)) if path else iter(())
    if not given:
        first = next(lines, None)
        if first is None:
            raise WikiragError("no questions: give them as arguments or one per line in --questions FILE")
        given = [first]
    return itertools.chain(given, lines)


def _open_questions(path: str) -> Any:
    if path == "-":
        return sys.stdin
    try:
        return open(path, encoding="utf-8")  # noqa: SIM115 -- closed by _question_lines when it ends
    except OSError as exc:
        raise _unreadable(path, exc) from exc


def _question_lines(path: str, stream: Any) -> Iterator[tuple[str, str]]:
    name = "stdin" if path == "-" else path
    try:
        for number, line in enumerate(stream, 1):
            if line.strip():
                yield f"{name} line {number}", line.strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise _unreadable(path, exc) from exc
    finally:
        if stream is not sys.stdin:
            stream.close()


def _unreadable(path: str, exc: Exception) -> WikiragError:
    return WikiragError(f"{path}: cannot read the questions file ({exc.__class__.__name__}: {exc}); "
                        "give a UTF-8 text file with one question per line")


def print_results(results: Iterable[dict], *, as_json: bool) -> None:
    """JSON lines, or a readable list: the question, then each passage's score, title and opening words.

    Each answer is flushed as it is printed, so a reader of a pipe sees it while later questions are searched.
    """
    for item in results:
        if as_json:
            print(json.dumps(item, ensure_ascii=False), flush=True)
            continue
        print(f"Q: {item['question']}")
        for rank, hit in enumerate(item["results"], 1):
            snippet = textwrap.shorten(hit["text"] or "", width=160, placeholder=" ...")
            print(f"  {rank}. [{hit['score']:.3f}] {hit['title']}: {snippet}")
        print(flush=True)
