"""Pages to DPR-style passages: disjoint 100-word windows with stable ids.

``passage_id`` is ``"{page_id}-{revision_id}-{chunk}"``: the same page
revision gives the same ids on every run, machine and input format, and an
edited article (a new revision) changes only its own ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields

import pyarrow as pa

from rag_core.wiki.dumps import Page
from rag_core.wiki.wikitext import clean_wikitext, is_disambiguation, redirect_target

PASSAGE_SCHEMA = pa.schema(
    [
        pa.field("passage_id", pa.string(), nullable=False),
        pa.field("page_id", pa.int64(), nullable=False),
        pa.field("revision_id", pa.int64(), nullable=False),
        pa.field("chunk", pa.int32(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("n_words", pa.int32(), nullable=False),
    ]
)

REDIRECT_SCHEMA = pa.schema(
    [
        pa.field("page_id", pa.int64(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("target", pa.string(), nullable=False),
    ]
)


@dataclass
class PageCounts:
    """What happened to the pages of one part; parts add up to the run's counts."""

    pages: int = 0  # every <page> read: redirects + other_namespace + articles
    redirects: int = 0  # any namespace; recorded as title -> target
    other_namespace: int = 0  # non-redirect pages outside namespace 0
    articles: int = 0  # namespace-0 pages that are not redirects: chunked + disambiguation + empty
    chunked: int = 0  # articles that produced passages
    disambiguation: int = 0  # articles skipped as disambiguation pages (when the setting says so)
    empty: int = 0  # articles with deleted or empty text, or nothing left after cleaning
    passages: int = 0
    words: int = 0
    wikitext_bytes: int = 0

    def __add__(self, other: PageCounts) -> PageCounts:
        return PageCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def inconsistencies(self) -> list[str]:
        """Ways in which the counts do not add up (empty when they do)."""
        out = []
        if self.pages != self.redirects + self.other_namespace + self.articles:
            out.append(f"pages {self.pages} != redirects + other_namespace + articles")
        if self.articles != self.chunked + self.disambiguation + self.empty:
            out.append(f"articles {self.articles} != chunked + disambiguation + empty")
        return out

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def passage_id(page_id: int, revision_id: int, chunk: int) -> str:
    return f"{page_id}-{revision_id}-{chunk}"


def windows(text: str, size: int) -> list[list[str]]:
    """Disjoint windows of ``size`` words over the whole text; the last may be shorter."""
    words = text.split()
    return [words[i : i + size] for i in range(0, len(words), size)]


def passages_from_pages(
    pages: Iterable[Page], *, words_per_passage: int = 100, skip_disambiguation: bool = True
) -> tuple[pa.Table, pa.Table, PageCounts]:
    """Clean and chunk pages; returns (passages, redirects, counts)."""
    counts = PageCounts()
    cols: dict[str, list] = {f.name: [] for f in PASSAGE_SCHEMA}
    redirects: dict[str, list] = {f.name: [] for f in REDIRECT_SCHEMA}
    for page in pages:
        counts.pages += 1
        target = page.redirect if page.redirect is not None else redirect_target(page.text or "")
        if target is not None:
            counts.redirects += 1
            redirects["page_id"].append(page.page_id)
            redirects["title"].append(page.title)
            redirects["target"].append(target)
            continue
        if page.ns != 0:
            counts.other_namespace += 1
            continue
        counts.articles += 1
        if not page.text or not page.text.strip():
            counts.empty += 1
            continue
        counts.wikitext_bytes += len(page.text)
        if skip_disambiguation and is_disambiguation(page.text):
            counts.disambiguation += 1
            continue
        chunks = windows(clean_wikitext(page.text), words_per_passage)
        if not chunks:
            counts.empty += 1
            continue
        counts.chunked += 1
        for k, words in enumerate(chunks):
            cols["passage_id"].append(passage_id(page.page_id, page.revision_id, k))
            cols["page_id"].append(page.page_id)
            cols["revision_id"].append(page.revision_id)
            cols["chunk"].append(k)
            cols["title"].append(page.title)
            cols["text"].append(" ".join(words))
            cols["n_words"].append(len(words))
            counts.words += len(words)
        counts.passages += len(chunks)
    return (
        pa.table(cols, schema=PASSAGE_SCHEMA),
        pa.table(redirects, schema=REDIRECT_SCHEMA),
        counts,
    )
