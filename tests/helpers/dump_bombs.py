"""Dumps whose one page decompresses to far more than it stores: the page-size cap's attack input."""

from __future__ import annotations

import bz2
from pathlib import Path

from tests.helpers.dumpfiles import page_xml

NS = "http://www.mediawiki.org/xml/export-0.10/"


BLOCK = 16 << 20  # one bz2 stream of this many 'a's is ~100 bytes


def write_bomb_dump(folder: Path, blocks: int) -> tuple[Path, Path, int]:
    """A multistream dump (also readable front to back): two plain pages, then a page whose text is ``blocks``
    times 16 MiB of 'a'. Returns the dump, its index and the byte where the big page's stream starts."""
    one_block = bz2.compress(b"a" * BLOCK)
    header = bz2.compress(f'<mediawiki xmlns="{NS}" version="0.10" xml:lang="en">\n'
                          "<siteinfo><sitename>T</sitename></siteinfo>\n".encode())
    plain = bz2.compress((page_xml(1, "Plain one", "Some text.") + page_xml(2, "Plain two", "More.")).encode())
    opening, closing = page_xml(3, "Bomb", "@").split("@")
    bomb = bz2.compress(opening.encode()) + one_block * blocks + bz2.compress(closing.encode())
    offset = len(header) + len(plain)
    dump, index = folder / "bomb-multistream.xml.bz2", folder / "bomb-index.txt.bz2"
    dump.write_bytes(header + plain + bomb + bz2.compress(b"</mediawiki>\n"))
    lines = f"{len(header)}:1:Plain one\n{len(header)}:2:Plain two\n{offset}:3:Bomb\n"
    index.write_bytes(bz2.compress(lines.encode()))
    return dump, index, offset
