"""Dump acquisition against a real (loopback) HTTP server in Wikimedia's layout: resolving the newest complete
dated dump, one request when nothing changed, a polite wait on 429/503, a resumable mirror verified by sha1 into a
local and a real S3 store (SeaweedFS), and a wrong or changed sum that keeps nothing."""

from __future__ import annotations

import hashlib
import logging
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_core.storage import Store
from rag_core.wiki.dump_http import DumpSiteError, DumpSiteNotFoundError, DumpSiteUnavailableError
from rag_core.wiki.dump_mirror import (
    ChecksumMismatchError,
    find_mirror,
    mirror_dump,
    piece_bounds,
    verify_mirror,
)
from rag_core.wiki.dump_site import DumpSiteConfig, check_site, dump_date_of, read_status
from rag_core.wiki.dumps import DumpSource
from rag_core.wiki.multistream import iter_shard_pages, plan_shards, read_index
from tests.helpers.dumpsite import DUMP, EDITED, INDEX, NEW, OLD, RUNNING, DumpSiteServer, file_name, serve_site, site_pages

PIECE = 16 << 10  # the enwiki dumps here are ~60-70 KB: a few pieces each


@pytest.fixture
def site(tmp_path: Path) -> Iterator[DumpSiteServer]:
    with serve_site(tmp_path / "site") as running:
        yield running


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "store"))
    s3 = request.getfixturevalue("s3_server")
    return Store(f"s3://{s3.bucket}/dumps-{uuid.uuid4().hex[:8]}", s3.options())


def config(site: DumpSiteServer, **overrides: object) -> DumpSiteConfig:
    return DumpSiteConfig(**{"site": site.url, "wiki": "enwiki", "piece_bytes": PIECE, "backoff_s": 0.05, **overrides})


def site_bytes(site: DumpSiteServer, wiki: str, date: str, suffix: str) -> bytes:
    return (site.root / wiki / date / file_name(wiki, date, suffix)).read_bytes()


def test_the_newest_complete_run_is_resolved_past_one_in_progress(site: DumpSiteServer) -> None:
    check = check_site(config(site), current=OLD)
    assert check.newer is not None and check.newer.date == NEW and check.in_progress == (RUNNING,)
    # The recombined file of a large wiki, not its parts; sizes and sums as the site publishes them.
    assert check.newer.dump.name == file_name("enwiki", NEW, DUMP)
    assert check.newer.dump.size == len(site_bytes(site, "enwiki", NEW, DUMP))
    assert check.newer.dump.sha1 == hashlib.sha1(site_bytes(site, "enwiki", NEW, DUMP)).hexdigest()
    assert [r.path for r in site.log] == ["/enwiki/", f"/enwiki/{RUNNING}/dumpstatus.json",
                                          f"/enwiki/{NEW}/dumpstatus.json"]
    assert "newer: enwiki-20261120 is complete" in check.describe()
    assert check_site(config(site), current=None).newer.date == NEW  # nothing published yet: the newest complete


def test_an_unchanged_dump_costs_one_request(site: DumpSiteServer) -> None:
    # Between runs: the newest dated run is the one behind the index.
    shutil.rmtree(site.root / "enwiki" / RUNNING)
    check = check_site(config(site), current=NEW)
    assert check.newer is None and check.requests == 1
    assert [r.path for r in site.log] == ["/enwiki/"]
    assert check.describe().startswith("unchanged: the index is built from enwiki-20261120, no newer complete dump")


def test_a_run_in_progress_costs_its_status_too(site: DumpSiteServer) -> None:
    check = check_site(config(site), current=NEW)
    assert check.newer is None and check.in_progress == (RUNNING,) and check.requests == 2
    assert [r.path for r in site.log] == ["/enwiki/", f"/enwiki/{RUNNING}/dumpstatus.json"]
    assert "still running: 20261201" in check.describe()


def test_the_date_behind_an_index_is_read_from_its_dump_url() -> None:
    mirrored = f"s3://b/dumps/enwiki/{NEW}/enwiki-{NEW}-{DUMP}"
    assert dump_date_of(mirrored, "enwiki") == NEW
    assert dump_date_of(f"https://dumps.wikimedia.org/enwiki/{NEW}/enwiki-{NEW}-{DUMP}/", "enwiki") == NEW
    assert dump_date_of(f"https://dumps.wikimedia.org/enwiki/latest/enwiki-latest-{DUMP}", "enwiki") is None
    assert dump_date_of(mirrored, "dewiki") is None
    assert dump_date_of("/data/enwiki-sample-pages-articles-multistream.xml.bz2", "enwiki") is None


