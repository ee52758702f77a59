"""Wikitext to plain text, in the spirit of DPR's preprocessing.

Removed: templates and infoboxes, tables, references, files and images,
galleries, categories, interlanguage links, comments, magic words, math,
HTML tags, trailing reference sections (References, External links, ...).
Kept: link text, bold and italic text, list item text.  Section titles end
the paragraph they follow and are not themselves kept.

Nested constructs (templates in templates, links in image captions) are
removed with a bracket-matching pass over the tokens, not by regex alone, so
deep nesting costs one linear pass rather than one pass per level.
"""

from __future__ import annotations

import html
import operator
import re

# Bump when the output of clean_wikitext changes: passage sets are keyed by it.
CLEANER_VERSION = "2"

# Bodies are written as "runs without the closer's first character" rather than a lazy ".*?",
# which would try the closer at every character of every comment and reference.
_COMMENT = re.compile(r"<!--[^-]*(?:-(?!->)[^-]*)*(?:-->|\Z)")
_DROPPED_TAGS = (
    "ref|references|math|chem|ce|gallery|timeline|score|syntaxhighlight|source|imagemap|"
    "templatedata|mapframe|maplink|graph|hiero|inputbox|categorytree|noinclude|includeonly|indicator"
)
_SELF_CLOSING = re.compile(rf"<(?=[A-Za-z])(?:{_DROPPED_TAGS})\b[^>]*/\s*>", re.I)
_PAIRED = re.compile(rf"<(?=[A-Za-z])({_DROPPED_TAGS})\b[^>]*>[^<]*(?:<(?!/\1\s*>)[^<]*)*</\1\s*>", re.I)
# Table tokens count only at the start of a line; that is checked in Python, which keeps this
# pattern a plain character scan (a line anchor would make the engine try every position).
# A template with no brace inside is one token (one loop step instead of two); then the
# openers and closers.  (Capture groups would cost the engine its fast scan for "{", "}", "|".)
_BLOCK_TOKENS = re.compile(r"(\{\{[^{}]*\}\}|\{\{|\}\}|\{\||\|\}(?!\}))")  # one group: split keeps tokens
_CLOSER = {"{{": "}}", "{|": "|}"}
# A link with no bracket inside is one token (one loop step instead of two); then "[[" and "]]".
_LINK_TOKENS = re.compile(r"(\[\[[^\[\]]*\]\]|\[\[|\]\])")  # one group: split keeps tokens
# Interlanguage prefixes are lower case; an upper-case prefix is an ordinary title with a colon.
_LANG_PREFIX = re.compile(r"^\s*(?:[a-z]{2,3}(?:-[a-z]{2,8})*|simple)\s*:")
_NAMESPACE_PREFIX = re.compile(
    r"^\s*(?:file|image|media|category|wikipedia|wp|help|template|portal|special|user|module|draft)\s*:", re.I
)
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:|//)[^\s\]]*[ \t]*([^\]\n]*)\]")
_BARE_URL = re.compile(r"https?://\S+")
_BOLD_ITALIC = re.compile(r"''+")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_BREAK_TAG = re.compile(r"<br\s*/?>", re.I)
_HTML_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_LIST_MARKER = re.compile(r"^[*#:;]+\s*")
_ODD_SPACES = "\t\u00a0\u2009\u200b"  # each becomes a plain space
_MULTI_SPACE = re.compile(r"  +")
_EMPTY_PARENS = re.compile(r"\(\s*[,;]?\s*\)")
_PUNCT_AFTER_SPACE = ",.;:!?)"  # a space before one of these is dropped
# Python 3.11 expands a template such as r"\1" in Python for every match; a C callable does not.
_GROUP_1 = operator.itemgetter(1)

TRAILING_SECTIONS = frozenset(
    {
        "references",
        "external links",
        "see also",
        "notes",
        "further reading",
        "bibliography",
        "sources",
        "footnotes",
        "citations",
        "notes and references",
        "references and notes",
        "works cited",
    }
)

_DISAMBIGUATION = re.compile(
    r"\{\{\s*(?:disambiguation|disambig|disamb|dab|hndis|geodis|schooldis|hospitaldis|numberdis|mathdab|"
    r"letter-numbercombdis|[^{}|\n]{0,40}\bdisambiguation)\s*(?:\||\}\})",
    re.I,
)
_REDIRECT = re.compile(r"^\s*#redirect\s*:?\s*\[\[([^\]|#]*)", re.I)


def is_disambiguation(wikitext: str) -> bool:
    """True for pages that carry a disambiguation template."""
    return _DISAMBIGUATION.search(wikitext) is not None


def redirect_target(wikitext: str) -> str | None:
    """The target of a ``#REDIRECT [[...]]`` page, for exports without ``<redirect>``."""
    m = _REDIRECT.match(wikitext)
    return m.group(1).strip() if m else None


