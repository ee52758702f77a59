"""Reading pages from every dump format, checked against a second parser."""

from __future__ import annotations

import bz2
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rag_core.errors import DumpError
from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.multistream import check_layout, iter_shard_pages, plan_shards, read_index, shard_streams
from tests.conftest import MULTISTREAM, MULTISTREAM_INDEX, SAMPLE_BZ2
from tests.helpers.dumpfiles import export_xml, page_xml, write_multistream


def _reference_pages(xml_bytes: bytes) -> list[tuple[int, str, int, int]]:
    """(page_id, title, ns, revision_id) by a whole-tree ElementTree parse: a second, independent parser."""
    root = ET.fromstring(xml_bytes)
    ns = {"m": root.tag[1:].split("}")[0]}
    out = []
    for page in root.findall("m:page", ns):
        rev = page.find("m:revision", ns)
        out.append((int(page.findtext("m:id", namespaces=ns)), page.findtext("m:title", namespaces=ns),
                    int(page.findtext("m:ns", namespaces=ns)), int(rev.findtext("m:id", namespaces=ns))))
    return out


def test_bz2_pages_match_a_second_parser(wiki: Path) -> None:
    pages = list(iter_pages(DumpSource(str(SAMPLE_BZ2))))
    expected = _reference_pages(bz2.decompress(SAMPLE_BZ2.read_bytes()))
    assert [(p.page_id, p.title, p.ns, p.revision_id) for p in pages] == expected
    assert len(pages) == 206
    assert sum(p.redirect is not None for p in pages) == 100
    anarchism = next(p for p in pages if p.title == "Anarchism")
    assert anarchism.text.startswith("{{Redirect2|Anarchist|Anarchists")
    assert anarchism.redirect is None and anarchism.ns == 0


def test_plain_xml_and_multistream_give_the_same_pages(wiki: Path, sample_xml: Path) -> None:
    from_bz2 = list(iter_pages(DumpSource(str(SAMPLE_BZ2))))
    from_xml = list(iter_pages(DumpSource(f"file://{sample_xml}")))
    from_whole_multistream = list(iter_pages(DumpSource(str(MULTISTREAM))))
    dump = DumpSource(str(MULTISTREAM))
    streams = read_index(DumpSource(str(MULTISTREAM_INDEX)))
    shards = plan_shards(streams, dump.size(), 8)
    from_shards = [p for shard in shards for p in iter_shard_pages(dump, shard)]
    assert from_xml == from_bz2 == from_whole_multistream == from_shards


def test_index_layout_and_schema_version(wiki: Path) -> None:
    dump = DumpSource(str(MULTISTREAM))
    streams = read_index(DumpSource(str(MULTISTREAM_INDEX)))
    assert [len(s.page_ids) for s in streams] == [100, 100, 6]
    assert check_layout(dump, streams, dump.size()) == "0.10"


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5, 50])
def test_shards_cover_every_stream_once(num_shards: int) -> None:
    from rag_core.wiki.multistream import Stream

    streams = [Stream(100 + 1000 * i + (i % 7) * 13, (i,)) for i in range(40)]
    size = streams[-1].offset + 500
    shards = [shard_streams(streams, size, i, num_shards) for i in range(num_shards)]
    assert [s for shard in shards for s in shard.streams] == streams
    for a, b in zip(shards, shards[1:]):
        assert a.end == b.start or not b.streams or not a.streams
    assert shards == [shard_streams(streams, size, i, num_shards) for i in range(num_shards)]  # pure


def test_any_schema_version_latest_revision_namespaces_and_deleted_text(tmp_path: Path) -> None:
    pages = [
        page_xml(1, "History", None, revisions=[(11, "2020-01-01T00:00:00Z", "old words"),
                                                 (13, "2022-05-01T00:00:00Z", "newest words"),
                                                 (12, "2021-01-01T00:00:00Z", "middle words")]),
        page_xml(2, "Talk:History", "chat", ns=1),
        page_xml(3, "Gone", "", deleted=True),
        page_xml(4, "Old style redirect", "#REDIRECT [[History]]"),
    ]
    path = tmp_path / "v011.xml"
    path.write_text(export_xml(pages, version="0.11"))
    got = list(iter_pages(DumpSource(str(path))))
    assert [p.page_id for p in got] == [1, 2, 3, 4]
    assert (got[0].revision_id, got[0].text) == (13, "newest words")
    assert got[1].ns == 1
    assert got[2].text is None
    assert got[3].redirect is None and got[3].text.startswith("#REDIRECT")


# -- bad input: one clear line naming the file -------------------------------------------------

def _expect(path: Path, match: str) -> None:
    with pytest.raises(DumpError, match=match) as err:
        list(iter_pages(DumpSource(str(path))))
    message = str(err.value)
    assert path.name in message and "\n" not in message


def test_truncated_bz2(wiki: Path, tmp_path: Path) -> None:
    path = tmp_path / "truncated.xml.bz2"
    data = SAMPLE_BZ2.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    _expect(path, "truncated|cut short")


def test_corrupt_bz2(wiki: Path, tmp_path: Path) -> None:
    data = bytearray(SAMPLE_BZ2.read_bytes())
    data[5000:5100] = b"\x00" * 100
    path = tmp_path / "corrupt.xml.bz2"
    path.write_bytes(bytes(data))
    _expect(path, "corrupt bz2|malformed XML|not UTF-8")


