"""Dumps read over HTTP from a real (loopback) server that, like many, ignores Range."""

from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rag_core.errors import DumpError
from rag_core.wiki.dumps import DumpSource, iter_pages
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
