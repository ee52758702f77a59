"""``wikirag indexes``: list, show, verify, pin, unpin, delete and gc on a real store (no Prefect needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import main
from rag_core.index.build import build_version
from rag_core.index.embeddings import EmbedConfig
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.index.versions import list_versions, read_manifest
from rag_core.storage import Store
from tests.encoderfiles import save_tiny_bert
from tests.passagefiles import publish_passages, sample_passages

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def versions(wiki: Path, tmp_path: Path, home: Path) -> tuple[str, str, str]:
    """(store path, v1, v2): two versions of 30 real passages sharing their embedding files; v2 is LATEST."""
    store = Store(str(tmp_path / "store"))
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(tmp_path / "tiny")), dtype="float32"))
    publish_passages(store, "d1", sample_passages().slice(0, 30))
    embed = EmbedConfig(encoder=encoder.config, shards=2)
    v1 = build_version(store, "d1", embed, IndexConfig(factory="Flat"), encoder=encoder)
    v2 = build_version(store, "d1", embed, IndexConfig(factory="HNSW32"), encoder=encoder)
    return store.url, v1, v2


def wikirag(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_show_verify(versions: tuple[str, str, str], capsys: pytest.CaptureFixture) -> None:
    store, v1, v2 = versions
    code, out, _ = wikirag(capsys, "indexes", "--store", store)
    assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == [f"  {v1}", f"* {v2}"]
    assert "30 passages\t2 shards\tFlat\ttiny" in out.splitlines()[0]

    code, out, _ = wikirag(capsys, "indexes", "show", v1, "--json", "--store", store)
    assert code == 0 and json.loads(out) == read_manifest(Store(store), v1)
    code, out, _ = wikirag(capsys, "indexes", "show", "--store", store)  # LATEST
    assert code == 0 and f"version       {v2}" in out and "held by       LATEST" in out
    assert "HNSW32 (requested HNSW32), metric ip, dim 32" in out and "passage set   d1 (" in out

    code, out, _ = wikirag(capsys, "indexes", "verify", v1, "--store", store)
    assert (code, out) == (0, f"{v1}: 8 files match their sha256\n")


def test_pin_refuses_delete_and_delete_frees_only_unshared_files(versions: tuple[str, str, str],
                                                                  capsys: pytest.CaptureFixture) -> None:
    store, v1, v2 = versions
    assert wikirag(capsys, "indexes", "pin", v1, "--by", "rag-seq@champion", "--store", store)[0] == 0
    code, out, _ = wikirag(capsys, "indexes", "--store", store)
    assert out.splitlines()[0].endswith("\tpinned by rag-seq@champion")

    # The real command: exit status 2 and one line naming the holder, no traceback.
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "indexes", "delete", v1, "--store", store],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith(f"wikirag: error: {store}/indexes: refusing to delete {v1}: held by pin "
                                  "'rag-seq@champion'; unpin it first")
    code, _, err = wikirag(capsys, "indexes", "delete", v2, "--store", store)
    assert code == 2 and "held by LATEST; LATEST points at it: publish another version first or force" in err

    assert wikirag(capsys, "indexes", "unpin", v1, "--by", "rag-seq@champion", "--store", store)[0] == 0
    shared = [p for e in read_manifest(Store(store), v1)["shards"] for p in (e["embeddings"]["vectors"],)]
    code, out, err = wikirag(capsys, "indexes", "delete", v1, "--store", store)
    assert code == 0 and len(out.splitlines()) == 1 and out.startswith(f"removed indexes/{v1}: 6 files, ")
    assert "4 shared embedding files kept (other versions read them); LATEST is " + v2 in err
    assert all(Store(store).exists(p) for p in shared) and list_versions(Store(store)) == [v2]

    code, out, err = wikirag(capsys, "indexes", "delete", v2, "--force", "--store", store)
    assert code == 0 and "removed embeddings/" in out and "LATEST is unset" in err  # the last user: files go
    assert list(Path(store, "embeddings").rglob("*.npy")) == []


def test_gc_and_bad_manifests(versions: tuple[str, str, str], capsys: pytest.CaptureFixture) -> None:
    store, v1, _ = versions
    leftover = Path(store, "indexes", "20200101T000000.000Z-0000dead")
    leftover.mkdir()
    (leftover / "shard-00000.faiss").write_bytes(b"x" * 2048)
    os.utime(leftover / "shard-00000.faiss", (1e9, 1e9))  # written long ago by a run that died
    code, out, err = wikirag(capsys, "indexes", "gc", "--store", store)
    assert code == 0 and out == f"removed indexes/{leftover.name}: 1 files, 2.0 KB\n" and "gc: 1 files, 2.0 KB" in err
    code, out, err = wikirag(capsys, "indexes", "gc", "--older-than", "0", "--store", store)
    assert code == 0 and out == "" and "idle for more than 0 hours" in err  # everything left is published

    Path(store, "indexes", v1, "manifest.json").write_bytes(b'{"schema_version": 2, "version": "')
    code, out, err = wikirag(capsys, "indexes", "show", v1, "--store", store)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"wikirag: error: {store}/indexes/{v1}/manifest.json: not valid JSON")
    code, out, _ = wikirag(capsys, "indexes", "--store", store)
    assert code == 0 and f"  {v1}\tunreadable: {store}/indexes/{v1}/manifest.json: not valid JSON" in out
