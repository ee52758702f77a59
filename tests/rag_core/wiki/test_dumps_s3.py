"""Dumps read straight from an S3 server: whole-file streaming and ranged shard reads."""

from __future__ import annotations

from pathlib import Path

import s3fs

from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.multistream import check_layout, iter_shard_pages, plan_shards, read_index
from tests.conftest import MULTISTREAM, MULTISTREAM_INDEX, SAMPLE_BZ2, S3Server


def test_s3_dumps_give_the_same_pages(wiki: Path, s3_server: S3Server) -> None:
    fs = s3fs.S3FileSystem(**s3_server.options(), skip_instance_cache=True)
    for path in (SAMPLE_BZ2, MULTISTREAM, MULTISTREAM_INDEX):
        fs.put_file(str(path), f"{s3_server.bucket}/dumps/{path.name}")
    url = f"s3://{s3_server.bucket}/dumps/"
    local = list(iter_pages(DumpSource(str(SAMPLE_BZ2))))
    assert list(iter_pages(DumpSource(url + SAMPLE_BZ2.name, s3_server.options()))) == local

    dump = DumpSource(url + MULTISTREAM.name, s3_server.options())
    streams = read_index(DumpSource(url + MULTISTREAM_INDEX.name, s3_server.options()))
    assert check_layout(dump, streams, dump.size()) == "0.10"
    assert [p for s in plan_shards(streams, dump.size(), 3) for p in iter_shard_pages(dump, s)] == local