def _remove_blocks(text: str) -> str:
    """Drop templates ``{{...}}`` and tables ``{|...|}``, nested to any depth."""
    parts = _BLOCK_TOKENS.split(text)  # [text, token, text, token, ..., text]
    if len(parts) == 1:
        return text
    out = [parts[0]]
    stack: list[tuple[str, int]] = []  # (closing token, index in parts of the block's opener)
    for i in range(1, len(parts), 2):
        tok = parts[i]
        if len(tok) > 2:  # a whole template with no brace inside
            if not stack:
                out.append(parts[i + 1])
            continue  # inside another block, which is dropped whole
        if (tok[0] == "|" or tok[1] == "|") and not _at_line_start(parts, i):
            if not stack:
                out.append(tok)  # "{|" or "|}" inside a line is not a table
                out.append(parts[i + 1])
            continue
        closer = _CLOSER.get(tok)
        if closer is not None:
            stack.append((closer, i))
            continue
        if stack and stack[-1][0] == tok:  # the usual case: it closes the innermost block
            stack.pop()
        else:
            depth = next((k for k in range(len(stack) - 1, -1, -1) if stack[k][0] == tok), None)
            if depth is None:
                if not stack:  # a stray closer outside any block: drop just the token
                    out.append(parts[i + 1])
                continue
            del stack[depth:]
        if not stack:
            out.append(parts[i + 1])
    if stack:
        # An unclosed block swallows only the rest of its paragraph, not the article.
        rest = "".join(parts[stack[0][1] :])
        end = rest.find("\n\n")
        if end >= 0:
            out.append(_remove_blocks(rest[end:]))
    return "".join(out)


def _at_line_start(parts: list[str], i: int) -> bool:
    """Whether token ``parts[i]`` has only whitespace before it on its line (tokens are never blank)."""
    before = parts[i - 1]
    newline = before.rfind("\n")
    if newline >= 0:
        return not before[newline + 1 :].strip()
    return i == 1 and not before.strip()


def _link_text(inner: str) -> str:
    if ":" in inner and (_NAMESPACE_PREFIX.match(inner) or _LANG_PREFIX.match(inner)):
        return ""
    inner = inner.lstrip(":")
    target, bar, label = inner.partition("|")
    return (label if bar and label.strip() else target).strip()


def _replace_links(text: str) -> str:
    """``[[target|label]]`` to its label; files, categories and interwiki links dropped.

    A link holding another link is dropped whole; a stray ``]]`` is dropped; an
    unclosed ``[[`` drops the rest of the text.
    """
    parts = _LINK_TOKENS.split(text)  # [text, token, text, token, ..., text]
    if len(parts) == 1:
        return text
    out = [parts[0]]
    depth = 0
    inner: list[str] = []  # the open top-level link's text so far
    nested = False
    for i in range(1, len(parts), 2):
        tok, after = parts[i], parts[i + 1]
        if depth == 0:
            if len(tok) > 2:  # a whole link with no bracket inside: the usual case
                link = tok[2:-2]
                if ":" in link:
                    out.append(_link_text(link))
                else:
                    target, bar, label = link.partition("|")
                    label = label.strip() if bar else ""
                    out.append(label or target.strip())
                out.append(after)
            elif tok == "[[":
                depth, inner, nested = 1, [after], False
            else:  # a stray "]]": dropped
                out.append(after)
            continue
        if tok == "]]":
            depth -= 1
            if depth == 0:
                out.append("" if nested else _link_text("".join(inner)))
                out.append(after)
                continue
        else:
            nested = True
            if tok == "[[":
                depth += 1
        inner.append(tok)
        inner.append(after)
    return "".join(out)  # an unclosed "[[" leaves out everything after it


def _spaces(text: str) -> str:
    """Odd spaces to plain ones, runs of spaces to one, no space before closing punctuation."""
    for odd in _ODD_SPACES:
        if odd in text:
            text = text.replace(odd, " ")
    text = _MULTI_SPACE.sub(" ", text)
    # No run of spaces is left, so dropping "one space before" equals dropping "all spaces before".
    for mark in _PUNCT_AFTER_SPACE:
        pair = " " + mark
        if pair in text:
            text = text.replace(pair, mark)
    return text


def _inline(text: str) -> str:
    """Inline markup, over the whole text at once (one regex pass each, not one per line)."""
    text = _EXTERNAL_LINK.sub(_GROUP_1, text)
    text = _BARE_URL.sub("", text)
    text = _BOLD_ITALIC.sub("", text)
    text = _MAGIC_WORD.sub("", text)
    text = _BREAK_TAG.sub(" ", text)
    text = _HTML_TAG.sub("", text)
    text = html.unescape(text)
    text = _HTML_TAG.sub("", text)  # tags that were escaped as &lt;...&gt;
    text = _EMPTY_PARENS.sub("", text)
    return _spaces(text)


def clean_wikitext(wikitext: str) -> str:
    """Plain text of an article: paragraphs separated by newlines."""
    text = _COMMENT.sub("", wikitext)
    text = _SELF_CLOSING.sub("", text)
    text = _PAIRED.sub("", text)
    text = _remove_blocks(text)
    text = _inline(_replace_links(text))
    paragraphs: list[str] = []
    current: list[str] = []
    skip_level = 0  # inside a trailing section of this heading level (0: not skipping)
    for raw_line in text.split("\n"):
        heading = _HEADING.match(raw_line) if raw_line[:1] == "=" else None
        if heading:
            level = len(heading.group(1))
            if skip_level and level > skip_level:
                continue
            skip_level = level if heading.group(2).strip().lower() in TRAILING_SECTIONS else 0
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        if skip_level:
            continue
        stripped = raw_line.strip()
        if not stripped:
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        first = stripped[0]
        if first in "|!" or stripped.startswith("----"):
            continue  # residue of a table or a rule
        if first in "*#:;":  # a list item's marker
            stripped = stripped.lstrip("*#:;").strip()
            if not stripped:
                continue
        current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    return "\n".join(paragraphs)