@pytest.mark.parametrize("status", [503, 429])
def test_a_busy_site_is_waited_for_as_retry_after_asks(site: DumpSiteServer, status: int) -> None:
    site.busy["/enwiki/"] = [(status, "1")]
    check = check_site(config(site, backoff_s=0.0), current=NEW)
    assert check.newer is None and check.requests == 3  # the listing twice, the status of the run in progress
    first, second = site.requests_to("/enwiki/")
    assert second.at - first.at >= 0.95  # Retry-After: 1, although the client's own back-off is 0


def test_a_retry_after_past_the_longest_wait_ends_the_run_at_once(site: DumpSiteServer) -> None:
    site.busy["/enwiki/"] = [(503, "3600")]
    with pytest.raises(DumpSiteError, match=r"/enwiki/: the dump site answered HTTP 503 and asks to wait "
                                                        r"3600 s, longer than max_wait_s \(60 s\); rerun later"):
        check_site(config(site, max_wait_s=60), current=NEW)
    assert len(site.log) == 1


def test_a_site_busy_through_every_try_is_a_transport_error(site: DumpSiteServer,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    site.busy["/enwiki/"] = [(503, "0")] * 3
    with caplog.at_level(logging.WARNING, logger="wikirag.dumps"), \
            pytest.raises(DumpSiteUnavailableError, match="HTTP 503 through 3 tries; the dump site is busy or down"):
        check_site(config(site, tries=3), current=NEW)
    assert len(site.log) == 3
    # each wait is said as it starts, so a slow site is never a silent one
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == ["HTTP 503; try 2 of 3 in 0.0 s",
                                                                         "HTTP 503; try 3 of 3 in 0.0 s"]


def test_a_host_name_that_does_not_resolve_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A name no DNS resolves (``.invalid`` is reserved for that, RFC 2606; with no network, none resolves): the
    network or the URL, not a busy site."""
    unresolvable = DumpSiteConfig(site="http://dumps.wikirag.invalid/", wiki="enwiki", tries=2, backoff_s=0.05)
    with pytest.raises(DumpSiteUnavailableError) as error:
        check_site(unresolvable, current=NEW)
    assert str(error.value) == ("http://dumps.wikirag.invalid/enwiki/: the host name does not resolve (gaierror) "
                                "through 2 tries; check this machine's network and DNS, or the dump site's URL")


def test_a_port_where_nothing_listens_points_at_the_url() -> None:
    """A refused connection is a wrong --site as often as a site that is down: the one line says both."""
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago, on loopback: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = DumpSiteConfig(site=f"http://127.0.0.1:{port}/", wiki="enwiki", tries=2, backoff_s=0.01)
    with pytest.raises(DumpSiteUnavailableError) as error:
        check_site(refused, current=NEW)
    assert str(error.value) == (f"http://127.0.0.1:{port}/enwiki/: connection refused through 2 tries; check the dump "
                                "site's URL, or rerun later if it is down (a mirror keeps the pieces it has)")


def test_a_status_pointing_off_the_site_is_refused(site: DumpSiteServer) -> None:
    status = site.root / "enwiki" / NEW / "dumpstatus.json"
    status.write_text(status.read_text().replace(f'"/enwiki/{NEW}/enwiki-{NEW}-{DUMP}"',
                                                 f'"http://127.0.0.1:9/enwiki-{NEW}-{DUMP}"'))
    with pytest.raises(DumpSiteError, match=f"enwiki-{NEW}-{DUMP} is said to be at http://127.0.0.1:9/.*only "
                                            "mirrored from the site asked for"):
        read_status(config(site), config(site).client(), NEW)


def test_the_mirror_is_the_site_s_bytes_and_parses(site: DumpSiteServer, store: Store) -> None:
    site.delay_s = 0.2  # pieces overlap: the two connections are both used, never more
    dated = check_site(config(site), current=OLD).newer
    mirror = mirror_dump(config(site), dated, store)
    folder = store.child("dumps", "enwiki", NEW)
    assert folder.read_bytes(dated.dump.name) == site_bytes(site, "enwiki", NEW, DUMP)
    assert folder.read_bytes(dated.index.name) == site_bytes(site, "enwiki", NEW, INDEX)
    assert site.max_in_flight == 2
    ranges = {r.range for r in site.requests_to(f"/enwiki/{NEW}/{dated.dump.name}")}
    assert ranges == {f"bytes={a}-{b - 1}" for a, b in piece_bounds(dated.dump.size, PIECE)}
    assert store.files("dumps", "_staging") == {}
    assert find_mirror(store, "enwiki", NEW) == mirror
    assert mirror.record["files"][dated.dump.name]["sha1"] == dated.dump.sha1

    options = dict(store.options)
    dump, index = DumpSource(mirror.dump_url, options), DumpSource(mirror.index_url, options)
    pages = [p for shard in plan_shards(read_index(index), dump.size(), 3) for p in iter_shard_pages(dump, shard)]
    assert [p.title for p in pages] == [title for _, title, _ in site_pages(NEW)]
    assert all(f"The capital is {EDITED[k]}." in pages[k].text for k in EDITED)

    seen = len(site.log)
    assert mirror_dump(config(site), dated, store) == mirror  # mirrored already: the site is not asked again
    assert len(site.log) == seen


def test_an_interrupted_mirror_resumes_with_the_missing_pieces_only(site: DumpSiteServer, store: Store) -> None:
    dated = check_site(config(site), current=OLD).newer
    path = f"/enwiki/{NEW}/{dated.dump.name}"
    pieces = piece_bounds(dated.dump.size, PIECE)
    site.cut.add((path, pieces[2][0]))  # the connection drops halfway through the third piece, every time
    with pytest.raises(DumpSiteUnavailableError, match=f"{dated.dump.name}: IncompleteRead through 1 tries"):
        mirror_dump(config(site, tries=1), dated, store)
    assert not store.exists("dumps", "enwiki", NEW, dated.dump.name)  # the final key holds nothing partial
    assert not store.exists("dumps", "enwiki", NEW, "mirror.json")
    staged = store.files("dumps", "_staging", "enwiki", NEW, dated.dump.name)
    assert "piece-000002" not in staged and {"piece-000000", "piece-000001"} <= set(staged)
    assert all(size == pieces[int(name[6:])][1] - pieces[int(name[6:])][0] for name, (size, _) in staged.items())

    site.cut.clear()
    before = len(site.log)
    mirror = mirror_dump(config(site), dated, store)
    asked = {r.range for r in site.requests_to(path, since=before)}
    missing = {f"bytes={a}-{b - 1}" for k, (a, b) in enumerate(pieces) if f"piece-{k:06d}" not in staged}
    assert asked == missing and len(missing) < len(pieces)
    assert site.requests_to(f"/enwiki/{NEW}/{dated.index.name}", since=before) == []  # verified in the first run
    assert store.read_bytes("dumps", "enwiki", NEW, dated.dump.name) == site_bytes(site, "enwiki", NEW, DUMP)
    verify_mirror(store, mirror)


def test_a_wrong_published_sum_keeps_nothing(site: DumpSiteServer, store: Store) -> None:
    de = DumpSiteConfig(site=site.url, wiki="dewiki", piece_bytes=PIECE)
    dated = check_site(de, current=None).newer
    with pytest.raises(ChecksumMismatchError) as caught:
        mirror_dump(de, dated, store)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{site.url}/dewiki/{OLD}/{dated.dump.name}: sha1 ")
    assert f"differs from the published {dated.dump.sha1}" in message and "nothing was kept" in message
    assert not store.exists("dumps", "dewiki", OLD, dated.dump.name)
    assert not store.exists("dumps", "dewiki", OLD, "mirror.json")
    assert store.files("dumps", "_staging", "dewiki", OLD, dated.dump.name) == {}
    assert [n for n in store.files("dumps") if n.endswith(".tmp")] == []
    assert find_mirror(store, "dewiki", OLD) is None


def test_a_changed_mirror_is_refused(site: DumpSiteServer, store: Store) -> None:
    dated = check_site(config(site), current=OLD).newer
    mirror = mirror_dump(config(site), dated, store)
    data = bytearray(store.read_bytes("dumps", "enwiki", NEW, dated.dump.name))
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped in a page stream
    store.write_bytes(bytes(data), "dumps", "enwiki", NEW, dated.dump.name)
    with pytest.raises(ChecksumMismatchError, match=f"{dated.dump.name}: sha1 [0-9a-f]{{40}} .* differs from the "
                                                    f"{dated.dump.sha1} .* recorded when it was mirrored"):
        verify_mirror(store, mirror)


def test_an_unknown_wiki_is_one_line(site: DumpSiteServer) -> None:
    with pytest.raises(DumpSiteNotFoundError, match=r"/nowiki/: not on the dump site \(HTTP 404\); check the site "
                                                    "and wiki names"):
        check_site(DumpSiteConfig(site=site.url, wiki="nowiki"), current=None)


def test_sums_that_disagree_are_refused_before_a_byte_is_mirrored(site: DumpSiteServer, tmp_path: Path) -> None:
    dated = check_site(config(site), current=OLD).newer
    sums = site.root / "enwiki" / NEW / f"enwiki-{NEW}-sha1sums.txt"
    sums.write_text(sums.read_text().replace(dated.index.sha1, "0" * 40))
    store = Store(str(tmp_path / "store"))
    with pytest.raises(DumpSiteError, match=f"sha1 of {dated.index.name} is 0{{40}}, its dumpstatus.json says "
                                            f"{dated.index.sha1}; the site's sums disagree"):
        mirror_dump(config(site), dated, store)
    assert [r for r in site.log if r.range] == [] and store.files() == {}
