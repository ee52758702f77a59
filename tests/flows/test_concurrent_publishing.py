"""Publishing never deletes published data: retried moves on SeaweedFS, and two ingests of one dump at once."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import s3fs

from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource
from rag_core.wiki.ingest import (
    PASSAGES_DIR,
    STAGING_DIR,
    IngestConfig,
    dump_digest,
    make_dump_id,
    publish,
    published_manifest,
    read_passages,
    stage_part,
)
from rag_core.wiki.passages import REDIRECT_SCHEMA, PageCounts
from tests.conftest import MULTISTREAM, MULTISTREAM_INDEX, SAMPLE_BZ2, S3Server
from tests.helpers.passagefiles import sample_passages

REPO = Path(__file__).resolve().parents[2]


def _objects(fs: s3fs.S3FileSystem, prefix: str) -> dict[str, tuple[int, str, object]]:
    """Every object under ``prefix``: relative key -> (size, ETag, last modified), as the server lists them now."""
    fs.invalidate_cache(prefix)
    found = fs.find(prefix, detail=True)
    return {k[len(prefix) + 1:]: (v["size"], v["ETag"], v["LastModified"]) for k, v in found.items()
            if v.get("type") != "directory"}


def _stage(store: Store, dump_id: str, parts: int = 3) -> dict:
    """Three real parts of the sample's passages staged as an ingest run stages them; the manifest to publish."""
    table = sample_passages().slice(0, 300)
    step = table.num_rows // parts
    records = [stage_part(store, dump_id, "s3", i, table.slice(i * step, step), REDIRECT_SCHEMA.empty_table(),
                          PageCounts(passages=step)) for i in range(parts)]
    return {"parts": records, "counts": PageCounts(passages=step * parts).as_dict(),
            "dump": {"url": str(SAMPLE_BZ2), "sha256": "0" * 64, "bytes": 0}}


def _check_complete(store: Store, dump_id: str) -> dict:
    """The published set's manifest, after checking every part it names is there with the bytes it records."""
    manifest = published_manifest(store, dump_id)
    root = store.child(PASSAGES_DIR, dump_id)
    for part in manifest["parts"]:
        assert hashlib.sha256(root.read_bytes(part["path"])).hexdigest() == part["sha256"], part["path"]
        assert root.exists(part["redirects"]), part["redirects"]
    assert read_passages(store, dump_id).num_rows == manifest["counts"]["passages"]
    return manifest


def test_a_publish_retried_after_a_partial_s3_move_brings_every_part_and_never_rewrites_a_published_set(
        wiki: Path, s3_server: S3Server, tmp_path: Path) -> None:
    prefix = f"{s3_server.bucket}/retried-{tmp_path.name}"
    store = Store(f"s3://{prefix}", s3_server.options())
    fs = s3fs.S3FileSystem(**s3_server.options(), skip_instance_cache=True)
    manifest = _stage(store, "d1")
    staging = (PASSAGES_DIR, STAGING_DIR, "d1", "s3")

    # A run killed part-way through its move: two of the six files copied, one more left as a different object of
    # the same name (another attempt's), no manifest.
    store.copy_missing(staging, (PASSAGES_DIR, "d1"), ["part-00000.parquet", "redirects-00001.parquet"])
    store.write_bytes(b"not this run's part", PASSAGES_DIR, "d1", "part-00002.parquet")
    copied_before = _objects(fs, f"{prefix}/{PASSAGES_DIR}/d1")
    assert published_manifest(store, "d1") is None and len(copied_before) == 3

    published = publish(store, "d1", "s3", manifest)
    assert _check_complete(store, "d1") == published
    after = _objects(fs, f"{prefix}/{PASSAGES_DIR}/d1")
    assert sorted(after) == sorted(["manifest.json"] + [f"{k}-0000{i}.parquet" for i in range(3)
                                                         for k in ("part", "redirects")])
    # What the killed run had copied whole was kept as it was (not copied again); the stray object was replaced.
    assert all(after[k] == copied_before[k] for k in ("part-00000.parquet", "redirects-00001.parquet"))
    assert after["part-00002.parquet"] != copied_before["part-00002.parquet"]
    assert _objects(fs, f"{prefix}/{PASSAGES_DIR}/{STAGING_DIR}") == {}  # the staging went, after the manifest

    # Another run of the same dump publishing later: the published set stays byte for byte (same ETags), its
    # manifest is the one returned, and only that run's staging goes.
    again = publish(store, "d1", "s3", _stage(store, "d1") | {"gate": "a later run"})
    assert again == published and _objects(fs, f"{prefix}/{PASSAGES_DIR}/d1") == after
    assert _objects(fs, f"{prefix}/{PASSAGES_DIR}/{STAGING_DIR}") == {}

    # A destination part deleted behind the store's back (the retry of a move that had only begun) is brought back
    # by the next move, from a staging that still holds it.
    _stage(store, "d2")
    store.copy_missing(staging[:2] + ("d2", "s3"), (PASSAGES_DIR, "d2"))
    fs.rm(f"{prefix}/{PASSAGES_DIR}/d2/part-00001.parquet")
    publish(store, "d2", "s3", _stage(store, "d2"))
    _check_complete(store, "d2")


