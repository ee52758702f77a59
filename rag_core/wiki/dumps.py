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
from rag_core.storage import StoreUnreachableError, translate_errors, watch_retries

CHUNK_BYTES = 1 << 20
EXPORT_NS_PREFIX = "http://www.mediawiki.org/xml/export-"
BZ2_MAGIC = b"BZh"
# A MediaWiki revision holds at most 2 MiB of wikitext ($wgMaxArticleSize), up to ~12 MiB once XML-escaped;
# 256 MiB leaves room for full-history pages of many revisions while a bz2 bomb (a few hundred bytes that
# decompress to terabytes) is stopped at a known memory cost.
MAX_PAGE_BYTES = 256 << 20
# HTTP dumps: a read may wait this long for the server's next bytes; the download as a whole has no limit (a
# full dump streams for hours, past aiohttp's default total of 300 s).
HTTP_READ_TIMEOUT_S = 120.0
HTTP_CONNECT_TIMEOUT_S = 30.0


class DumpServerTimeoutError(StoreUnreachableError):
    """The server of an HTTP dump sent nothing for longer than the read timeout: a transport error, retried."""


class PageTooLargeError(DumpError):
    """A page (or a multistream bz2 stream) decompresses to more than the cap: a corrupt or hostile dump."""


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
    read_timeout_s: float = HTTP_READ_TIMEOUT_S  # HTTP: the longest wait for the server's next bytes

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def is_http(self) -> bool:
        return self.url.startswith(("http://", "https://"))

    def open(self, streaming: bool = False) -> Any:
        """A binary file; ``streaming`` reads front to back without range requests (HTTP)."""
        with self.reading():
            try:
                fs, path = self._filesystem()
                if streaming and self.is_http:
                    return _DumpFile(fs.open(path, "rb", block_size=0), self)
                return _DumpFile(fs.open(path, "rb"), self)
            except FileNotFoundError as exc:
                raise DumpError(f"{self.url}: no such file; check the path or URL") from exc

    def size(self) -> int:
        with self.reading():
            try:
                fs, path = self._filesystem()
                return int(fs.size(path))
            except FileNotFoundError as exc:
                raise DumpError(f"{self.url}: no such file; check the path or URL") from exc

    def read_range(self, start: int, end: int) -> bytes:
        with self.reading(), self.ranged_reads():
            fs, path = self._filesystem()
            return fs.cat_file(path, start=start, end=end)

    def _filesystem(self) -> tuple[Any, str]:
        options = dict(self.options)
        if self.is_http:
            import aiohttp

            # Bounded per read, not in total (HTTP_READ_TIMEOUT_S); the caller's own timeout wins.
            client = dict(options.get("client_kwargs") or {})
            client.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=HTTP_CONNECT_TIMEOUT_S,
                                                               sock_read=self.read_timeout_s))
            options["client_kwargs"] = client
        fs, path = url_to_fs(self.url, **options)
        watch_retries(fs, options)
        return fs, path

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Store failures as one StoreError line; an HTTP server that stalls past the read timeout, as such."""
        with translate_errors(self.url, "reading"):
            try:
                yield
            except TimeoutError as exc:
                if not self.is_http:
                    raise
                raise DumpServerTimeoutError(
                    f"{self.url}: the dump server did not answer for {self.read_timeout_s:g} s; check that it is up "
                    "and rerun (finished work is reused), or raise DumpSource.read_timeout_s for a slow server"
                ) from exc

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


class _DumpFile:
    """The dump's file object, whose reads report a stalled server or an unreachable store in one line."""

    def __init__(self, raw: Any, source: DumpSource) -> None:
        self._raw = raw
        self._source = source

    def read(self, size: int = -1) -> bytes:
        with self._source.reading():
            return self._raw.read(size)

    def __getattr__(self, name: str) -> Any:  # seek, tell, close, ...: the file's own
        return getattr(self._raw, name)

    def __enter__(self) -> _DumpFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.close()


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
            while True:  # until this read is used up; each call gives at most CHUNK_BYTES (a bz2 bomb stays small)
                in_stream = in_stream or bool(data)
                try:
                    out = decompressor.decompress(data, max_length=CHUNK_BYTES)
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
                    if not data:
                        break
                elif decompressor.needs_input:
                    break
        if in_stream:
            raise DumpError(
                f"{source.name}: the bz2 data ends before its end-of-stream marker (truncated download?); "
                "download the dump again"
            )


class PageParser:
    """Incremental ``<page>`` parser: feed decompressed bytes, collect pages.

    ``wrapped=True`` parses a bare sequence of ``<page>`` elements (a
    multistream stream) by giving it a synthetic root. A page whose XML
    grows past ``max_page_bytes`` raises :class:`PageTooLargeError` (checked
    after each feed, so memory holds at most the cap plus one fed chunk).
    """

    def __init__(self, name: str, *, wrapped: bool = False, max_page_bytes: int = MAX_PAGE_BYTES) -> None:
        self.name = name
        self.wrapped = wrapped
        self.max_page_bytes = max_page_bytes
        self._chunk = (0, 0)  # [start, end) in decompressed bytes of the chunk being parsed
        self._page_chunk = (0, 0)  # the chunk in which the open <page> started
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
        # The open page started before the end of the chunk it started in: at least this much of it is held.
        if self._page_depth and self._bytes_fed - self._page_chunk[1] > self.max_page_bytes:
            raise PageTooLargeError(
                f"{self.name}: the page starting near decompressed byte {self._page_chunk[0]:,} is larger than the "
                f"cap of {self.max_page_bytes:,} bytes (max_page_bytes); the dump is corrupt or hostile, or raise "
                "the cap for pages that large"
            )
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
        self._chunk = (self._bytes_fed, self._bytes_fed + len(data))
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
                    self._page_chunk = self._chunk
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


def parse_pages(chunks: Iterable[bytes], name: str, *, wrapped: bool = False,
                max_page_bytes: int = MAX_PAGE_BYTES) -> Iterator[Page]:
    """Pages from an iterable of decompressed XML chunks; a page over ``max_page_bytes`` is a PageTooLargeError."""
    parser = PageParser(name, wrapped=wrapped, max_page_bytes=max_page_bytes)
    for chunk in chunks:
        yield from parser.feed(chunk)
    yield from parser.close()


def iter_pages(source: DumpSource, *, max_page_bytes: int = MAX_PAGE_BYTES) -> Iterator[Page]:
    """Every page of a whole ``.xml`` or ``.xml.bz2`` file, in order; a page over ``max_page_bytes`` stops it."""
    return parse_pages(iter_file_chunks(source), source.name, max_page_bytes=max_page_bytes)
