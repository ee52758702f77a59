"""Streaming pages out of MediaWiki XML exports (``.xml`` and ``.xml.bz2``).

Nothing here holds the whole dump: bytes are decompressed in chunks, fed to an
incremental XML parser, and each ``<page>`` is dropped from the tree as soon
as it has been turned into a :class:`Page`.  Any export schema version is
accepted (the namespace URI is ignored apart from checking that it is a
MediaWiki export).
"""

from __future__ import annotations

import bz2
import contextlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from xml.etree.ElementTree import ParseError, XMLPullParser

from fsspec.core import url_to_fs

from rag_core.errors import DumpError
from rag_core.storage import translate_errors

CHUNK_BYTES = 1 << 20
EXPORT_NS_PREFIX = "http://www.mediawiki.org/xml/export-"
BZ2_MAGIC = b"BZh"


@dataclass(frozen=True, slots=True)
class Page:
    """The latest revision of one page, as the dump gives it."""

    page_id: int
    title: str
    ns: int
    revision_id: int
    timestamp: str
    text: str | None  # None when the revision's text is deleted or absent
    redirect: str | None  # target title when the page is a redirect


@dataclass(frozen=True)
class DumpSource:
    """Where a dump (or its index) lives: a path or URL plus fsspec options."""

    url: str
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    def open(self, streaming: bool = False) -> Any:
        """A binary file; ``streaming`` reads front to back without range requests (HTTP)."""
        with translate_errors(self.url, "reading"):
            try:
                fs, path = url_to_fs(self.url, **dict(self.options))
                if streaming and self.url.startswith(("http://", "https://")):
                    return fs.open(path, "rb", block_size=0)
                return fs.open(path, "rb")
            except FileNotFoundError as exc:
                raise DumpError(f"{self.url}: no such file; check the path or URL") from exc

    def size(self) -> int:
        with translate_errors(self.url, "reading"):
            try:
                fs, path = url_to_fs(self.url, **dict(self.options))
                return int(fs.size(path))
            except FileNotFoundError as exc:
                raise DumpError(f"{self.url}: no such file; check the path or URL") from exc

    def read_range(self, start: int, end: int) -> bytes:
        with translate_errors(self.url, "reading"), self.ranged_reads():
            fs, path = url_to_fs(self.url, **dict(self.options))
            return fs.cat_file(path, start=start, end=end)

    @contextlib.contextmanager
    def ranged_reads(self) -> Iterator[None]:
        """Byte-range reads; an HTTP server without Range support gets a clear error."""
        try:
            yield
        except ValueError as exc:
            if "range requests" not in str(exc):
                raise
            raise DumpError(
                f"{self.url}: the server does not support range requests, which an index needs; "
                "download the dump first, or ingest it without --index"
            ) from exc


def sniff_compression(head: bytes, name: str) -> str:
    """``"bz2"`` or ``"xml"`` from the first bytes, whatever the file is called."""
    if head.startswith(BZ2_MAGIC) and len(head) > 3 and head[3:4].isdigit():
        return "bz2"
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if stripped.startswith(b"<"):
        return "xml"
    raise DumpError(f"{name}: neither XML nor bz2-compressed XML; give a MediaWiki export (.xml or .xml.bz2)")


def iter_file_chunks(source: DumpSource) -> Iterator[bytes]:
    """Decompressed bytes of the whole file, chunk by chunk (bz2 streams are concatenated)."""
    with source.open(streaming=True) as raw:
        first = raw.read(CHUNK_BYTES)
        kind = sniff_compression(first[:8], source.name)
        # No seeking back: an HTTP stream cannot.
        reads = itertools.chain([first], iter(lambda: raw.read(CHUNK_BYTES), b""))
        if kind == "xml":
            yield from reads
            return
        decompressor = bz2.BZ2Decompressor()
        in_stream = False  # has the current decompressor been fed anything?
        offset = 0
        for data in reads:
            offset += len(data)
            while data:
                in_stream = True
                try:
                    out = decompressor.decompress(data)
                except OSError as exc:
                    raise DumpError(
                        f"{source.name}: corrupt bz2 data near byte {offset:,} ({exc}); download the dump again"
                    ) from exc
                if out:
                    yield out
                data = b""
                if decompressor.eof:
                    # A multistream dump is many bz2 streams back to back.
                    data = decompressor.unused_data
                    decompressor = bz2.BZ2Decompressor()
                    in_stream = False
                    if data and not data.startswith(BZ2_MAGIC[:1]):
                        raise DumpError(f"{source.name}: stray bytes after a bz2 stream near byte {offset:,}; the file is corrupt")
        if in_stream:
            raise DumpError(
                f"{source.name}: the bz2 data ends before its end-of-stream marker (truncated download?); "
                "download the dump again"
            )


