"""The typed manifest: what publish writes, and one clear error naming the file for every way it can be bad."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from rag_core.index.faiss_index import IndexConfig, build_shard_index, serialize_index
from rag_core.index.manifest import SCHEMA_VERSION, IndexManifest, ManifestError
from rag_core.index.version_names import IndexVersionError
from rag_core.index.versions import latest_version, publish_version, read_index_manifest, read_manifest
from rag_core.storage import Store


def publish(store: Store, **fields) -> str:
    vectors = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    shard = (serialize_index(build_shard_index(vectors, IndexConfig(factory="Flat"))), [f"p{i}" for i in range(20)],
             {"factory": "Flat", "efSearch": 64, "recall_at_10": 1.0})
    return publish_version(store, [shard], {"dim": 8, "metric": "ip", "factory": "Flat", **fields})


def test_publish_writes_a_typed_manifest(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    version = publish(store, gates={"recall": 0.99})
    manifest = read_index_manifest(store, version)
    assert isinstance(manifest, IndexManifest) and manifest.schema_version == SCHEMA_VERSION == 2
    assert (manifest.version, manifest.count, manifest.dim, manifest.gates) == (version, 20, 8, {"recall": 0.99})
    assert manifest.shards[0].meta == {"factory": "Flat", "efSearch": 64, "recall_at_10": 1.0}  # free-form
    assert manifest.shards[0].embeddings is None and manifest.encoder is None
    stored = json.loads((tmp_path / "indexes" / version / "manifest.json").read_text())
    assert stored == read_manifest(store, version) == manifest.as_dict()
    assert manifest.files() == [f"indexes/{version}/{n}" for n in ("manifest.json", "shard-00000.faiss",
                                                                      "shard-00000.ids.parquet")]
    with pytest.raises(IndexVersionError, match=r"manifest_fields \['recall'\] are not manifest fields; .* shard's meta"):
        publish(store, recall=0.99)


@pytest.mark.parametrize("damage, message", [
    (lambda m: m[: len(m) // 2], r"not valid JSON \(.* at line \d+ column \d+; truncated\?\)"),
    (lambda m: b"\xff\xfe" + m, r"not UTF-8 text \(byte 0\)"),
    (lambda m: b"[1, 2]", "a manifest is a JSON object, this is a list"),
    (lambda m: m.replace(b'"schema_version": 2', b'"schema_version": 3'), ("manifest schema version 3, this wikirag "
     "reads 2; written by another wikirag")),
    (lambda m: m.replace(b'"schema_version": 2', b'"format": 1'), ("manifest schema version 1, this wikirag reads 2; "
     "it predates embedding references: rebuild the index")),
    (lambda m: m.replace(b'"ids_sha256"', b'"ids_sha"'), r"field 'shards\.0\.ids_sha256': Field required"),
    (lambda m: m.replace(b'"dim": 8', b'"dim": "eight"'), "field 'dim': Input should be a valid integer"),
    (lambda m: m.replace(b'"metric": "ip"', b'"metric": "cosine"'), "field 'metric': Input should be 'ip' or 'l2'"),
])
def test_a_bad_manifest_is_one_clear_error_naming_the_file(tmp_path: Path, damage, message: str) -> None:
    store = Store(str(tmp_path))
    version = publish(store)
    path = tmp_path / "indexes" / version / "manifest.json"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ManifestError, match=message) as err:
        read_index_manifest(store)
    assert str(err.value).startswith(f"{store.url_of('indexes', version, 'manifest.json')}: ")
    assert "\n" not in str(err.value)


def test_a_bad_latest_pointer_or_a_copied_manifest_is_a_clear_error(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    v1, v2 = publish(store), publish(store)
    (tmp_path / "indexes" / "LATEST").write_bytes(b'{"version": ')
    with pytest.raises(IndexVersionError, match="LATEST: not a LATEST pointer; point it at a version again"):
        latest_version(store)
    (tmp_path / "indexes" / v2 / "manifest.json").write_bytes((tmp_path / "indexes" / v1 / "manifest.json").read_bytes())
    with pytest.raises(ManifestError, match=f"names version {v1}, its folder {v2}"):
        read_index_manifest(store, v2)


@pytest.fixture(scope="module")
def built(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A version built from 20 real passages by a tiny real BERT: its manifest names embedding files."""
    from tests.helpers.encoderfiles import tiny_encoder
    from tests.helpers.passagefiles import publish_small_index, sample_passages

    root = tmp_path_factory.mktemp("built")
    version = publish_small_index(Store(str(root / "store")), "d1", sample_passages().slice(0, 20),
                                  tiny_encoder(root / "tiny"), shards=2)
    return root / "store", version


