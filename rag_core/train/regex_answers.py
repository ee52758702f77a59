"""Plain answer strings from CuratedTrec's answer regular expressions, for the generator to learn.

CuratedTrec gives each answer as a pattern (``Sept?(ember)?|Feb(ruary)?``);
metrics score predictions against the pattern itself, but a generator needs
text to imitate. For each top-level alternative we build one string the
pattern accepts: optional words are kept (``Sept?(ember)?`` gives
"September"), optional punctuation is dropped, ``\\s*`` and ``.*`` become one
space, a character class gives its first member. A string is kept only if
the pattern matches it, so a target is never something the metric would
reject. The walk uses Python's own regex parser (``re._parser``, the
module behind ``re.compile``), so it reads the patterns exactly as the metric
does.
"""

from __future__ import annotations

import re
from re import _constants as C
from re import _parser
from typing import Any

_CATEGORY = {C.CATEGORY_SPACE: " ", C.CATEGORY_DIGIT: "0", C.CATEGORY_WORD: "a"}


class _Unsupported(Exception):
    pass


def split_alternatives(pattern: str) -> list[str]:
    """The pattern's top-level ``|`` alternatives (outside groups, classes and escapes)."""
    parts, depth, in_class, start, i = [], 0, False, 0, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            if pattern[i + 1: i + 2] == "]" or pattern[i + 1: i + 3] == "^]":  # a leading ']' is a member
                i += 2 if pattern[i + 1] == "]" else 3
                continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def _one(op: Any, arg: Any, repeated: bool) -> str:
    if op is C.LITERAL:
        return chr(arg)
    if op is C.NOT_LITERAL:
        return " " if arg != ord(" ") else "-"
    if op is C.ANY:  # written as "St. Louis" it means a dot; as ".*" it means "anything between"
        return " " if repeated else "."
    if op is C.IN:
        first_op, first_arg = arg[0]
        if first_op is C.NEGATE:
            return " "
        if first_op is C.LITERAL:
            return chr(first_arg)
        if first_op is C.RANGE:
            return chr(first_arg[0])
        if first_op is C.CATEGORY and first_arg in _CATEGORY:
            return _CATEGORY[first_arg]
        raise _Unsupported
    if op is C.CATEGORY and arg in _CATEGORY:
        return _CATEGORY[arg]
    if op is C.AT:
        return ""
    if op is C.BRANCH:
        return _expand(arg[1][0])
    if op is C.SUBPATTERN:
        return _expand(arg[-1])
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):
        low, _, sub = arg
        items = list(sub)
        text = _one(*items[0], True) if len(items) == 1 else _expand(items)
        if low > 0:
            return text * low
        keep = any(ch.isalnum() for ch in text) or (text != "" and text.isspace())
        return text if keep else ""
    raise _Unsupported


def _expand(items: Any) -> str:
    return "".join(_one(op, arg, False) for op, arg in items)


def regex_targets(pattern: str) -> tuple[str, ...]:
    """Plain strings that ``pattern`` matches, one per top-level alternative where one can be built."""
    compiled = re.compile(pattern, re.IGNORECASE | re.UNICODE | re.MULTILINE)
    out: list[str] = []
    for alternative in split_alternatives(pattern):
        try:
            text = " ".join(_expand(_parser.parse(alternative)).split())
        except (_Unsupported, re.error):
            continue
        if text and compiled.match(text) and text not in out:
            out.append(text)
    return tuple(out)
