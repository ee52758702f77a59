"""Guarantee: a damaged or tampered store file is one ``wikirag: error: <file>: ...; <fix>`` line, exit 2.

Each case damages a real published version (real passages, a tiny real BERT
encoder, real FAISS shards) on disk the way a torn write or a flipped bit
would, then runs the commands that read it. Nothing read from the store is
unpickled or executed: the last test holds the code to that.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cli.wikirag import main
from rag_core.index.build import build_version
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.storage import DamagedFileError, Store
from tests.flows.conftest import PublishedIndex

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REPO = Path(__file__).resolve().parents[2]


def _flip(offset_of: Callable[[bytes], int], mask: int) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        i = offset_of(data)
        return data[:i] + bytes([data[i] ^ mask]) + data[i + 1:]
    return damage


DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    # '"' ^ 0x01 is '#': still UTF-8, no longer JSON
    "flipped byte breaks JSON": _flip(lambda data: data.index(b'"'), 0x01),
    # 'v' ^ 0x80 is 0xf6, a lead byte without its continuation bytes
    "flipped byte breaks UTF-8": _flip(lambda data: data.index(b'"v') + 1, 0x80),
    "emptied": lambda data: b"",
}
FILES = {"manifest": "indexes/{version}/manifest.json", "LATEST": "indexes/LATEST"}


def _damaged_copy(published_index: PublishedIndex, tmp_path: Path, file: str, damage: str) -> tuple[Path, Path]:
    src, version, _, _ = published_index
    store = tmp_path / "store"
    shutil.copytree(src, store)
    target = store / FILES[file].format(version=version)
    target.write_bytes(DAMAGE[damage](target.read_bytes()))
    return store, target


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("file", list(FILES))
def test_a_damaged_manifest_or_latest_is_one_line_naming_it(published_index: PublishedIndex, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture, file: str,
                                                            damage: str) -> None:
    store, target = _damaged_copy(published_index, tmp_path, file, damage)
    llama = published_index.generator
    commands = [["search", "Who was Achilles?", "-k", "2"], ["indexes", "show"], ["indexes", "verify"],
                ["ask", "Who was Achilles?", "--generator", str(llama), "--n-docs", "2"]]
    if file == "manifest":  # by name too, not only through LATEST
        commands += [["indexes", "show", published_index.version], ["indexes", "verify", published_index.version]]
    for command in commands:
        code = main([*command, "--store", str(store)])
        out, err = capsys.readouterr()
        assert (code, out) == (2, ""), command
        assert len(err.splitlines()) == 1, (command, err)
        assert err.startswith(f"wikirag: error: {target}: "), (command, err)
        assert re.search(r"; .*(restore|point it|delete)", err), (command, err)
    assert target.exists()  # reading never "repairs" the evidence


def test_a_manifest_edited_into_other_valid_json_is_caught_through_latest(published_index: PublishedIndex,
                                                                          tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """LATEST records the manifest's sha256: an edit that keeps the JSON valid (a shard's sha256 replaced, so that
    a swapped shard file would pass) is refused before any file it names is trusted."""
    src, version, _, _ = published_index
    store = tmp_path / "store"
    shutil.copytree(src, store)
    manifest = store / "indexes" / version / "manifest.json"
    text = manifest.read_text()
    first_sha = re.search(r'"sha256": "([0-9a-f]{64})"', text).group(1)
    manifest.write_text(text.replace(first_sha, "0" * 64, 1))
    for command in (["search", "Who was Achilles?"], ["indexes", "show"], ["indexes", "verify"]):
        assert main([*command, "--store", str(store)]) == 2
        err = capsys.readouterr().err
        assert err == (f"wikirag: error: {manifest}: sha256 differs from the one {store}/indexes/LATEST recorded: "
                       "the manifest was changed after publishing; restore it from a backup, or delete the version "
                       "and rebuild\n")


def test_the_real_command_prints_no_traceback(published_index: PublishedIndex, tmp_path: Path,
                                              home: Path) -> None:
    store, target = _damaged_copy(published_index, tmp_path, "manifest", "flipped byte breaks UTF-8")
    proc = subprocess.run([sys.executable, "-m", "cli.wikirag", "search", "Who was Achilles?", "--store", str(store)],
                          capture_output=True, text=True, timeout=300, check=False, cwd=REPO)
    assert (proc.returncode, proc.stdout, len(proc.stderr.splitlines())) == (2, "", 1), proc.stderr
    assert proc.stderr.startswith(f"wikirag: error: {target}: not UTF-8 text")


@pytest.mark.parametrize("damage", ["truncated", "flipped byte breaks UTF-8"])
def test_a_damaged_embedding_record_stops_a_rebuild_with_one_line(published_index: PublishedIndex,
                                                                  tmp_path: Path, damage: str) -> None:
    src, _, tiny, _ = published_index
    store = tmp_path / "store"
    shutil.copytree(src, store)
    record = min(store.glob("embeddings/*/d1/rows-*.json"))
    record.write_bytes(DAMAGE[damage](record.read_bytes()))
    encoder = Encoder.load(EncoderConfig(path=str(tiny), dtype="float32"))
    with pytest.raises(DamagedFileError) as caught:  # the rebuild resumes from the records: it must not trust this one
        build_version(Store(str(store)), "d1", EmbedConfig(encoder=encoder.config, shards=2),
                      IndexConfig(factory="HNSW32"), encoder=encoder)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{record}: not ")
    assert text.endswith("delete it and rerun the command that wrote it (finished work elsewhere is reused), "
                         "or restore it from a backup")


# What would run code or unpickle objects from a file: none of it may read what the store holds.
UNSAFE = re.compile(r"pickle\.loads?\(|torch\.load\(|trust_remote_code\s*=\s*True|allow_pickle\s*=\s*True|"
                    r"(?<![.\w])(eval|exec)\(|joblib\.load|cloudpickle|marshal\.loads?")
# What would follow a registered model's MLmodel to code: MLflow's generic loader (it imports whatever loader_module,
# code folder or models-from-code file the MLmodel names) and models from code. Only wikirag's flavor module, the
# entry point MLflow calls, may speak of them.
MODEL_CODE = re.compile(r"pyfunc\.load_model|pyfunc import .*load_model|code_model|python_model\s*=|"
                        r"models\.set_model|PythonModel")
FLAVOR = REPO / "tasks" / "adapters" / "mlflow_flavor.py"


def test_nothing_read_from_the_store_is_unpickled_or_executed() -> None:
    found = []
    for package in ("rag_core", "tasks", "flows"):
        for path in sorted((REPO / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if UNSAFE.search(code) and "weights_only=True" not in code:
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
                if MODEL_CODE.search(code) and path != FLAVOR:
                    found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []
    # and the flavor itself loads no model through MLflow: it reads MLmodel as YAML data
    flavor_code = [line.split("#", 1)[0] for line in FLAVOR.read_text().splitlines()]
    assert not [c for c in flavor_code if re.search(r"pyfunc\.load_model\(|code_model|python_model\s*=", c)]
    assert any("yaml.safe_load(" in c for c in flavor_code)