class PageParser:
    """Incremental ``<page>`` parser: feed decompressed bytes, collect pages.

    ``wrapped=True`` parses a bare sequence of ``<page>`` elements (a
    multistream stream) by giving it a synthetic root.
    """

    def __init__(self, name: str, *, wrapped: bool = False) -> None:
        self.name = name
        self.wrapped = wrapped
        self.schema_version: str | None = None
        self._parser = XMLPullParser(events=("start", "end"))
        self._root: Any = None
        self._depth = 0
        self._page_depth = 0
        self._bytes_fed = 0
        self._closed = False
        self._pages: list[Page] = []
        if wrapped:
            self._parser.feed(b"<mediawiki>")

    def feed(self, data: bytes) -> list[Page]:
        """Feed bytes; return the pages completed so far (and forget them)."""
        # Bytes go to expat as they are: decoding them here first would cost a decode and expat's
        # re-encode per byte. Invalid UTF-8 stops expat; _push then names it as such.
        self._push(data)
        self._bytes_fed += len(data)
        pages, self._pages = self._pages, []
        return pages

    def close(self) -> list[Page]:
        """Finish; raise a DumpError when the XML stops mid-document."""
        if self.wrapped:
            self._push(b"</mediawiki>")
        try:
            self._parser.close()
            self._drain()
        except ParseError as exc:
            raise DumpError(
                f"{self.name}: the XML ends before </mediawiki> ({exc}); the dump was cut short, download it again"
            ) from exc
        if self._root is None:
            raise DumpError(f"{self.name}: no XML found; give a MediaWiki export")
        pages, self._pages = self._pages, []
        return pages

    def _push(self, data: bytes) -> None:
        try:
            self._parser.feed(data)
            self._drain()
        except ParseError as exc:
            self._check_utf8(data)
            line, col = exc.position
            raise DumpError(
                f"{self.name}: malformed XML at line {line:,}, column {col} ({exc.msg if hasattr(exc, 'msg') else exc}); "
                "the file is corrupt or not a MediaWiki export"
            ) from exc

    def _check_utf8(self, data: bytes) -> None:
        """Name invalid UTF-8 as such (expat only says "not well-formed")."""
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.reason != "unexpected end of data":  # a character cut by the chunk boundary is fine
                raise DumpError(
                    f"{self.name}: bytes that are not UTF-8 near decompressed byte {self._bytes_fed + exc.start:,}; "
                    "the dump is corrupt or re-encoded, download it again"
                ) from exc

    def _drain(self) -> None:
        for event, elem in self._parser.read_events():
            local = elem.tag.rpartition("}")[2]
            if event == "start":
                self._depth += 1
                if self._root is None:
                    self._check_root(elem, local)
                elif local == "page" and self._page_depth == 0:
                    self._page_depth = self._depth
                continue
            if local == "page" and self._depth == self._page_depth:
                self._pages.append(_page_from_element(elem, self.name))
                self._page_depth = 0
                # Detach finished pages so memory stays flat however long the dump is.
                self._root.clear()
            self._depth -= 1

    def _check_root(self, elem: Any, local: str) -> None:
        self._root = elem
        if self.wrapped:
            return
        namespace = elem.tag[1:].partition("}")[0] if elem.tag.startswith("{") else ""
        if local != "mediawiki" or not namespace.startswith(EXPORT_NS_PREFIX):
            raise DumpError(
                f"{self.name}: XML root is <{local}>, not a MediaWiki export <mediawiki xmlns=\"{EXPORT_NS_PREFIX}...\">; "
                "give a pages-articles dump"
            )
        self.schema_version = elem.get("version") or namespace[len(EXPORT_NS_PREFIX) :].rstrip("/")


def _child_text(elem: Any, name: str) -> str | None:
    for child in elem:
        if child.tag.rpartition("}")[2] == name:
            return child.text
    return None


def _page_from_element(page: Any, name: str) -> Page:
    title = ns = page_id = None
    redirect = None
    latest: Any = None
    latest_ts = ""
    for child in page:
        local = child.tag.rpartition("}")[2]
        if local == "title":
            title = child.text or ""
        elif local == "ns":
            ns = child.text
        elif local == "id":
            page_id = child.text
        elif local == "redirect":
            redirect = child.get("title") or ""
        elif local == "revision":
            ts = _child_text(child, "timestamp") or ""
            # Full-history dumps hold many revisions; the newest one wins (ties: the later one).
            if latest is None or ts >= latest_ts:
                latest, latest_ts = child, ts
    if page_id is None or title is None:
        raise DumpError(f"{name}: a <page> without <id> or <title>; the file is not a valid MediaWiki export")
    text = None
    revision_id = 0
    if latest is not None:
        revision_id = int(_child_text(latest, "id") or 0)
        for child in latest:
            if child.tag.rpartition("}")[2] == "text":
                text = None if child.get("deleted") is not None else (child.text or "")
    return Page(
        page_id=int(page_id),
        title=title,
        ns=int(ns) if ns is not None else _ns_from_title(title),
        revision_id=revision_id,
        timestamp=latest_ts,
        text=text,
        redirect=redirect,
    )


def _ns_from_title(title: str) -> int:
    # Exports before schema 0.6 have no <ns>; a colon prefix then marks other namespaces.
    return 0 if ":" not in title else -1


def parse_pages(chunks: Iterable[bytes], name: str, *, wrapped: bool = False) -> Iterator[Page]:
    """Pages from an iterable of decompressed XML chunks."""
    parser = PageParser(name, wrapped=wrapped)
    for chunk in chunks:
        yield from parser.feed(chunk)
    yield from parser.close()


def iter_pages(source: DumpSource) -> Iterator[Page]:
    """Every page of a whole ``.xml`` or ``.xml.bz2`` file, in order."""
    return parse_pages(iter_file_chunks(source), source.name)
