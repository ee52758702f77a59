"""Small MediaWiki exports built in tests, for cases the real sample lacks."""

from __future__ import annotations

import bz2
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr


def page_xml(page_id: int, title: str, text: str | None, *, ns: int = 0, revisions: list[tuple[int, str, str]] | None = None,
             redirect: str | None = None, deleted: bool = False) -> str:
    """One <page>; ``revisions`` lists (revision_id, timestamp, text) for full-history pages."""
    revisions = revisions or [(page_id * 10, "2020-01-01T00:00:00Z", text or "")]
    revs = []
    for rev_id, ts, body in revisions:
        text_el = '<text deleted="deleted" />' if deleted else f'<text xml:space="preserve">{escape(body)}</text>'
        revs.append(f"<revision><id>{rev_id}</id><timestamp>{ts}</timestamp><model>wikitext</model>{text_el}</revision>")
    red = f"<redirect title={quoteattr(redirect)} />" if redirect else ""
    return f"<page><title>{escape(title)}</title><ns>{ns}</ns><id>{page_id}</id>{red}{''.join(revs)}</page>\n"


def export_xml(pages: list[str], version: str = "0.10") -> str:
    ns = f"http://www.mediawiki.org/xml/export-{version}/"
    head = f'<mediawiki xmlns="{ns}" version="{version}" xml:lang="en">\n<siteinfo><sitename>Test</sitename></siteinfo>\n'
    return head + "".join(pages) + "</mediawiki>\n"


def write_multistream(path: Path, index: Path, pages: list[tuple[int, str, str]], per_stream: int = 2,
                      version: str = "0.10") -> None:
    """A Wikimedia-layout multistream dump of (page_id, title, page_xml) and its bz2 index."""
    ns = f"http://www.mediawiki.org/xml/export-{version}/"
    header = f'<mediawiki xmlns="{ns}" version="{version}" xml:lang="en">\n<siteinfo><sitename>T</sitename></siteinfo>\n'
    out = bytearray(bz2.compress(header.encode()))
    lines = []
    for i in range(0, len(pages), per_stream):
        offset = len(out)
        chunk = pages[i : i + per_stream]
        out += bz2.compress("".join(p[2] for p in chunk).encode())
        lines += [f"{offset}:{pid}:{title}" for pid, title, _ in chunk]
    out += bz2.compress(b"</mediawiki>\n")
    path.write_bytes(bytes(out))
    index.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
