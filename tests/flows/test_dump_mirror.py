"""Real runs of the ``mirror_dump`` flow (Prefect server) against a loopback dump site in Wikimedia's layout: a new
dated dump is mirrored and verified, ingest parses the mirror without a request to the site, an index built from
it makes the next check cost one request and mirror nothing, and a changed mirror fails the flow before any use."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.dump_mirror import mirror_dump
from flows.ingest import ingest
from rag_core.storage import Store
from rag_core.wiki.dump_mirror import ChecksumMismatchError, MirroredDump
from rag_core.wiki.dump_site import DumpSiteConfig
from rag_core.wiki.ingest import published_manifest
from runtime.dask_runner import dask_runner
from runtime.settings import StoreAccess
from tests.helpers.dumpsite import NEW, OLD, RUNNING, DumpSiteServer, serve_site

pytestmark = pytest.mark.slow


@pytest.fixture
def site(tmp_path: Path) -> Iterator[DumpSiteServer]:
    with serve_site(tmp_path / "site") as running:
        yield running


def site_config(site: DumpSiteServer) -> DumpSiteConfig:
    return DumpSiteConfig(site=site.url, wiki="enwiki", piece_bytes=16 << 10, backoff_s=0.05)


def test_a_new_dump_is_mirrored_parsed_from_the_mirror_then_unchanged(site: DumpSiteServer, tmp_path: Path,
                                                                       prefect_server: str) -> None:
    from rag_core.index.build import build_version
    from rag_core.index.embedding_files import EmbedConfig
    from rag_core.index.encoders import Encoder, EncoderConfig
    from rag_core.index.faiss_index import IndexConfig
    from rag_core.index.versions import read_index_manifest
    from tests.helpers.encoderfiles import save_tiny_bert

    access = StoreAccess(url=str(tmp_path / "store"))
    store = access.store()
    mirror = mirror_dump(site=site_config(site), store=access)
    assert isinstance(mirror, MirroredDump) and mirror.date == NEW
    assert mirror.dump_url == store.url_of("dumps", "enwiki", NEW, f"enwiki-{NEW}-pages-articles-multistream.xml.bz2")

    asked = len(site.log)
    passages_url = ingest.with_options(task_runner=dask_runner(None, 2))(config=mirror.ingest_config(), store=access)
    assert len(site.log) == asked  # parsed from the mirror: not one request to the site
    dump_id = passages_url.rsplit("/", 1)[-1]
    assert published_manifest(store, dump_id)["dump"]["url"] == mirror.dump_url

    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(tmp_path / "bert")), dtype="float32"))
    build_version(store, dump_id, EmbedConfig(encoder=encoder.config, shards=1), IndexConfig(factory="Flat"),
                  encoder=encoder)
    assert read_index_manifest(store).dump["url"] == mirror.dump_url

    shutil.rmtree(site.root / "enwiki" / RUNNING)  # between runs: the dump behind LATEST is the newest
    asked = len(site.log)
    assert mirror_dump(site=site_config(site), store=access) is None
    assert [r.path for r in site.log[asked:]] == ["/enwiki/"]
    assert sorted(store.list("dumps", "enwiki")) == [NEW]


def test_a_changed_mirror_fails_the_flow_before_it_is_used(site: DumpSiteServer, tmp_path: Path,
                                                          prefect_server: str) -> None:
    access = StoreAccess(url=str(tmp_path / "store"))
    mirror = mirror_dump(site=site_config(site), store=access)
    path = Path(mirror.dump_url)
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x01  # inside the last stream: same size, one bit
    path.write_bytes(bytes(data))

    asked = len(site.log)
    state = mirror_dump(site=site_config(site), store=access, return_state=True)
    assert state.is_failed()
    with pytest.raises(ChecksumMismatchError, match=f"{mirror.dump_url}: sha1 .* recorded when it was mirrored; "
                                                    "the copy was changed: delete .* and mirror again"):
        state.result()
    # The check ran (nothing is published, so the dated dump is new), but no byte of the dump was asked for again.
    assert {r.path for r in site.log[asked:]} <= {"/enwiki/", f"/enwiki/{RUNNING}/dumpstatus.json",
                                                  f"/enwiki/{NEW}/dumpstatus.json"}
    assert Store(str(tmp_path / "store")).read_bytes("dumps", "enwiki", NEW, path.name) == bytes(data)
    assert OLD not in Store(str(tmp_path / "store")).list("dumps", "enwiki")
