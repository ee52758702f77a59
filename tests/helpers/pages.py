"""Small multistream dumps of given pages, and the questions the sample dump's articles answer."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.dumpfiles import page_xml, write_multistream


QUESTIONS = ["What is anarchism?", "Who was the teacher of Alexander the Great?", "What is the capital of Alabama?"]


def write_dump(directory: Path, pages: list[tuple[int, str, str, int]], name: str = "wiki") -> tuple[Path, Path]:
    """A multistream dump of (page_id, title, text, revision_id)."""
    dump, index = directory / f"{name}.xml.bz2", directory / f"{name}-index.txt.bz2"
    rows = [(pid, title, page_xml(pid, title, text, revisions=[(rev, "2020-01-01T00:00:00Z", text)]))
            for pid, title, text, rev in pages]
    write_multistream(dump, index, rows, per_stream=3)
    return dump, index


def page_rows(articles: list) -> list[tuple[int, str, str, int]]:
    return [(p.page_id, p.title, p.text, p.revision_id) for p in articles]
