"""Multistream dumps: the index, shards of whole bz2 streams, and their pages.

A ``pages-articles-multistream.xml.bz2`` is a header stream (``<mediawiki>``
and ``<siteinfo>``), page streams of about 100 pages, and a footer stream.
Its index lists ``offset:page_id:title`` for every page, ``offset`` being the
byte where the page's stream starts.  A shard is a contiguous run of streams,
a pure function of (streams, shard_id, num_shards); any worker can decompress
and parse it alone from a byte-range read.
"""

from __future__ import annotations

import bisect
import bz2
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from rag_core.errors import DumpError
from rag_core.wiki.dumps import (
    BZ2_MAGIC,
    EXPORT_NS_PREFIX,
    MAX_PAGE_BYTES,
    DumpSource,
    Page,
    PageParser,
    PageTooLargeError,
    iter_file_chunks,
)

try:  # libbz2 ported to Rust (cramjam's pure-Rust backend): the same bytes, decompressed faster
    from cramjam_pure_rust import DecompressionError as _RustBz2Error
    from cramjam_pure_rust import bzip2 as _rust_bz2
except ImportError:  # the standard library's bz2 (libbz2) does the same work
    _rust_bz2 = None

READ_BYTES = 8 << 20
FOOTER = b"</mediawiki>"


@dataclass(frozen=True, slots=True)
class Stream:
    """One bz2 stream of the dump: where it starts and which pages the index puts in it."""

    offset: int
    page_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StreamShard:
    """A contiguous run of streams, ``[start, end)`` in compressed bytes."""

    shard_id: int
    num_shards: int
    start: int
    end: int
    streams: tuple[Stream, ...]

    @property
    def n_pages(self) -> int:
        return sum(len(s.page_ids) for s in self.streams)


def read_index(index: DumpSource) -> list[Stream]:
    """Streams in file order from an index file (``.txt`` or ``.txt.bz2``)."""
    raw = b"".join(iter_file_chunks_any(index))
    streams: list[Stream] = []
    current_offset = -1
    current: list[int] = []
    for lineno, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line:
            continue
        offset_s, _, rest = line.partition(":")
        page_s, _, _title = rest.partition(":")
        try:
            offset, page_id = int(offset_s), int(page_s)
        except ValueError:
            raise DumpError(
                f"{index.name}: line {lineno} is not 'offset:page_id:title'; give the dump's multistream index"
            ) from None
        if offset != current_offset:
            if offset < current_offset:
                raise DumpError(f"{index.name}: offsets go backwards at line {lineno}; the index is corrupt")
            if current:
                streams.append(Stream(current_offset, tuple(current)))
            current_offset, current = offset, []
        current.append(page_id)
    if current:
        streams.append(Stream(current_offset, tuple(current)))
    if not streams:
        raise DumpError(f"{index.name}: the index is empty; give the dump's multistream index")
    return streams


def iter_file_chunks_any(source: DumpSource) -> Iterator[bytes]:
    """Like iter_file_chunks but for plain-text or bz2 files that are not XML."""
    with source.open() as raw:
        head = raw.read(4)
    if head.startswith(BZ2_MAGIC):
        yield from iter_file_chunks(source)
        return
    with source.open() as raw:
        while chunk := raw.read(READ_BYTES):
            yield chunk


def shard_streams(streams: Sequence[Stream], file_size: int, shard_id: int, num_shards: int) -> StreamShard:
    """Shard ``shard_id`` of ``num_shards``: streams whose start falls in its share of the bytes.

    Shares are equal slices of the compressed page bytes, so shards take
    about the same time to decompress and parse; a shard may be empty when
    there are fewer streams than shards.
    """
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id {shard_id} outside [0, {num_shards})")
    first = streams[0].offset
    span = file_size - first
    lo = first + span * shard_id // num_shards
    hi = first + span * (shard_id + 1) // num_shards
    offsets = [s.offset for s in streams]
    i, j = bisect.bisect_left(offsets, lo), bisect.bisect_left(offsets, hi)
    chosen = tuple(streams[i:j])
    end = streams[j].offset if j < len(streams) else file_size
    start = chosen[0].offset if chosen else end
    return StreamShard(shard_id, num_shards, start, end, chosen)


def plan_shards(streams: Sequence[Stream], file_size: int, num_shards: int) -> list[StreamShard]:
    """All non-empty shards; at most one per stream."""
    num_shards = max(1, min(num_shards, len(streams)))
    shards = [shard_streams(streams, file_size, i, num_shards) for i in range(num_shards)]
    return [s for s in shards if s.streams]


def check_layout(dump: DumpSource, streams: Sequence[Stream], file_size: int, *,
                 max_page_bytes: int = MAX_PAGE_BYTES) -> str:
    """Cheap checks that the index belongs to the dump; returns the export schema version.

    The header stream is held to ``max_page_bytes`` decompressed, as every page stream is."""
    last = streams[-1].offset
    if last >= file_size:
        raise DumpError(
            f"{dump.name}: its index points at byte {last:,} but the file has {file_size:,} bytes; "
            "the dump is truncated or the index belongs to another dump"
        )
    header = dump.read_range(0, streams[0].offset)
    if not header.startswith(BZ2_MAGIC):
        raise DumpError(f"{dump.name}: not bz2-compressed; a multistream index needs the .xml.bz2 multistream dump")
    try:
        text = decompress_streams(header, dump.name, 0, use_rust=False, max_bytes=max_page_bytes).decode("utf-8")
    except PageTooLargeError:
        raise
    except (DumpError, UnicodeDecodeError) as exc:
        raise DumpError(
            f"{dump.name}: the bytes before the index's first offset are not one bz2 header stream "
            f"({exc.__cause__ or exc}); the index does not match this dump"
        ) from exc
    start = text.find("<mediawiki")
    if start < 0 or EXPORT_NS_PREFIX not in text[start : start + 500]:
        raise DumpError(f"{dump.name}: the header stream is not a MediaWiki export; give a pages-articles dump")
    parser = PageParser(dump.name)
    parser.feed(text[: text.index(">", start) + 1].encode())
    return parser.schema_version or "unknown"