def _ref(manifest: dict, shard: int = 0) -> dict:
    return manifest["shards"][shard]["embeddings"]


def _other_write(path: str) -> str:
    stem, write_id, ext = path.split(".", 2)
    return f"{stem}.{'0' * 8 if write_id != '0' * 8 else '1' * 8}.{ext}"


# what is edited in a built version's manifest -> the field the error names, and what it says
PATH_EDITS = {
    "vectors outside the store": (lambda m: _ref(m).update(vectors="../../victim.npy"), "shards.0.embeddings.vectors",
                                  "'../../victim.npy' is not an embedding file of this store"),
    "ids at an absolute path": (lambda m: _ref(m).update(ids="/etc/victim.ids.parquet"), "shards.0.embeddings.ids",
                                "'/etc/victim.ids.parquet' is not an embedding file of this store"),
    "a '.' name": (lambda m: _ref(m).update(vectors=_ref(m)["vectors"].replace("/d1/", "/d1/./")),
                   "shards.0.embeddings.vectors", "is not an embedding file of this store"),
    "vectors named as ids": (lambda m: _ref(m).update(vectors=_ref(m)["ids"]), "shards.0.embeddings.vectors",
                             r"is not an embedding file of this store \(.*\.npy\)"),
    "other rows": (lambda m: _ref(m).update(start=1), "shards.0.embeddings.vectors",
                   "holds rows 0..10, this reference rows 1..10"),
    "ids of another write": (lambda m: _ref(m).update(ids=_other_write(_ref(m)["ids"])), "shards.0.embeddings.ids",
                             "is not the ids file of the range"),
    "another passage set's folder": (lambda m: [_ref(m, s).update({k: _ref(m, s)[k].replace("/d1/", "/d2/")
                                                                   for k in ("vectors", "ids")}) for s in (0, 1)],
                                     "(top level)", "shard 0's embeddings .* are not in embeddings/[0-9a-f]{16}/d1/"),
    "shard file outside the folder": (lambda m: m["shards"][0].update(url="../../victim.npy"), "shards.0.url",
                                      "'../../victim.npy' is not shard 0's file in the version's folder"),
    "another shard's file": (lambda m: m["shards"][0].update(ids_url="shard-00001.ids.parquet"), "shards.0.ids_url",
                             "'shard-00001.ids.parquet' is not shard 0's file"),
    "version with a '/'": (lambda m: m.update(version="../v"), "version", "String should match pattern"),
    "dump_id '..'": (lambda m: m.update(dump_id=".."), "dump_id", "String should match pattern"),
    "fingerprint_id with a '/'": (lambda m: m.update(fingerprint_id="../../../../x"), "fingerprint_id",
                                  "String should match pattern"),
}


def test_a_built_manifest_names_its_files_in_the_shapes_the_validator_takes(built: tuple[Path, str]) -> None:
    store, version = built
    manifest = read_index_manifest(Store(str(store)), version)
    assert sorted(p for e in manifest.shards for p in e.embeddings.paths()) == sorted(
        p.relative_to(store).as_posix() for p in (store / "embeddings").rglob("rows-*") if not p.name.endswith(".json"))
    assert [e.url for e in manifest.shards] == ["shard-00000.faiss", "shard-00001.faiss"]


@pytest.mark.parametrize("edit", list(PATH_EDITS))
def test_a_path_the_builder_does_not_write_is_refused_naming_the_file_and_field(built: tuple[Path, str],
                                                                                tmp_path: Path, edit: str) -> None:
    change, field, message = PATH_EDITS[edit]
    store = tmp_path / "store"
    shutil.copytree(built[0], store)
    path = store / "indexes" / built[1] / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    reason = message if message.startswith("String should") else f"Value error, ('[^']*' )?{message}"
    with pytest.raises(ManifestError, match=rf"^{re.escape(str(path))}: field '{re.escape(field)}': {reason}") as err:
        read_index_manifest(Store(str(store)), built[1])
    assert "\n" not in str(err.value) and str(err.value).endswith("the file is damaged or was not written by wikirag")
