"""Guarantee: a saved model or checkpoint whose manifest names a file outside its folder is refused in one line
naming that manifest, before anything is read or written.

The attacker can write the store. They add an entry to a real saved model's (or checkpoint's) ``manifest.json``
and put a file with the entry's bytes and sha256 where the entry points, so that every check passes except the
check of the path itself. A download must not write ``local_dir/../x``, nor an absolute path it was given.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rag_core.index.encoders import EncoderConfig
from rag_core.model.generators import GeneratorConfig
from rag_core.model.rag_model import RagConfig, RagModel
from rag_core.model.retriever import IndexRetriever
from rag_core.storage import Store
from rag_core.train.checkpoints import (
    MANIFEST,
    CheckpointError,
    State,
    download_model,
    read_checkpoint,
    rng_state,
    save_model,
    step_folder,
    write_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PAYLOAD = b"written by whoever can write the store\n"


@pytest.fixture(scope="module")
def saved(tiny: SimpleNamespace) -> Path:
    """A real RagModel (tiny BERT question encoder, tiny BART) saved to a store, and a real checkpoint of it."""
    config = RagConfig(n_docs=2, max_context_length=64, generator=GeneratorConfig(path=tiny.bart),
                       question_encoder=EncoderConfig(path=str(tiny.root / "bert"), dtype="float32"))
    model = RagModel.create(config, IndexRetriever.load(tiny.store, tiny.version))
    run = tiny.store.child("runs", "paths")
    save_model(model, run.child("model"))
    state = State(step=1, examples_seen=4, world_size=1, config={}, scheduler={}, param_groups=[],
                  param_names=[name for name, _ in model.named_parameters()], python_rng=[], numpy_rng=[], losses=[])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    write_checkpoint(run.child("checkpoints"), state, model, optimizer, [rng_state(torch.device("cpu"))[0]], keep=1)
    return tiny.root / "store" / "runs" / "paths"


def _copy(saved: Path, tmp_path: Path) -> Store:
    """The run's folder copied into a store of this test's own (so that tampering stays in the test)."""
    shutil.copytree(saved, tmp_path / "store" / "runs" / "paths")
    return Store(str(tmp_path / "store")).child("runs", "paths")


def _smuggle(folder: Path, name: str, planted: Path) -> None:
    """Name ``name`` in the folder's manifest, with ``PAYLOAD`` planted on the store at ``planted``: bytes and sha256
    match, so only the path check stands between the entry and a write outside the download folder."""
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(PAYLOAD)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][name] = {"bytes": len(PAYLOAD), "sha256": hashlib.sha256(PAYLOAD).hexdigest()}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_an_untampered_model_downloads(saved: Path, tmp_path: Path) -> None:
    run = _copy(saved, tmp_path)
    local = download_model(run.child("model"), tmp_path / "download" / "model")
    names = json.loads(run.child("model").read_bytes(MANIFEST))["files"]
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()) == sorted(names)
    assert read_checkpoint(run.child("checkpoints"), 1).state.step == 1


# name in the manifest -> where the old join_url read it from, relative to the model folder on the store
CASES = {
    "parent": ("../x", "../x"),
    "deeper parent": ("generator/../../x", "../x"),
    "absolute": ("{outside}/x", "{outside_rel}/x"),  # join_url used to strip the leading '/', Path() did not
    "dot": ("./generator/x", "generator/x"),
    "empty name": ("generator//x", "generator/x"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_model_naming_a_file_outside_its_folder_is_refused_and_nothing_is_written(saved: Path, tmp_path: Path,
                                                                                   case: str) -> None:
    run = _copy(saved, tmp_path)
    outside = tmp_path / "outside"
    name, planted = (s.format(outside=outside, outside_rel=str(outside).lstrip("/")) for s in CASES[case])
    folder = tmp_path / "store" / "runs" / "paths" / "model"
    _smuggle(folder, name, folder / planted)
    local = tmp_path / "download" / "model"
    with pytest.raises(CheckpointError) as err:
        download_model(run.child("model"), local)
    message = str(err.value)
    assert message.startswith(f"{run.child('model').url_of(MANIFEST)}: names file {name!r}, which is not a path "
                              "inside the folder") and "\n" not in message
    assert not (tmp_path / "download").exists()  # refused before the first file was written
    assert not outside.exists() and not (tmp_path / "x").exists() and not (tmp_path / "download" / "x").exists()


def test_a_link_in_the_download_folder_does_not_lead_out_of_it(saved: Path, tmp_path: Path) -> None:
    """A download folder reused after something put a link in it: the files would land where the link points."""
    run = _copy(saved, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    local = tmp_path / "download" / "model"
    local.mkdir(parents=True)
    (local / "generator").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CheckpointError, match=r"'generator/.*' resolves outside .*; download into an empty folder"):
        download_model(run.child("model"), local)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("name", ["../x", "/x"])
def test_a_checkpoint_naming_a_file_outside_its_folder_is_not_read(saved: Path, tmp_path: Path, name: str) -> None:
    run = _copy(saved, tmp_path)
    folder = tmp_path / "store" / "runs" / "paths" / "checkpoints" / step_folder(1)
    _smuggle(folder, name, folder / ".." / "x" if name == "../x" else folder / "x")
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(run.child("checkpoints"), 1)
    assert str(err.value).startswith(f"{run.child('checkpoints', step_folder(1)).url_of(MANIFEST)}: names file "
                                     f"{name!r}, which is not a path inside the folder")