def _dump_id(config: IngestConfig) -> str:
    source = DumpSource(config.dump)
    return make_dump_id(source.name, dump_digest(source)[0], config)


class PublishedWatch(threading.Thread):
    """Polls a passage set while runs publish it: from the moment its manifest exists, every object it had stays,
    byte for byte (same ETag and modification time), every part the manifest names exists and the set reads whole."""

    def __init__(self, store: Store, fs: s3fs.S3FileSystem, prefix: str, dump_id: str) -> None:
        super().__init__(daemon=True)
        self.store, self.fs, self.prefix, self.dump_id = store, fs, prefix, dump_id
        self.first: dict | None = None  # the objects when the manifest first appeared
        self.problems: list[str] = []
        self.reads = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                self.look()
            except Exception as exc:  # a part missing or torn while published: that is what this watches for
                self.problems.append(f"{type(exc).__name__}: {exc}")

    def look(self) -> None:
        objects = _objects(self.fs, f"{self.prefix}/{PASSAGES_DIR}/{self.dump_id}")
        if "manifest.json" not in objects:
            if self.first is not None:
                self.problems.append("the manifest disappeared")
            return
        if self.first is None:
            self.first = objects
        if changed := [k for k, v in self.first.items() if objects.get(k) != v]:
            self.problems.append(f"published objects deleted or rewritten: {changed}")
        manifest = published_manifest(self.store, self.dump_id)
        if missing := [p["path"] for p in manifest["parts"] if p["path"] not in objects]:
            self.problems.append(f"manifest names missing parts {missing}")
        assert read_passages(self.store, self.dump_id).num_rows == manifest["counts"]["passages"]
        self.reads += 1


@pytest.mark.slow
def test_two_ingests_of_one_dump_at_once_on_s3_both_succeed_and_nothing_published_is_deleted(
        wiki: Path, home: Path, tmp_path: Path, prefect_server: str, s3_server: S3Server) -> None:
    """The scheduled run and a manual one of the same dump, as two real ``wikirag ingest`` processes on SeaweedFS,
    the second started while the first holds its lease, cutting the dump differently (2 shards against 3)."""
    prefix = f"{s3_server.bucket}/concurrent-{tmp_path.name}"
    store = Store(f"s3://{prefix}", s3_server.options())
    fs = s3fs.S3FileSystem(**s3_server.options(), skip_instance_cache=True)
    dump_id = _dump_id(IngestConfig(dump=str(MULTISTREAM), index=str(MULTISTREAM_INDEX)))
    env = {**os.environ, **s3_server.env(), "WIKIRAG_STORE": f"s3://{prefix}", "WIKIRAG_WORKERS": "1",
           "PYTHONPATH": str(REPO), "PREFECT_API_URL": prefect_server}
    args = [sys.executable, "-m", "cli.wikirag", "ingest", str(MULTISTREAM), "--index", str(MULTISTREAM_INDEX)]
    watch = PublishedWatch(store, fs, prefix, dump_id)
    watch.start()
    runs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)]
    try:
        deadline = time.monotonic() + 240
        while not fs.exists(f"{prefix}/leases/ingest/{dump_id}.json"):  # the first run is at work
            assert runs[0].poll() is None and time.monotonic() < deadline, "the first ingest never took its lease"
            fs.invalidate_cache()
            time.sleep(0.1)
        runs.append(subprocess.Popen([*args, "--shards", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env))
        outputs = [run.communicate(timeout=600) for run in runs]
    finally:
        for run in runs:
            run.kill()
        watch.stop.set()
        watch.join()
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, err[-3000:]
        assert out.strip() == store.url_of(PASSAGES_DIR, dump_id)  # both report the one published set
    (_, first_err), (_, second_err) = outputs
    assert "already published" not in first_err  # the first published
    assert "already published" in second_err  # the second waited for it, or found it done, and reused it
    print(f"second run waited: {'waiting (up to' in second_err}; the watcher read the set {watch.reads} times")

    assert watch.problems == [] and watch.first is not None and watch.reads > 0
    final = _objects(fs, f"{prefix}/{PASSAGES_DIR}/{dump_id}")
    assert final == watch.first  # nothing published was deleted or rewritten, nothing added after the manifest
    manifest = _check_complete(store, dump_id)
    assert [p["path"] for p in manifest["parts"]] == [f"part-0000{i}.parquet" for i in range(3)]  # the first's cut
    assert _objects(fs, f"{prefix}/{PASSAGES_DIR}/{STAGING_DIR}") == {}  # both runs' staging went
    assert _objects(fs, f"{prefix}/leases") == {}  # both released their lease
