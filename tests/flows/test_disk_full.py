"""Guarantee: a store on a full disk is one line naming the file, exit 2; the previous version stays searchable.

A local store lives on a real 2 MiB tmpfs (mounting needs root: skipped with
the reason otherwise), filled up to its last pages with a file of our own, so
every write runs into ENOSPC for real. An S3 store is a SeaweedFS server of
the test's own with room for one 1 MiB volume, filled with objects until it
refuses them: a full S3 server answers HTTP 500, never ENOSPC.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import pytest
import s3fs

from cli.wikirag import main
from rag_core.errors import StoreError
from rag_core.index.build import build_version
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.index.search import ShardedIndex
from rag_core.index.versions import latest_version
from rag_core.storage import Store
from runtime.process_groups import die_with_parent
from tests.conftest import SeaweedFS
from tests.flows.conftest import PublishedIndex
from tests.helpers.disks import fill
from tests.helpers.disks import small_disk as mounted_small_disk
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.passagefiles import publish_small_index, sample_passages
from tests.helpers.processes import REPO
from tests.helpers.wikirag_runs import sample_dump

# One volume of 1 MiB: SeaweedFS's own capacity limit ("No writable volumes and no free volumes left" in its log).
ONE_SMALL_VOLUME = ("-volume.max=1", "-master.volumeSizeLimitMB=1")
NO_SPACE = "No space left on device; free space on the store's disk (or point --store/WIKIRAG_STORE at a larger one)"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A mounted 2 MiB tmpfs, unmounted afterwards."""
    with mounted_small_disk(tmp_path / "small-disk", "2m") as disk:
        yield disk


def _state(store: Path) -> tuple[list[str], str, str]:
    files = sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())
    return files, (store / "indexes" / "LATEST").read_text(), json.dumps(sorted(p.name for p in store.glob("**/*.tmp")))


def _search(store: Path, capsys: pytest.CaptureFixture) -> list[dict]:
    assert main(["search", "Who was Achilles?", "-k", "5", "--json", "--store", str(store)]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.usefixtures("one_torch_thread")
def test_a_full_disk_is_one_line_and_the_previous_version_stays(published_index: PublishedIndex, small_disk: Path,
                                                                home: Path, capsys: pytest.CaptureFixture) -> None:
    store = small_disk / "store"
    shutil.copytree(published_index.store, store)
    before_results = _search(store, capsys)
    fill(small_disk, leave=8 * 1024)
    before = _state(store)

    # A rebuild (new FAISS shards) runs out of space: one line naming the file it was writing, and the fix.
    encoder = Encoder.load(EncoderConfig(path=str(published_index.encoder), dtype="float32"))
    with pytest.raises(StoreError) as caught:
        build_version(Store(str(store)), "d1", EmbedConfig(encoder=encoder.config, shards=3),
                      IndexConfig(factory="HNSW32"), encoder=encoder)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{store}/") and NO_SPACE in text, text
    # Its unpublished version folder is removed, no partial .tmp sibling is left, LATEST is unchanged; only whole
    # embedding files may stay (unreferenced until their range's record exists: gc collects them).
    files, latest, partial = _state(store)
    assert (latest, partial) == before[1:]
    assert [f for f in files if not f.startswith("embeddings/")] == [f for f in before[0] if not f.startswith("embeddings/")]
    assert main(["indexes", "gc", "--older-than", "0", "--ignore-min-age", "--store", str(store)]) == 0
    capsys.readouterr()
    assert _state(store) == before

    # Through the CLI, a write that does not fit (a pin, to a disk with no page left): one line, exit 2.
    fill(small_disk, leave=0)
    before = _state(store)
    code = main(["indexes", "pin", published_index.version, "--by", "rag-seq@champion", "--store", str(store)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"wikirag: error: {store}/indexes/"), err
    assert NO_SPACE in err, err

    # Nothing half-published, no partial file left: the store is as it was, and answers as it did.
    assert _state(store) == before
    assert _search(store, capsys) == before_results
    assert main(["indexes", "verify", "--store", str(store)]) == 0
    capsys.readouterr()

    # Space again: the same rebuild publishes.
    for filler in small_disk.glob("filler-*"):
        filler.unlink()
    version = build_version(Store(str(store)), "d1", EmbedConfig(encoder=encoder.config, shards=3),
                            IndexConfig(factory="HNSW32"), encoder=encoder)
    assert json.loads((store / "indexes" / "LATEST").read_text())["version"] == version != published_index.version


@pytest.mark.slow
def test_a_full_s3_server_is_one_line_pointing_at_its_disk_and_once_it_has_room_the_rerun_publishes(
        tmp_path: Path, home: Path, prefect_server: str) -> None:
    (tmp_path / "seaweedfs").mkdir()
    seaweed = SeaweedFS(tmp_path / "seaweedfs", extra=ONE_SMALL_VOLUME)
    server = seaweed.start()
    try:
        prefix = f"{server.bucket}/full"
        direct = Store(f"s3://{prefix}", server.options())
        tiny = save_tiny_bert(tmp_path / "tiny")
        encoder = Encoder.load(EncoderConfig(path=str(tiny), dtype="float32"))
        old = publish_small_index(direct, "d1", sample_passages().slice(0, 40), encoder, 1)
        fs = s3fs.S3FileSystem(**server.options(), skip_instance_cache=True,
                               config_kwargs={"retries": {"mode": "standard", "total_max_attempts": 1}})
        for n in count():  # objects until the server refuses one
            try:
                fs.pipe(f"{prefix}/filler/{n:04d}", os.urandom(64 * 1024))
            except OSError:
                break
            assert n < 64, "the server took 4 MiB more than its one 1 MiB volume holds"

        dump, index = sample_dump(tmp_path, 3)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WIKIRAG_"))}
        env |= {**server.env(), "WIKIRAG_HOME": str(home), "WIKIRAG_STORE": f"s3://{prefix}",
                "WIKIRAG_STORE_RETRIES": "1", "PREFECT_API_URL": prefect_server, "WIKIRAG_WORKERS": "2",
                "PYTHONPATH": str(REPO)}
        args = [sys.executable, "-m", "cli.wikirag", "index-rebuild", str(dump), "--index", str(index), "--shards", "2",
                "--encoder", str(tiny), "--encoder-dtype", "float32"]
        failed = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
                                preexec_fn=die_with_parent, check=False)
        last = failed.stderr.strip().splitlines()[-1]
        print(f"a full S3 server: exit {failed.returncode}: {last}")
        assert failed.returncode == 2 and failed.stdout == "", failed.stderr[-3000:]
        assert "Traceback" not in failed.stderr, failed.stderr[-3000:]
        assert last.startswith(f"wikirag: error: s3://{prefix}") and "the store answered HTTP 500" in last, last
        assert "the server is up but failing: check its free disk space and its log, then rerun" in last, last
        assert "AWS_ENDPOINT_URL" not in last  # the address is right: pointing at it would send the user astray
        # Readers still get the old version, whole, and it answers.
        assert latest_version(direct) == old
        hits = ShardedIndex.load(direct).search(encoder.encode_questions(["Who was Achilles?"]), 3)[0]
        assert len(hits) == 3 and all(h.passage_id for h in hits)

        # Room again (the same data, the server restarted without its limit): the same command publishes.
        seaweed.stop()
        seaweed.cmd = [arg for arg in seaweed.cmd if arg not in ONE_SMALL_VOLUME]
        seaweed.extra = ()
        seaweed.start()
        rerun = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
                               preexec_fn=die_with_parent, check=False)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert latest_version(direct) == rerun.stdout.strip() != old
    finally:
        seaweed.stop()
