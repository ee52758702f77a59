"""``wikirag indexes``: list, show, verify, pin, unpin, delete and gc on a real store (no Prefect needed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.wikirag import main
from rag_core.index.build import build_version
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.index.versions import list_versions, read_manifest
from rag_core.storage import Store
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.passagefiles import publish_passages, sample_passages

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
    assert code == 0 and re.search(rf"^version +{v2}$", out, re.M) and re.search(r"^held by +LATEST", out, re.M)
    assert "HNSW32 (requested HNSW32), metric ip, dim 32" in out and re.search(r"^passage set +d1 \(", out, re.M)
    assert re.search(r"^gate recall@10 +1\.0$", out, re.M), out  # one line per gate

    code, out, _ = wikirag(capsys, "indexes", "verify", v1, "--store", store)
    assert (code, out) == (0, f"{v1}: 8 files match their sha256\n")


def test_pin_refuses_delete_and_delete_frees_only_unshared_files(versions: tuple[str, str, str],
                                                                  capsys: pytest.CaptureFixture) -> None:
    store, v1, v2 = versions
    assert wikirag(capsys, "indexes", "pin", v1, "--by", "rag-seq@champion", "--store", store)[0] == 0
    code, out, _ = wikirag(capsys, "indexes", "--store", store)
    assert out.splitlines()[0].endswith("\tpinned by rag-seq@champion")

    # The real command: exit status 2 and one line naming the holder, no traceback.
    proc = subprocess.run([sys.executable, "-m", "cli.wikirag", "indexes", "delete", v1, "--store", store],
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
    code, out, err = wikirag(capsys, "indexes", "gc", "--older-than", "0", "--ignore-min-age", "--store", store)
    assert code == 0 and out == "" and "idle for more than 0 hours" in err  # everything left is published

    Path(store, "indexes", v1, "manifest.json").write_bytes(b'{"schema_version": 2, "version": "')
    code, out, err = wikirag(capsys, "indexes", "show", v1, "--store", store)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"wikirag: error: {store}/indexes/{v1}/manifest.json: not valid JSON")
    code, out, _ = wikirag(capsys, "indexes", "--store", store)
    assert code == 0 and f"  {v1}\tunreadable: {store}/indexes/{v1}/manifest.json: not valid JSON" in out


HOLD_LEASE = """
import sys, time
from rag_core.leases import take_lease
from rag_core.storage import Store
with take_lease(Store(sys.argv[1]), "index", "d1", ttl_s=float(sys.argv[2]), protects=sys.argv[3:],
                note="index build of d1 (resumed)") as lease:
    print("held", flush=True)
    for line in sys.stdin:  # a folder to protect as well, once the build has planned it
        print(lease.protect(line.strip()), flush=True)
    time.sleep(600)
"""


def _tree(root: Path) -> dict[str, int]:
    """Every file of a local store but the leases (a heartbeat rewrites them): path -> last modified."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if p.is_file() and p.relative_to(root).parts[0] != "leases"}


def test_gc_during_a_resumed_build_keeps_what_its_lease_holds_and_refuses_a_young_age(
        wiki: Path, tmp_path: Path, home: Path, capsys: pytest.CaptureFixture) -> None:
    from rag_core.index.build import embed_plan_shard
    from rag_core.index.plan import plan_version

    root = tmp_path / "store"
    store = Store(str(root))
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(tmp_path / "tiny")), dtype="float32"))
    publish_passages(store, "d1", sample_passages().slice(0, 30))
    embed = EmbedConfig(encoder=encoder.config, shards=2)
    killed = plan_version(store, "d1", embed, encoder=encoder)  # a build killed after embedding both shards
    for shard in range(2):
        embed_plan_shard(store, killed, shard, encoder=encoder)
    for path in root.rglob("*"):
        os.utime(path, (1e9, 1e9))  # all of it written long ago
    ranges = sorted(str(p.relative_to(root)) for p in (root / "embeddings").rglob("rows-*"))
    assert len(ranges) == 6  # per shard: vectors, ids, record

    # The build resumed: it holds its lease (a real process, heartbeat live), then plans a new version.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LEASE, str(root), "2", "embeddings/*/d1/"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline() == "held\n"

        # A young age without the override: one line, exit 2, nothing on the store touched.
        before = _tree(root)
        proc = subprocess.run([sys.executable, "-m", "cli.wikirag", "indexes", "gc", "--older-than", "0", "--store",
                               str(root)], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
        assert proc.stderr.startswith("wikirag: error: gc --older-than 0: below the minimum of 1 hour")
        assert "--ignore-min-age" in proc.stderr and _tree(root) == before

        # Before the resumed build has planned: its lease alone keeps the old ranges it is about to reuse.
        plan_bytes = (root / "indexes" / killed.version / "plan.json").stat().st_size
        code, out, err = wikirag(capsys, "indexes", "gc", "--older-than", "0", "--ignore-min-age", "--store", str(root))
        assert (code, out) == (0, f"removed indexes/{killed.version}: 1 files, {plan_bytes} B\n")  # unleased: gone
        assert "kept 4 embedding files: held by the index lease d1 held by " in err
        assert f"pid {holder.pid} (index build of d1 (resumed))" in err
        assert all((root / p).exists() for p in ranges)

        # Planned: its version folder is kept too, and delete refuses it naming the build.
        resumed = plan_version(store, "d1", embed, encoder=encoder)
        holder.stdin.write(f"indexes/{resumed.version}/\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "True\n"
        code, out, err = wikirag(capsys, "indexes", "gc", "--older-than", "0", "--ignore-min-age", "--store", str(root))
        assert code == 0 and out == "" and f"kept indexes/{resumed.version}: held by the index lease d1" in err
        assert all((root / p).exists() for p in ranges) and (root / "indexes" / resumed.version / "plan.json").exists()
        code, _, err = wikirag(capsys, "indexes", "delete", resumed.version, "--store", str(root))
        assert code == 2 and f"refusing to delete {resumed.version}: a build is writing it (index lease d1" in err
    finally:
        holder.kill()  # the build dies without releasing its lease
        holder.wait()

    time.sleep(2.5)  # past the lease's ttl: the build is gone, what it held is a leftover like any other
    code, out, err = wikirag(capsys, "indexes", "gc", "--older-than", "0", "--ignore-min-age", "--store", str(root))
    assert code == 0 and "held by" not in err
    assert not any((root / p).exists() for p in ranges) and not (root / "indexes" / resumed.version).exists()
    assert sorted(out.splitlines())[-1].startswith(f"removed indexes/{resumed.version}: ")
