"""Pins, references, delete and gc: what keeps index files alive, and what may go."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from rag_core.index.build import build_version
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import Encoder
from rag_core.index.faiss_index import IndexConfig, build_shard_index, serialize_index
from rag_core.index.plan import plan_version
from rag_core.index.retention import (
    CleanupConfig,
    collect_garbage,
    delete_version,
    holders,
    pin_version,
    unpin_version,
    version_pins,
)
from rag_core.index.version_names import IndexVersionError
from rag_core.index.versions import list_versions, publish_version, read_index_manifest, verify_version
from rag_core.leases import take_lease
from rag_core.storage import Store
from tests.helpers.encoderfiles import tiny_encoder
from tests.helpers.passagefiles import publish_passages, sample_passages

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DAY = 24 * 3600


def bare(store: Store) -> str:
    """A version published from bare vectors (no embedding files): enough for pins."""
    vectors = np.random.default_rng(0).standard_normal((10, 8)).astype(np.float32)
    index = serialize_index(build_shard_index(vectors, IndexConfig(factory="Flat")))
    return publish_version(store, [(index, [f"p{i}" for i in range(10)])], {"dim": 8, "metric": "ip", "factory": "Flat"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny")


def test_pins_are_one_object_per_holder_and_safe_against_concurrent_pinners(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    version, latest = bare(store), bare(store)
    names = [f"model-{i}" for i in range(8)] + ["models:/rag seq/3"]
    threads = [threading.Thread(target=pin_version, args=(store, version, name)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert version_pins(store, version) == sorted(names)  # no pinner overwrote another
    pin_version(store, version, "model-0", note="again")  # the same holder twice is one pin
    assert len(version_pins(store, version)) == len(names)
    assert holders(store, latest) == ["LATEST"] and holders(store, version)[0] == "pin 'model-0'"
    for name in names[1:]:
        unpin_version(store, version, name)
    with pytest.raises(IndexVersionError, match=r"'model-7' holds no pin on .*; its pins: 'model-0'"):
        unpin_version(store, version, "model-7")
    with pytest.raises(IndexVersionError, match="not published; pin a published version"):
        pin_version(store, "20200101T000000.000Z-00000000", "model-0")
    with pytest.raises(IndexVersionError, match="give a name of 1 to 200 characters"):
        pin_version(store, version, " ")
    with pytest.raises(IndexVersionError, match=f"refusing to delete {version}: held by pin 'model-0'"):
        delete_version(store, version, force=True)  # force overrides LATEST, never a pin
    unpin_version(store, version, "model-0")
    delete_version(store, version)
    assert list_versions(store) == [latest]


def test_a_pin_arriving_during_a_delete_keeps_the_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(str(tmp_path))
    version, _ = bare(store), bare(store)
    remove = Store.remove

    def pinned_meanwhile(self: Store, *parts: str) -> None:
        remove(self, *parts)
        if parts[-1] == "manifest.json":  # another process pins right after the manifest went
            self.write_json({"by": "late"}, version, "pins", "late.json")

    monkeypatch.setattr(Store, "remove", pinned_meanwhile)
    with pytest.raises(IndexVersionError, match="pinned meanwhile by 'late'"):
        delete_version(store, version)
    monkeypatch.undo()
    assert verify_version(store, version) == 2 and version_pins(store, version) == ["late"]


def test_shared_files_stay_while_any_version_might_read_them(wiki: Path, tmp_path: Path, tiny: Encoder) -> None:
    store = Store(str(tmp_path))
    publish_passages(store, "d1", sample_passages().slice(0, 40))
    embed = EmbedConfig(encoder=tiny.config, shards=2)
    v1 = build_version(store, "d1", embed, IndexConfig(factory="Flat"), encoder=tiny)
    v2 = build_version(store, "d1", embed, IndexConfig(factory="HNSW32"), encoder=tiny)
    v3 = build_version(store, "d1", embed.model_copy(update={"shards": 1}), encoder=tiny)
    shared = [p for e in read_index_manifest(store, v1).shards for p in e.embeddings.paths()]
    assert shared == [p for e in read_index_manifest(store, v2).shards for p in e.embeddings.paths()]

    removed = delete_version(store, v2)
    assert removed.kept == sorted(shared) and all(store.exists(p) for p in shared)

    (tmp_path / "indexes" / v1 / "manifest.json").write_text("{")  # v1's references can no longer be read
    v4 = build_version(store, "d1", embed, IndexConfig(factory="HNSW32"), encoder=tiny)  # shares v1's files
    removed = delete_version(store, v4, force=True)  # LATEST steps back to v3
    assert removed.notes == [f"embedding files kept: unreadable manifests of {v1}"]
    assert all(store.exists(p) for p in shared)  # v1 may still read them: nothing was guessed away
    later = collect_garbage(store, now=max(m for _, m in store.files().values()) + 2 * DAY)
    assert later.files == {} and f"manifests of {v1} are unreadable" in later.notes[0]
    assert verify_version(store, v3) == 4


def test_gc_collects_abandoned_leftovers_only(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    version = bare(store)
    folder = store.child("embeddings", "f" * 16, "d1")
    folder.write_bytes(b"x" * 10, "rows-0000000000-0000000010.deadbeef.npy")  # a range killed before its record
    folder.write_json({"vectors": "rows-0000000010-0000000020.gone.npy", "ids": "rows-0000000010-0000000020.gone.ids"},
                      "rows-0000000010-0000000020.json")  # a record whose files a killed delete removed
    (tmp_path / "embeddings" / ("f" * 16) / "d1" / "rows-0000000020-0000000030.npy.1234.tmp").write_bytes(b"half")
    store.write_bytes(b"part", "passages", "_staging", "dump-x", "s4", "part-00000.parquet")
    store.write_bytes(b"shard", "indexes", "20200101T000000.000Z-0000dead", "shard-00000.faiss")  # no manifest
    newest = max(m for _, m in store.files().values())

    assert collect_garbage(store, now=newest + 60).files == {}  # everything is recent: a run may still be at it
    removed = collect_garbage(store, CleanupConfig(older_than_hours=1), now=newest + 2 * 3600)
    assert sorted(removed.files) == sorted([
        f"embeddings/{'f' * 16}/d1/rows-0000000000-0000000010.deadbeef.npy",
        f"embeddings/{'f' * 16}/d1/rows-0000000010-0000000020.json",
        f"embeddings/{'f' * 16}/d1/rows-0000000020-0000000030.npy.1234.tmp",
        "passages/_staging/dump-x/s4/part-00000.parquet",
        "indexes/20200101T000000.000Z-0000dead/shard-00000.faiss",
    ]) and removed.bytes == 10 + 4 + 4 + 5 + removed.files[f"embeddings/{'f' * 16}/d1/rows-0000000010-0000000020.json"]
    assert list_versions(store) == [version] and verify_version(store, version) == 2
    assert sorted(p.name for p in (tmp_path / "indexes").iterdir()) == sorted([version, "LATEST"])


def test_delete_leaves_the_files_a_build_in_progress_may_use(wiki: Path, tmp_path: Path, tiny: Encoder) -> None:
    store = Store(str(tmp_path))
    publish_passages(store, "d1", sample_passages().slice(0, 20))
    embed = EmbedConfig(encoder=tiny.config, shards=2)
    v1 = build_version(store, "d1", embed, IndexConfig(factory="Flat"), encoder=tiny)
    bare(store)  # LATEST moves on
    files = [p for e in read_index_manifest(store, v1).shards for p in e.embeddings.paths()]
    plan = plan_version(store, "d1", embed, encoder=tiny)  # a rebuild that will find these ranges done

    removed = delete_version(store, v1)
    assert removed.kept == sorted(files) and all(store.exists(p) for p in files)
    assert removed.notes == [("4 embedding files kept: a build in progress may use them (gc collects them once it "
                             "is abandoned)")]
    abandoned = collect_garbage(store, now=max(m for _, m in store.files().values()) + 2 * DAY)
    assert set(files) <= set(abandoned.files) and f"indexes/{plan.version}/plan.json" in abandoned.files


def test_gc_keeps_what_a_live_lease_protects_and_refuses_a_young_age_unless_asked(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    store.write_bytes(b"part", "passages", "_staging", "dump-x", "s4", "part-00000.parquet")  # an ingest at work
    store.write_bytes(b"part", "passages", "_staging", "dump-y", "s4", "part-00000.parquet")  # a killed one's
    later = max(m for _, m in store.files().values()) + 2 * DAY

    with pytest.raises(IndexVersionError, match=r"^gc --older-than 0\.5: below the minimum of 1 hour.*"
                                                r"add --ignore-min-age"):
        collect_garbage(store, CleanupConfig(older_than_hours=0.5), now=later)
    assert len(store.files()) == 2  # refused before anything was looked at

    with take_lease(store, "ingest", "dump-x", protects=["passages/_staging/dump-x/", "passages/dump-x/"],
                    note="ingest of x.xml"):
        removed = collect_garbage(store, CleanupConfig(older_than_hours=0, ignore_min_age=True), now=later)
        assert sorted(removed.files) == ["passages/_staging/dump-y/s4/part-00000.parquet"]
        assert removed.notes[0].startswith("kept passages/_staging/dump-x: held by the ingest lease dump-x held by ")
        assert "(ingest of x.xml)" in removed.notes[0]
    removed = collect_garbage(store, CleanupConfig(older_than_hours=0, ignore_min_age=True), now=later)
    assert sorted(removed.files) == ["passages/_staging/dump-x/s4/part-00000.parquet"]  # released: a leftover now
