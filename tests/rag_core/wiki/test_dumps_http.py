"""Dumps read over HTTP from a real (loopback) server that, like many, ignores Range; one that stalls is stopped
by the read timeout, one that is slow but steady is read to the end."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rag_core.errors import DumpError
from rag_core.storage import StoreUnreachableError
from rag_core.wiki.dumps import DumpServerTimeoutError, DumpSource, iter_pages
from rag_core.wiki.ingest import dump_digest
from rag_core.wiki.multistream import iter_shard_pages, plan_shards, read_index
from tests.conftest import MULTISTREAM, MULTISTREAM_INDEX, SAMPLE_BZ2


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_root(wiki: Path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(wiki)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_whole_dump_streams_over_http(http_root: str) -> None:
    remote = DumpSource(http_root + SAMPLE_BZ2.name)
    assert list(iter_pages(remote)) == list(iter_pages(DumpSource(str(SAMPLE_BZ2))))
    assert dump_digest(remote) == dump_digest(DumpSource(str(SAMPLE_BZ2)))


def test_index_needs_range_requests(http_root: str) -> None:
    dump = DumpSource(http_root + MULTISTREAM.name)
    streams = read_index(DumpSource(http_root + MULTISTREAM_INDEX.name))
    with pytest.raises(DumpError, match="does not support range requests.*without --index"):
        for shard in plan_shards(streams, dump.size(), 2):
            list(iter_shard_pages(dump, shard))


class _Paced(BaseHTTPRequestHandler):
    """Serves ``body`` in ``pieces`` parts, ``pause`` seconds apart (headers first, then the pieces)."""

    body = b""
    pieces = 1
    pause = 0.0

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.flush()
        step = -(-len(self.body) // self.pieces)
        for start in range(0, len(self.body), step):
            time.sleep(self.pause)
            try:
                self.wfile.write(self.body[start:start + step])
                self.wfile.flush()
            except OSError:  # the reader gave up
                return

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _paced_server(body: bytes, pieces: int, pause: float) -> Iterator[str]:
    handler = type("Handler", (_Paced,), {"body": body, "pieces": pieces, "pause": pause})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{SAMPLE_BZ2.name}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_stalls_past_the_read_timeout_is_one_line_that_says_so(wiki: Path) -> None:
    """Headers, then the first piece of the dump, then silence longer than read_timeout_s."""
    data = SAMPLE_BZ2.read_bytes()
    with _paced_server(data, pieces=2, pause=6.0) as url:
        started = time.monotonic()
        with pytest.raises(DumpServerTimeoutError) as stalled:
            list(iter_pages(DumpSource(url, read_timeout_s=1.5)))
        took = time.monotonic() - started
    assert str(stalled.value) == (f"{url}: the dump server did not answer for 1.5 s; check that it is up and rerun "
                                  "(finished work is reused), or raise DumpSource.read_timeout_s for a slow server")
    assert isinstance(stalled.value, StoreUnreachableError)  # a transport error: the ingest's tasks retry it
    assert took < 5.5  # the read timeout ended it, not the server's pause


def test_a_slow_but_steady_server_is_read_to_the_end(wiki: Path) -> None:
    """No limit on the whole download: pieces every 0.4 s for ~6 s, four times the read timeout, all read."""
    data = SAMPLE_BZ2.read_bytes()
    with _paced_server(data, pieces=15, pause=0.4) as url:
        started = time.monotonic()
        remote = DumpSource(url, read_timeout_s=1.5)
        assert dump_digest(remote) == dump_digest(DumpSource(str(SAMPLE_BZ2)))
        took = time.monotonic() - started
    assert took > 4 * 1.5
