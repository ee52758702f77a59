"""Guarantee: a page that decompresses past the cap (a bz2 bomb: a few hundred bytes that grow to gigabytes) is
refused in one line naming the dump, the byte offset and the cap, after decompressing no more than about the cap.

Both readers (the single-stream one and the multistream one, with the Rust port and with the standard library's
bz2) read a real bz2 file built here; the memory each uses is measured with tracemalloc.
"""

from __future__ import annotations

import bz2
import os
import tracemalloc
from pathlib import Path

import pytest

from rag_core.wiki import multistream
from rag_core.wiki.dumps import DumpSource, PageTooLargeError, iter_pages
from rag_core.wiki.multistream import iter_shard_pages, max_compressed, plan_shards, read_index
from tests.conftest import SAMPLE_BZ2
from tests.helpers.dump_bombs import write_bomb_dump
from tests.helpers.dumpfiles import page_xml

NS = "http://www.mediawiki.org/xml/export-0.10/"


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_the_single_stream_reader_refuses_a_page_past_the_cap_holding_about_the_cap(tmp_path: Path) -> None:
    dump, _, _ = write_bomb_dump(tmp_path, blocks=16)  # 256 MiB of text in 2 KB
    assert dump.stat().st_size < 4096
    seen = []
    tracemalloc.start()
    try:
        with pytest.raises(PageTooLargeError) as refused:
            for page in iter_pages(DumpSource(str(dump)), max_page_bytes=1 << 20):
                seen.append(page.title)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seen == ["Plain one", "Plain two"]
    text = _one_line(refused)
    assert text.startswith("bomb-multistream.xml.bz2: the page starting near decompressed byte ")
    assert "larger than the cap of 1,048,576 bytes (max_page_bytes)" in text
    assert peak < 24 << 20, peak  # the cap, a chunk or two and the parser: not the 256 MiB the page claims


@pytest.mark.parametrize("backend", ["rust", "stdlib"])
def test_the_multistream_reader_refuses_a_stream_past_the_cap_holding_about_the_cap(
        tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "stdlib":
        monkeypatch.setattr(multistream, "_rust_bz2", None)
    elif multistream._rust_bz2 is None:
        pytest.skip("the Rust bz2 port (cramjam_pure_rust) is not installed")
    dump, index, offset = write_bomb_dump(tmp_path, blocks=16)
    source = DumpSource(str(dump))
    [shard] = plan_shards(read_index(DumpSource(str(index))), dump.stat().st_size, 1)
    seen = []
    tracemalloc.start()
    try:
        with pytest.raises(PageTooLargeError) as refused:
            for page in iter_shard_pages(source, shard, max_page_bytes=1 << 20):
                seen.append(page.title)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seen == ["Plain one", "Plain two"]
    assert _one_line(refused) == (
        f"bomb-multistream.xml.bz2: the bz2 stream at byte {offset:,} decompresses to more than the cap of "
        "1,048,576 bytes (max_page_bytes); the dump is corrupt or hostile, or raise the cap for pages that large")
    assert peak < 24 << 20, peak


def test_a_real_dump_under_a_small_cap_loses_no_page(wiki: Path) -> None:
    """The check never refuses a page below the cap, wherever the reader's chunks happen to cut it."""
    pages = list(iter_pages(DumpSource(str(SAMPLE_BZ2))))
    largest = max(len(page_xml(p.page_id, p.title, p.text).encode()) for p in pages)
    assert largest < 1 << 20
    assert list(iter_pages(DumpSource(str(SAMPLE_BZ2)), max_page_bytes=largest + 4096)) == pages


def test_a_stream_too_long_to_be_within_the_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """An index whose one stream spans 2 MiB of incompressible bz2: over a 1-MiB cap whatever it holds."""
    header = bz2.compress(f'<mediawiki xmlns="{NS}" version="0.10">\n<siteinfo></siteinfo>\n'.encode())
    dump, index = tmp_path / "long-multistream.xml.bz2", tmp_path / "long-index.txt.bz2"
    body = bz2.compress(os.urandom(2 << 20))
    dump.write_bytes(header + body + bz2.compress(b"</mediawiki>\n"))
    index.write_bytes(bz2.compress(f"{len(header)}:1:Long\n".encode()))
    [shard] = plan_shards(read_index(DumpSource(str(index))), dump.stat().st_size, 1)
    with pytest.raises(PageTooLargeError) as refused:
        list(iter_shard_pages(DumpSource(str(dump)), shard, max_page_bytes=1 << 20))
    assert _one_line(refused) == (
        f"long-multistream.xml.bz2: the bz2 stream at byte {len(header):,} is {shard.end - len(header):,} bytes "
        "compressed, more than any stream within the cap of 1,048,576 bytes decompressed (max_page_bytes) can be; "
        "the index does not match this dump, or raise the cap")
    assert max_compressed(1 << 20) < shard.end - len(header)