def test_not_xml(tmp_path: Path) -> None:
    path = tmp_path / "notes.xml.bz2"
    path.write_bytes(bz2.compress(b"just some text, not markup\n" * 10))
    _expect(path, "neither XML|malformed XML")


def test_not_compressed_nor_xml(tmp_path: Path) -> None:
    path = tmp_path / "image.xml.bz2"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64)
    _expect(path, "neither XML nor bz2")


def test_xml_that_is_not_a_mediawiki_export(tmp_path: Path) -> None:
    path = tmp_path / "feed.xml"
    path.write_text('<?xml version="1.0"?><rss version="2.0"><channel><title>x</title></channel></rss>')
    _expect(path, "not a MediaWiki export")


def test_xml_cut_mid_page(wiki: Path, tmp_path: Path) -> None:
    xml = bz2.decompress(SAMPLE_BZ2.read_bytes())
    cut = xml.index(b"<page>", len(xml) // 2) + 300
    path = tmp_path / "cut.xml.bz2"
    path.write_bytes(bz2.compress(xml[:cut]))
    _expect(path, "cut short")


def test_non_utf8_bytes(wiki: Path, tmp_path: Path) -> None:
    xml = bz2.decompress(SAMPLE_BZ2.read_bytes())
    at = xml.index(b"Anarchism is")
    path = tmp_path / "latin1.xml.bz2"
    path.write_bytes(bz2.compress(xml[:at] + b"caf\xe9 " + xml[at:]))
    _expect(path, "not UTF-8")


def test_index_of_another_dump(wiki: Path, tmp_path: Path) -> None:
    dump, index = tmp_path / "other.xml.bz2", tmp_path / "other-index.txt.bz2"
    write_multistream(dump, index, [(i, f"T{i}", page_xml(i, f"T{i}", "words here")) for i in range(1, 7)])
    streams = read_index(DumpSource(str(index)))
    real = DumpSource(str(MULTISTREAM))
    with pytest.raises(DumpError, match="does not match|no bz2 stream starts"):
        check_layout(real, streams, real.size())
        for shard in plan_shards(streams, real.size(), 2):
            list(iter_shard_pages(real, shard))


def test_index_with_wrong_page_ids(wiki: Path, tmp_path: Path) -> None:
    lines = bz2.decompress(MULTISTREAM_INDEX.read_bytes()).decode().splitlines()
    offset, _, title = lines[150].split(":", 2)
    lines[150] = f"{offset}:999999:{title}"
    index = tmp_path / "bad-index.txt"
    index.write_text("\n".join(lines) + "\n")
    dump = DumpSource(str(MULTISTREAM))
    streams = read_index(DumpSource(str(index)))
    with pytest.raises(DumpError, match="use the index published with this dump"):
        for shard in plan_shards(streams, dump.size(), 3):
            list(iter_shard_pages(dump, shard))


def test_index_beyond_the_end_and_garbage_index(wiki: Path, tmp_path: Path) -> None:
    dump = DumpSource(str(MULTISTREAM))
    index = tmp_path / "far.txt"
    index.write_text(f"638:10:A\n{dump.size() + 10}:12:B\n")
    with pytest.raises(DumpError, match="truncated or the index belongs to another dump"):
        check_layout(dump, read_index(DumpSource(str(index))), dump.size())
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("this is not an index\n")
    with pytest.raises(DumpError, match="offset:page_id:title"):
        read_index(DumpSource(str(garbage)))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="no such file"):
        list(iter_pages(DumpSource(str(tmp_path / "absent.xml.bz2"))))


def test_bytes_split_anywhere_parse_the_same() -> None:
    """Bytes go to expat as they come: a chunk may end inside a UTF-8 character or an entity."""
    from rag_core.wiki.dumps import PageParser, parse_pages

    xml = export_xml([page_xml(1, "Café Zürich", "Ünïcödé &amp; <ref>日本語</ref> text"),
                      page_xml(2, "Ωmega", "more — words")]).encode()
    whole = list(parse_pages([xml], "whole.xml"))
    assert [p.title for p in whole] == ["Café Zürich", "Ωmega"]
    assert whole[0].text == "Ünïcödé &amp; <ref>日本語</ref> text"
    for cut in range(1, len(xml)):
        parser = PageParser("split.xml")
        pages = parser.feed(xml[:cut]) + parser.feed(xml[cut:]) + parser.close()
        assert pages == whole, cut


def test_rust_and_stdlib_bz2_give_the_same_bytes_and_errors(wiki: Path) -> None:
    """Multistream streams are decompressed by libbz2's Rust port where installed; the stdlib is the reference."""
    from rag_core.wiki import multistream

    if multistream._rust_bz2 is None:
        pytest.skip("cramjam-pure-rust is not installed: only the stdlib path runs")
    data = MULTISTREAM.read_bytes()
    streams = read_index(DumpSource(str(MULTISTREAM_INDEX)))
    start = streams[0].offset  # page streams and the footer, after the header stream
    rust = multistream.decompress_streams(data[start:], "d", start)
    assert rust == multistream.decompress_streams(data[start:], "d", start, use_rust=False)
    assert rust.count(b"<page>") == sum(len(s.page_ids) for s in streams)
    for bad in (data[start : (start + len(data)) // 2], data[start : start + 200] + b"\x00" * 64 + data[start + 264 :]):
        for use_rust in (True, False):
            with pytest.raises(DumpError, match="corrupt|cut short"):
                multistream.decompress_streams(bad, "d", start, use_rust=use_rust)