def iter_shard_pages(dump: DumpSource, shard: StreamShard, *, max_page_bytes: int = MAX_PAGE_BYTES) -> Iterator[Page]:
    """Pages of one shard, checking each stream against the index as it goes.

    Each bz2 stream (about 100 pages) is held whole while it is parsed, so it is held to ``max_page_bytes``
    decompressed: a larger one raises :class:`~rag_core.wiki.dumps.PageTooLargeError` naming its byte offset.
    """
    parser = PageParser(f"{dump.name} (bytes {shard.start:,}-{shard.end:,})", wrapped=True,
                        max_page_bytes=max_page_bytes)
    with dump.open() as raw:
        for k, stream in enumerate(shard.streams):
            stream_end = shard.streams[k + 1].offset if k + 1 < len(shard.streams) else shard.end
            if stream_end - stream.offset > max_compressed(max_page_bytes):  # refused before it is read
                raise PageTooLargeError(
                    f"{dump.name}: the bz2 stream at byte {stream.offset:,} is {stream_end - stream.offset:,} bytes "
                    f"compressed, more than any stream within the cap of {max_page_bytes:,} bytes decompressed "
                    "(max_page_bytes) can be; the index does not match this dump, or raise the cap"
                )
            data = _read_exact(raw, stream.offset, stream_end, dump)
            if not data.startswith(BZ2_MAGIC):
                raise DumpError(
                    f"{dump.name}: no bz2 stream starts at byte {stream.offset:,} as the index says; "
                    "the index does not match this dump"
                )
            xml = decompress_streams(data, dump.name, stream.offset, max_bytes=max_page_bytes)
            if xml[-64:].rstrip().endswith(FOOTER):  # the dump's last stream is its footer
                xml = xml.rstrip()[: -len(FOOTER)]
            pages = parser.feed(xml)
            found = tuple(p.page_id for p in pages)
            if found != stream.page_ids:
                raise DumpError(
                    f"{dump.name}: the stream at byte {stream.offset:,} holds pages {_preview(found)} but the index "
                    f"lists {_preview(stream.page_ids)}; use the index published with this dump"
                )
            yield from pages
    leftover = parser.close()
    if leftover:
        raise DumpError(f"{dump.name}: pages after the last indexed stream of shard {shard.shard_id}")


def max_compressed(decompressed: int) -> int:
    """The most bytes bz2 streams of ``decompressed`` bytes can take: bzip2 grows incompressible data by under
    1%, plus a few hundred bytes of headers, for a few streams back to back."""
    return decompressed + decompressed // 100 + 4096


def _read_exact(raw, start: int, end: int, dump: DumpSource) -> bytes:
    with dump.ranged_reads():
        raw.seek(start)
        data = raw.read(end - start)
    if len(data) != end - start:
        raise DumpError(
            f"{dump.name}: the file ends at byte {start + len(data):,}, before byte {end:,} that the index implies; "
            "the dump is truncated or the index belongs to another dump"
        )
    return data


def decompress_streams(data: bytes, name: str, offset: int, *, use_rust: bool = True,
                       max_bytes: int = MAX_PAGE_BYTES) -> bytes:
    """The bz2 streams in ``data`` (read from byte ``offset`` of ``name``), decompressed and concatenated.

    More than ``max_bytes`` of output raises :class:`~rag_core.wiki.dumps.PageTooLargeError`, having
    decompressed no more than that. ``use_rust=False`` takes the standard library's bz2 even where the
    Rust port is installed.
    """
    if use_rust and _rust_bz2 is not None:
        # Into a buffer one byte over the cap: the port stops when it is full. np.empty reserves address
        # space only; pages are touched as the output fills them.
        buffer = np.empty(max_bytes + 1, dtype=np.uint8)
        try:
            size = _rust_bz2.decompress_into(data, buffer)
        except _RustBz2Error as exc:
            if "write whole buffer" in str(exc):
                raise _too_large(name, offset, max_bytes) from None
            raise DumpError(
                f"{name}: corrupt or cut-short bz2 stream at byte {offset:,} ({exc}); download the dump again"
            ) from exc
        if size > max_bytes:
            raise _too_large(name, offset, max_bytes)
        return buffer[:size].tobytes()
    out: list[bytes] = []
    total = 0
    while data:
        decompressor = bz2.BZ2Decompressor()
        try:
            out.append(decompressor.decompress(data, max_length=max_bytes - total + 1))
        except OSError as exc:
            raise DumpError(f"{name}: corrupt bz2 stream at byte {offset:,} ({exc}); download the dump again") from exc
        total += len(out[-1])
        if total > max_bytes:
            raise _too_large(name, offset, max_bytes)
        if not decompressor.eof:
            raise DumpError(
                f"{name}: the bz2 stream at byte {offset:,} is cut short (truncated download?); download the dump again"
            )
        data = decompressor.unused_data
    return b"".join(out)


def _too_large(name: str, offset: int, max_bytes: int) -> PageTooLargeError:
    return PageTooLargeError(
        f"{name}: the bz2 stream at byte {offset:,} decompresses to more than the cap of {max_bytes:,} bytes "
        "(max_page_bytes); the dump is corrupt or hostile, or raise the cap for pages that large"
    )


def _preview(ids: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:3])
    return f"[{shown}{', ...' if len(ids) > 3 else ''}] ({len(ids)})"
