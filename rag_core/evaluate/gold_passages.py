"""Dev questions whose gold passage changed between two passage sets: their gold answers may be stale.

A question names its gold in its provenance (rag_core.train.examples.Provenance):

- a **passage** (``passage_id``, ``"{page_id}-{revision_id}-{chunk}"``, as the cloze task gives it):
  unchanged when the newer set holds the same id, or holds the same page and chunk with the
  same text (the page was edited elsewhere); changed when that chunk's text differs or is gone;
- only a **page** (``wikipedia_id`` or ``title``, as NQ, TriviaQA or KILT give it): changed when
  the page's text (its passages joined) differs between the sets, or the page is gone;
- nothing: the gold cannot be identified, and the question is compared as it is.

Only the pages the questions name are read from either set, one part at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from rag_core.parquet_bytes import parquet_to_table
from rag_core.storage import Store
from rag_core.train.examples import Example
from rag_core.wiki.ingest import PASSAGES_DIR, published_manifest

_COLUMNS = ["passage_id", "page_id", "title", "text"]


@dataclass(frozen=True)
class GoldChange:
    """A question whose gold passage (or page) reads differently in the newer set."""

    example_id: str
    question: str
    targets: tuple[str, ...]
    gold: str  # the passage id, or "page <id>" / "page 'Title'", the question names
    old_text: str | None  # None: not in the older set
    new_text: str | None  # None: gone from the newer set


@dataclass
class GoldDiff:
    """The questions split by what happened to their gold between two passage sets."""

    kept: list[Example] = field(default_factory=list)  # gold unchanged, or unidentifiable: compared
    changed: list[GoldChange] = field(default_factory=list)  # left out of the comparison
    left_out: list[Example] = field(default_factory=list)  # the questions of ``changed``, in the same order
    unidentified: list[str] = field(default_factory=list)  # ids of kept questions that name no gold


@dataclass
class PageTexts:
    """The passages of some pages of one passage set, by passage id, by (page, chunk), and joined by page."""

    by_id: dict[str, str] = field(default_factory=dict)
    by_chunk: dict[tuple[str, str], str] = field(default_factory=dict)  # (page_id, chunk) -> text
    pages: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # page_id -> [(chunk, text)]
    page_of_title: dict[str, str] = field(default_factory=dict)

    def page_text(self, page_id: str | None, title: str | None) -> str | None:
        page = page_id if page_id in self.pages else self.page_of_title.get(title or "")
        return " ".join(t for _, t in sorted(self.pages[page])) if page in self.pages else None


def _split_id(passage_id: str) -> tuple[str, str] | None:
    """(page_id, chunk) of a ``"{page_id}-{revision_id}-{chunk}"`` id; None for an id of another form."""
    parts = passage_id.rsplit("-", 2)
    return (parts[0], parts[2]) if len(parts) == 3 and all(p.isdigit() for p in parts) else None


def named_pages(examples: Iterable[Example]) -> tuple[set[str], set[str]]:
    """(page ids, titles) the questions' provenance names."""
    pages, titles = set(), set()
    for example in examples:
        for p in example.provenance:
            split = _split_id(p.passage_id) if p.passage_id else None
            pages.update(x for x in (p.wikipedia_id, split[0] if split else None) if x)
            if p.title:
                titles.add(p.title)
    return pages, titles


def page_texts(store: Store, dump_id: str, pages: set[str], titles: set[str]) -> PageTexts:
    """The passages of ``pages`` (ids) and ``titles`` in the published passage set ``dump_id``."""
    out = PageTexts()
    manifest = published_manifest(store, dump_id)
    if manifest is None or not (pages or titles):
        return out
    root = store.child(PASSAGES_DIR, dump_id)
    for part in manifest["parts"]:
        table = parquet_to_table(root.read_bytes(part["path"]), _COLUMNS)
        wanted = pc.or_(pc.is_in(pc.cast(table["page_id"], pa.string()), pa.array(sorted(pages), pa.string())),
                        pc.is_in(table["title"], pa.array(sorted(titles), pa.string())))
        rows = table.filter(wanted).to_pylist()
        for row in rows:
            pid, page, text = row["passage_id"], str(row["page_id"]), row["text"] or ""
            split = _split_id(pid)
            chunk = int(split[1]) if split else len(out.pages.get(page, []))
            out.by_id[pid] = text
            out.by_chunk[(page, str(chunk))] = text
            out.pages.setdefault(page, []).append((chunk, text))
            out.page_of_title[row["title"]] = page
    return out


def _change(example: Example, old: PageTexts, new: PageTexts) -> GoldChange | None:
    for p in example.provenance:
        split = _split_id(p.passage_id) if p.passage_id else None
        if p.passage_id and p.passage_id in new.by_id:
            continue
        if split and p.passage_id in old.by_id:
            before, after = old.by_id[p.passage_id], new.by_chunk.get(split)
            if after != before:
                return GoldChange(example.id, example.input, example.targets, p.passage_id, before, after)
            continue
        page = p.wikipedia_id or (split[0] if split else None)
        before, after = old.page_text(page, p.title), new.page_text(page, p.title)
        if before != after:
            gold = f"page {page}" if page else f"page {p.title!r}"
            return GoldChange(example.id, example.input, example.targets, gold, before, after)
    return None


def gold_diff(examples: Sequence[Example], old: PageTexts, new: PageTexts) -> GoldDiff:
    """Split ``examples`` into those compared (gold unchanged or not identifiable) and those whose gold changed
    from ``old`` to ``new`` (module docstring)."""
    diff = GoldDiff()
    for example in examples:
        if not example.provenance:
            diff.kept.append(example)
            diff.unidentified.append(example.id)
        elif (change := _change(example, old, new)) is not None:
            diff.changed.append(change)
            diff.left_out.append(example)
        else:
            diff.kept.append(example)
    return diff
