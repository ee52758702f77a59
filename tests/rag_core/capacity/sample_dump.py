"""A small multistream dump of the real sample's pages (tests/helpers/dumpfiles.py's layout), for planner tests."""

from __future__ import annotations

from pathlib import Path

from rag_core.wiki.dumps import DumpSource, iter_pages
from tests.conftest import SAMPLE_BZ2
from tests.helpers.dumpfiles import page_xml, write_multistream


def sample_multistream(directory: Path, n_pages: int = 60, per_stream: int = 5) -> tuple[Path, Path]:
    """The sample's first ``n_pages`` pages (articles and redirects, text as is), ``per_stream`` to a bz2 stream."""
    rows = []
    for page in iter_pages(DumpSource(str(SAMPLE_BZ2))):
        rows.append((page.page_id, page.title, page_xml(page.page_id, page.title, page.text, ns=page.ns,
                                                        redirect=page.redirect)))
        if len(rows) == n_pages:
            break
    directory.mkdir(parents=True, exist_ok=True)
    dump = directory / "enwiki-test-pages-articles-multistream.xml.bz2"
    index = directory / "enwiki-test-pages-articles-multistream-index.txt.bz2"
    write_multistream(dump, index, rows, per_stream=per_stream)
    return dump, index
