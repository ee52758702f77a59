"""Guarantee: paths read from the store never leave the store.

An attacker who can write the store copies a real published version (real passages, a tiny real BERT, real FAISS
shards) into a new version folder, fixes up its ``version``, and points its manifest's file paths at files outside
the store (``../../victim.npy``, an absolute path) or at the published version's own files through a path that is
not the one the builder writes (``./``, an empty name): paths that ``delete`` used to remove and ``search`` used to
read. Every command that meets the manifest refuses it in one line naming the manifest and the field; ``delete``
and ``gc`` remove nothing outside the store, nor any file a published version reads.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from rag_core.progress import human_bytes
from cli.wikirag import main
from rag_core.index.faiss_index import sha256_hex
from rag_core.index.version_names import new_version_id
from tests.flows.conftest import PublishedIndex

pytestmark = pytest.mark.usefixtures("one_torch_thread", "home")
VICTIMS = {"victim.npy": b"\x93NUMPY victim outside the store", "victim.ids.parquet": b"PAR1 victim outside the store"}


class Attack(NamedTuple):
    root: Path  # the test's folder: the victims lie here, outside the store
    store: Path  # <root>/data/store
    version: str  # the published version (LATEST)
    forged: str  # the attacker's version folder
    manifest: Path  # the forged manifest


def _embeddings(manifest: dict[str, Any], edit: Callable[[str], str]) -> None:
    ref = manifest["shards"][0]["embeddings"]
    ref["vectors"], ref["ids"] = edit(ref["vectors"]), edit(ref["ids"])


# what the attacker writes into the forged manifest, and the field the refusal names
TAMPERING: dict[str, tuple[Callable[[dict[str, Any], Path], None], str]] = {
    "parent": (lambda m, root: _embeddings(m, lambda p: "../../" + ("victim.npy" if p.endswith(".npy")
                                                                    else "victim.ids.parquet")),
               "shards.0.embeddings.vectors"),
    "absolute": (lambda m, root: _embeddings(m, lambda p: str(root / ("victim.npy" if p.endswith(".npy")
                                                                      else "victim.ids.parquet"))),
                 "shards.0.embeddings.vectors"),
    "dot": (lambda m, root: _embeddings(m, lambda p: p.replace("embeddings/", "embeddings/./", 1)),
            "shards.0.embeddings.vectors"),
    "empty name": (lambda m, root: _embeddings(m, lambda p: p.replace("embeddings/", "embeddings//", 1)),
                   "shards.0.embeddings.vectors"),
    "shard file": (lambda m, root: m["shards"][1].update(url="../../../../victim.npy"), "shards.1.url"),
    "shard ids file": (lambda m, root: m["shards"][1].update(ids_url=str(root / "victim.ids.parquet")),
                       "shards.1.ids_url"),
}


@pytest.fixture
def attack(published_index: PublishedIndex, tmp_path: Path) -> Callable[[str], Attack]:
    def forge(case: str) -> Attack:
        store = tmp_path / "data" / "store"
        shutil.copytree(published_index.store, store)
        for name, data in VICTIMS.items():
            (tmp_path / name).write_bytes(data)
        version, forged = published_index.version, new_version_id()
        shutil.copytree(store / "indexes" / version, store / "indexes" / forged)
        manifest = store / "indexes" / forged / "manifest.json"
        record = json.loads(manifest.read_text())
        record["version"] = forged
        TAMPERING[case][0](record, tmp_path)
        manifest.write_text(json.dumps(record, indent=2))
        return Attack(tmp_path, store, version, forged, manifest)
    return forge


def wikirag(capsys: pytest.CaptureFixture, *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _untouched(attack: Attack, capsys: pytest.CaptureFixture) -> None:
    """The victims outside the store keep their bytes, and the published version still reads every file it names."""
    assert {name: (attack.root / name).read_bytes() for name in VICTIMS} == VICTIMS
    code, out, _ = wikirag(capsys, "indexes", "verify", attack.version, "--store", attack.store)
    assert (code, out) == (0, f"{attack.version}: 8 files match their sha256\n")


@pytest.mark.parametrize("case", list(TAMPERING))
def test_a_manifest_naming_paths_outside_what_the_builder_writes_is_refused(
        attack: Callable[[str], Attack], capsys: pytest.CaptureFixture, case: str) -> None:
    forged = attack(case)
    refusal = f"{forged.manifest}: field '{TAMPERING[case][1]}': Value error, "

    code, out, err = wikirag(capsys, "search", "Who was Achilles?", "--version", forged.forged, "--store", forged.store)
    assert (code, out, len(err.splitlines())) == (2, "", 1), err
    assert err.startswith(f"wikirag: error: {refusal}") and err.rstrip().endswith("was not written by wikirag")

    code, out, err = wikirag(capsys, "indexes", "gc", "--older-than", "0", "--ignore-min-age", "--store", forged.store)
    assert (code, out) == (0, "")  # no embedding file is collected while a manifest's references are unknown
    assert f"no embedding file collected: the manifests of {forged.forged} are unreadable" in err
    _untouched(forged, capsys)

    # the operator deletes the forged version: its own folder goes, nothing it names does
    folder = forged.store / "indexes" / forged.forged
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()]
    code, out, err = wikirag(capsys, "indexes", "delete", forged.forged, "--store", forged.store)
    assert (code, out) == (0, f"removed indexes/{forged.forged}: {len(sizes)} files, {human_bytes(sum(sizes))}\n")
    warning = [line for line in err.splitlines() if "its embedding files are left for gc" in line]
    assert len(warning) == 1 and refusal in warning[0], err
    assert not (forged.store / "indexes" / forged.forged).exists()
    _untouched(forged, capsys)


def test_a_forged_version_behind_a_re_anchored_latest_is_refused(attack: Callable[[str], Attack],
                                                                 capsys: pytest.CaptureFixture) -> None:
    """LATEST's manifest checksum does not help when the attacker rewrites LATEST too."""
    forged = attack("parent")
    latest = forged.store / "indexes" / "LATEST"
    anchor = sha256_hex(forged.manifest.read_bytes())
    latest.write_text(json.dumps({"version": forged.forged, "manifest_sha256": anchor}))
    refusal = f"{forged.manifest}: field 'shards.0.embeddings.vectors': Value error, '../../victim.npy' is not an "
    for command in (["search", "Who was Achilles?"], ["indexes", "show"], ["indexes", "verify"]):
        code, out, err = wikirag(capsys, *command, "--store", forged.store)
        assert (code, out, len(err.splitlines())) == (2, "", 1) and err.startswith(f"wikirag: error: {refusal}"), err

    code, _, err = wikirag(capsys, "indexes", "delete", forged.forged, "--store", forged.store)
    assert code == 2 and "held by LATEST" in err and forged.manifest.exists()
    code, out, err = wikirag(capsys, "indexes", "delete", forged.forged, "--force", "--store", forged.store)
    assert code == 0 and out.startswith(f"removed indexes/{forged.forged}: ") and refusal in err
    assert f"LATEST is {forged.version}" in err  # stepped back to the published version
    _untouched(forged, capsys)
