"""Guarantee: LATEST moves only forward, to a version created after the one it names, on a local folder and on a
real S3 server (SeaweedFS), through builds finishing out of order and publishers racing.

Each version is a real FAISS shard written into a version named when its "build" starts (``new_version_id``);
publishing is the real ``publish_manifest``: the manifest, then the conditional move of LATEST.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import faiss
import numpy as np
import pytest

from rag_core.index.latest import move_latest
from rag_core.index.version_names import LATEST, IndexVersionError, new_version_id, version_created_at
from rag_core.index.versions import (
    PublishedVersion,
    latest_version,
    list_versions,
    publish_manifest,
    read_index_manifest,
    write_shard,
)
from rag_core.storage import Store
from tests.conftest import S3Server

FIELDS = {"dim": 8, "metric": "ip", "factory": "Flat"}


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "store"))
    s3: S3Server = request.getfixturevalue("s3_server")
    return Store(f"s3://{s3.bucket}/latest-{tmp_path.name}", s3.options())


def planned(store: Store, seed: int) -> tuple[str, list]:
    """A version named now (as a build's plan names it) with one real FAISS shard written, not yet published."""
    version = new_version_id()
    time.sleep(0.002)  # names carry milliseconds: the next one is later
    vectors = np.random.default_rng(seed).standard_normal((12, FIELDS["dim"])).astype("float32")
    index = faiss.IndexFlatIP(FIELDS["dim"])
    index.add(vectors)
    passages = [f"p{seed}-{i}" for i in range(12)]
    entry = write_shard(store, version, 0, (faiss.serialize_index(index).tobytes(), passages))
    return version, [entry]


def test_an_older_build_published_last_is_published_but_latest_stays_on_the_newer(store: Store) -> None:
    older, older_shards = planned(store, 1)  # the slow rebuild: planned first ...
    newer, newer_shards = planned(store, 2)
    assert publish_manifest(store, newer, newer_shards, FIELDS).latest == newer
    published = publish_manifest(store, older, older_shards, FIELDS)  # ... finished last
    assert isinstance(published, PublishedVersion) and (published, published.latest) == (older, newer)
    assert latest_version(store) == newer
    assert list_versions(store) == [older, newer]  # published: listed, and readable by name
    assert read_index_manifest(store, older).created_at == version_created_at(older) < version_created_at(newer)
    assert published.manifest == read_index_manifest(store, older)

    # A deliberate move back (deleting the LATEST version) says so; the default never moves back.
    assert move_latest(store, older) == newer and latest_version(store) == newer
    assert move_latest(store, older, allow_backwards=True) == older and latest_version(store) == older
    assert move_latest(store, newer) == newer and latest_version(store) == newer


def test_racing_publishers_end_on_the_newest_and_latest_never_moves_back(store: Store) -> None:
    for round_ in range(6):
        versions = [planned(store, 10 * round_ + i) for i in range(6)]
        seen: list[str] = []
        done = threading.Event()

        def watch() -> None:  # LATEST as a reader sees it, all through the race
            while not done.is_set():
                if (now := latest_version(store)) is not None and (not seen or seen[-1] != now):
                    seen.append(now)

        start = threading.Barrier(len(versions))
        results: dict[str, str] = {}

        def publish(version: str, shards: list) -> None:
            start.wait()
            results[version] = publish_manifest(store, version, shards, FIELDS).latest

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=publish, args=v) for v in reversed(versions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        newest = versions[-1][0]
        seen.append(latest_version(store))
        print(f"round {round_}: LATEST moved through {len(set(seen))} versions")
        assert len(results) == len(versions) and latest_version(store) == newest
        assert all(latest >= version for version, latest in results.items())  # names sort by creation time
        assert seen == sorted(seen), seen  # no reader ever saw LATEST step back


def _wrote_latest(method: str, path: str) -> bool:
    return method == "PUT" and path.split("?")[0].endswith("/indexes/LATEST")


@pytest.fixture
def proxied(s3_server: S3Server, tmp_path) -> Iterator[tuple[Store, Store, object]]:
    """(a store through a proxy in front of SeaweedFS, the same store reached directly, the proxy)."""
    from tests.helpers.wikirag_runs import Busy503Proxy

    prefix = f"{s3_server.bucket}/race-{tmp_path.name}"
    with Busy503Proxy(s3_server.endpoint) as proxy:
        yield (Store(f"s3://{prefix}", {**s3_server.options(), "endpoint_url": proxy.url}),
               Store(f"s3://{prefix}", s3_server.options()), proxy)


@pytest.mark.parametrize("rival", ["newer", "older", "ours"])
def test_a_publisher_whose_compare_is_overtaken_compares_again(proxied, rival: str) -> None:
    """Between this publisher's compare and its write, a rival rewrites LATEST (for real, straight to SeaweedFS):
    the write, conditional on the ETag compared, is refused (412 from SeaweedFS); the publisher reads LATEST again
    and moves it only when its version is still the newer one. ``ours``: the very write landed already (as when
    the answer to a first PUT is lost and botocore sends it again): the refusal is not an error."""
    through_proxy, direct, proxy = proxied
    (oldest, a), (older, b), (ours, shards), (newest, c) = (planned(direct, seed) for seed in range(4))
    for version, entries in ((oldest, a), (older, b), (newest, c)):
        publish_manifest(direct, version, entries, FIELDS)
    assert move_latest(direct, older, allow_backwards=True) == older  # ours compares newer than this
    target = {"newer": newest, "older": oldest, "ours": ours}[rival]  # a newer build, a delete moving LATEST back
    puts: list[str] = []

    def rival_writes_first(method: str, path: str) -> bool:
        if _wrote_latest(method, path):
            puts.append(path)
            if len(puts) == 1:  # our first write: the rival's lands between our compare and it
                assert move_latest(direct, target, allow_backwards=True) == target
        return False  # then relayed to SeaweedFS unchanged

    proxy.fail_when = rival_writes_first
    published = publish_manifest(through_proxy, ours, shards, FIELDS)
    proxy.fail_when = None
    expected = newest if rival == "newer" else ours
    assert (published, published.latest, latest_version(direct)) == (ours, expected, expected)
    # One refused write, then a new compare: a second write only when ours is still the newer version.
    assert len(puts) == (2 if rival == "older" else 1), puts


def test_a_forced_delete_of_the_latest_version_moves_latest_back_on_purpose(store: Store) -> None:
    """``indexes delete --force`` of LATEST's version is the one move back: LATEST then names the newest version
    left, never the deleted one."""
    from rag_core.index.retention import delete_version

    (older, a), (newer, b) = planned(store, 1), planned(store, 2)
    for version, entries in ((older, a), (newer, b)):
        publish_manifest(store, version, entries, FIELDS)
    delete_version(store, newer, force=True)
    assert list_versions(store) == [older] and latest_version(store) == older
    assert read_index_manifest(store).version == older  # readers through LATEST get a whole version


def test_a_latest_naming_no_version_is_replaced_and_a_damaged_one_is_one_line(store: Store) -> None:
    """A LATEST someone pointed outside the store compares older than any published version (its 'manifest' is
    never read); one that is not a pointer at all stops the move with one line naming the file and the fix."""
    version, shards = planned(store, 1)
    indexes = store.child("indexes")
    indexes.write_json({"version": "../../../etc", "manifest_sha256": "0" * 64}, LATEST)
    assert publish_manifest(store, version, shards, FIELDS).latest == version == latest_version(store)

    indexes.write_bytes(b"\x00not json", LATEST)
    with pytest.raises(IndexVersionError, match=rf"^{re.escape(indexes.url_of(LATEST))}: not a LATEST pointer; .* "
                                                "or delete the file$"):
        move_latest(store, version)
    assert indexes.read_bytes(LATEST) == b"\x00not json"  # left for a person to look at
