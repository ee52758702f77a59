"""Guarantee: a store on a full disk is one line naming the file, exit 2; the previous version stays searchable.

The store lives on a real 2 MiB tmpfs (mounting needs root: skipped with the
reason otherwise), filled up to its last pages with a file of our own, so
every write runs into ENOSPC for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.wikirag import main
from rag_core.errors import StoreError
from rag_core.index.build import build_version
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.storage import Store
from tests.flows.conftest import PublishedIndex

NO_SPACE = "No space left on device; free space on the store's disk (or point --store/WIKIRAG_STORE at a larger one)"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A mounted 2 MiB tmpfs, unmounted afterwards."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a small filesystem needs `mount -t tmpfs` as root; this run is not root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({proc.stderr.strip()})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until about ``leave`` bytes are free (``filler-<n>`` files, removed to make space again)."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    (disk / f"filler-{len(list(disk.glob('filler-*')))}").write_bytes(b"\0" * max(0, free - leave))


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
    _fill(small_disk, leave=8 * 1024)
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
    _fill(small_disk, leave=0)
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
