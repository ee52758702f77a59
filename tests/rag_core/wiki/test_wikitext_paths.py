"""The cleaner's fast paths against the straightforward ones they replaced, on real and mangled text.

The cleaner takes shortcuts for speed: a bracket-free template or link is one
token of the bracket-matching loop instead of two, and comment and tag bodies
are matched as runs without the closer's first character instead of with a
lazy ``.*?``.  Each shortcut must give exactly what the plain algorithm gives:
checked here on every real article of the samples, and on pieces of them with
brackets, table marks, tags and comments spliced in at random (seeded).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from rag_core.wiki import wikitext
from rag_core.wiki.dumps import DumpSource, iter_pages
from tests.conftest import SAMPLE_BZ2, TABLES_BZ2

_LINK_TOKEN = re.compile(r"\[\[|\]\]")
_BLOCK_TOKEN = re.compile(r"\{\{|\}\}|\{\||\|\}(?!\})")
_LAZY_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_LAZY_PAIRED = re.compile(rf"<({wikitext._DROPPED_TAGS})\b[^>]*>.*?</\1\s*>", re.I | re.S)
_PLAIN_SELF_CLOSING = re.compile(rf"<(?:{wikitext._DROPPED_TAGS})\b[^>]*/\s*>", re.I)
SPLICES = [
    "[[", "]]", "[", "]", "{{", "}}", "{|", "|}", "\n{|", "\n|}", "|", ":", "\n", "\n\n", "  ", "[[File:", "[[fr:",
    "[[:Category:", "]]]", "[[[", "<ref>", "</ref>", "<REF name=a/>", "<math>", "</math>", "<!--", "-->", "-", "''",
]


def plain_links(text: str) -> str:
    """Links replaced with one loop step per ``[[`` and ``]]`` token: the reference."""
    out, depth, keep_from, start = [], 0, 0, 0
    for m in _LINK_TOKEN.finditer(text):
        if m.group() == "[[":
            if depth == 0:
                out.append(text[keep_from : m.start()])
                start = m.end()
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                inner = text[start : m.start()]
                out.append(wikitext._link_text(inner) if "[[" not in inner else "")
                keep_from = m.end()
        else:
            out.append(text[keep_from : m.start()])
            keep_from = m.end()
    if depth == 0:  # else an unclosed "[[" drops the rest (the text before it is out already)
        out.append(text[keep_from:])
    return "".join(out)


def plain_blocks(text: str) -> str:
    """Templates and tables dropped with one loop step per token: the reference."""
    out, stack, keep_from = [], [], 0
    for m in _BLOCK_TOKEN.finditer(text):
        tok = m.group()
        if "|" in tok and text[text.rfind("\n", 0, m.start()) + 1 : m.start()].strip():
            continue
        if tok in ("{{", "{|"):
            if not stack:
                out.append(text[keep_from : m.start()])
            stack.append(("}}" if tok == "{{" else "|}", m.start()))
            continue
        depth = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == tok), None)
        if depth is None:
            if not stack:
                out.append(text[keep_from : m.start()])
                keep_from = m.end()
            continue
        del stack[depth:]
        if not stack:
            keep_from = m.end()
    if stack:
        end = text.find("\n\n", stack[0][1])
        if end >= 0:
            out.append(plain_blocks(text[end:]))
    else:
        out.append(text[keep_from:])
    return "".join(out)


def plain_tags(text: str) -> str:
    return _LAZY_PAIRED.sub("", _PLAIN_SELF_CLOSING.sub("", _LAZY_COMMENT.sub("", text)))


def fast_tags(text: str) -> str:
    return wikitext._PAIRED.sub("", wikitext._SELF_CLOSING.sub("", wikitext._COMMENT.sub("", text)))


@pytest.fixture(scope="module")
def texts(wiki: Path) -> list[str]:
    pages = list(iter_pages(DumpSource(str(SAMPLE_BZ2)))) + list(iter_pages(DumpSource(str(TABLES_BZ2))))
    return [p.text for p in pages if p.text]


def mangled(texts: list[str], n: int, seed: int) -> list[str]:
    """Pieces of real text (up to 3,000 characters) with up to 12 markup fragments spliced in."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = rng.choice(texts)
        start = rng.randrange(len(text) + 1)
        parts = list(text[start : start + rng.randrange(3000)])
        for _ in range(rng.randrange(13)):
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(SPLICES))
        out.append("".join(parts))
    return out


def test_fast_paths_equal_the_plain_ones_on_real_articles(texts: list[str]) -> None:
    for text in texts:
        tags = fast_tags(text)
        assert tags == plain_tags(text)
        blocks = wikitext._remove_blocks(tags)
        assert blocks == plain_blocks(tags)
        assert wikitext._replace_links(blocks) == plain_links(blocks)


def test_fast_paths_equal_the_plain_ones_on_mangled_text(texts: list[str]) -> None:
    for text in mangled(texts, 3000, seed=0):
        assert fast_tags(text) == plain_tags(text), text
        assert wikitext._remove_blocks(text) == plain_blocks(text), text
        assert wikitext._replace_links(text) == plain_links(text), text


def test_spaces_before_punctuation_and_runs() -> None:
    # Runs of spaces collapse first, so "one space before" is all the spaces there were.
    assert wikitext._spaces("a  ,\tb\u00a0 .c\u2009 )  d") == "a, b.c) d"
