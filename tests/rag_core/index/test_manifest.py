"""The typed manifest: what publish writes, and one clear error naming the file for every way it can be bad."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rag_core.index.faiss_index import IndexConfig, build_shard_index, serialize_index
from rag_core.index.manifest import SCHEMA_VERSION, IndexManifest, ManifestError
from rag_core.index.versions import (
    IndexVersionError,
    latest_version,
    publish_version,
    read_index_manifest,
    read_manifest,
)
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
