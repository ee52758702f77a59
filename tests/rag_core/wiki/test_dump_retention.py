"""``wikirag dumps gc``: real mirrors of a loopback dump site (rag_core.wiki.dump_mirror) on a store; what goes and
what stays: the newest complete mirror, the one behind LATEST, a copy in flight; old mirrors and stale pieces go."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.wikirag import main
from rag_core.storage import Store
from rag_core.wiki.dump_mirror import DUMPS_DIR, RECORD, STAGING_DIR, mirror_dump
from rag_core.wiki.dump_retention import DumpRetentionError, mirror_garbage
from rag_core.wiki.dump_site import DumpSiteConfig, check_site, read_status
from tests.helpers.dumpsite import NEW, OLD, RUNNING, serve_site


def _publish_latest_from(store: Store, dump_url: str, tmp_path: Path) -> None:
    """A LATEST index whose passages' manifest names ``dump_url`` as their dump, as ingest of a mirror records."""
    import pyarrow as pa

    from rag_core.index.build import build_version
    from rag_core.index.embedding_files import EmbedConfig
    from rag_core.index.encoders import Encoder, EncoderConfig
    from rag_core.index.faiss_index import IndexConfig
    from rag_core.wiki.ingest import PASSAGE_SCHEMA, publish, stage_part
    from rag_core.wiki.passages import REDIRECT_SCHEMA, PageCounts
    from tests.helpers.encoderfiles import save_tiny_bert

    rows = [{"passage_id": f"{i}-1-0", "page_id": i, "revision_id": 1, "chunk": 0, "title": f"T{i}",
             "text": f"passage number {i} of the old dump", "n_words": 7} for i in range(1, 9)]
    passages = pa.Table.from_pylist(rows, schema=PASSAGE_SCHEMA)
    counts = PageCounts(passages=len(rows))
    record = stage_part(store, "old", "test", 0, passages, REDIRECT_SCHEMA.empty_table(), counts)
    publish(store, "old", "test", {"parts": [record], "counts": counts.as_dict(),
                                   "dump": {"url": dump_url, "sha256": "0" * 64, "bytes": 0}})
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(tmp_path / "bert")), dtype="float32"))
    build_version(store, "old", EmbedConfig(encoder=encoder.config, shards=1), IndexConfig(factory="Flat"),
                  encoder=encoder)


def test_gc_removes_old_mirrors_and_stale_pieces_and_keeps_latest_newest_and_in_flight(
        tmp_path: Path, capsys: pytest.CaptureFixture, home: Path) -> None:
    store = Store(str(tmp_path / "store"))
    with serve_site(tmp_path / "site") as site:
        config = DumpSiteConfig(site=site.url, wiki="enwiki", piece_bytes=16 << 10, backoff_s=0.05)
        mirrors = {date: mirror_dump(config, read_status(config, config.client(), date), store) for date in (OLD, NEW)}
        assert check_site(config, None).newer.date == NEW
    # what killed runs leave: pieces of the old date, and a copy of a newer date in flight (pieces, no record)
    store.write_bytes(b"piece", DUMPS_DIR, STAGING_DIR, "enwiki", OLD, "f", "piece-000000")
    store.write_bytes(b"piece", DUMPS_DIR, STAGING_DIR, "enwiki", RUNNING, "f", "piece-000000")
    store.write_bytes(b"part", DUMPS_DIR, "enwiki", RUNNING, "enwiki-part.bz2")
    listed = sorted(store.files())

    with pytest.raises(DumpRetentionError, match="keep=0: keep at least the newest complete mirror"):
        mirror_garbage(store, "enwiki", keep=0)
    assert main(["dumps", "gc", "--store", store.url, "--dry-run"]) == 0
    assert capsys.readouterr().out.split() == [store.url_of(DUMPS_DIR, "enwiki", OLD),
                                               store.url_of(DUMPS_DIR, STAGING_DIR, "enwiki", OLD)]
    assert sorted(store.files()) == listed  # a dry run removes nothing

    _publish_latest_from(store, mirrors[OLD].dump_url, tmp_path)  # LATEST was built from the old mirror: it stays
    assert main(["dumps", "gc", "--store", store.url]) == 0
    assert capsys.readouterr().out.split() == [store.url_of(DUMPS_DIR, STAGING_DIR, "enwiki", OLD)]
    assert store.exists(DUMPS_DIR, "enwiki", OLD, RECORD) and store.exists(DUMPS_DIR, "enwiki", NEW, RECORD)
    assert store.list(DUMPS_DIR, STAGING_DIR, "enwiki") == [RUNNING]
    assert store.exists(DUMPS_DIR, "enwiki", RUNNING, "enwiki-part.bz2")

    store.remove("indexes")  # nothing published: the newest complete mirror alone is kept
    assert main(["dumps", "gc", "--store", store.url]) == 0
    assert sorted(store.list(DUMPS_DIR, "enwiki")) == [NEW, RUNNING]
    assert store.read_bytes(DUMPS_DIR, "enwiki", NEW, mirrors[NEW].dump_url.rsplit("/", 1)[-1])
