"""Training checkpoints and saved models on a Store: written whole or not at all, never pickled.

A checkpoint is a folder ``<output>/checkpoints/step-00000050/``:

- ``model.safetensors``: every parameter of the RAG model by name (tied weights once);
- ``optimizer.safetensors``: the optimizer's per-parameter tensors (``<i>.<key>``, i = position in
  :data:`State.param_names`);
- ``rng.safetensors``: each rank's torch CPU (and CUDA) generator state (``torch_cpu.<rank>``);
- ``state.json``: step, examples seen, world size, the config, the scheduler's state, the
  optimizer's hyper-parameters, each rank's Python and NumPy generator states, the loss history;
- ``manifest.json``, written **last**: every file above with its bytes and sha256.

A folder without ``manifest.json`` is a checkpoint killed while being written: it is never
read (:func:`latest_checkpoint` skips it). On load every file's sha256 is checked against the
manifest. Tensors go through safetensors and everything else through JSON, so loading a
checkpoint runs no code (no pickle, no ``torch.load``). Old checkpoints are removed manifest
first, so a half-removed one is as invisible as a half-written one.

The final model (:func:`save_model`) is ``RagModel.save_pretrained``'s layout copied to
``<output>/model/`` with its own ``manifest.json`` written last; :func:`load_model` reads it back
from any store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from torch import nn

from rag_core.errors import WikiragError
from rag_core.storage import Store, StorePathError, relative_path

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 1
_STEP = re.compile(r"^step-(\d{8})$")


class CheckpointError(WikiragError):
    """A checkpoint or saved model that cannot be used as asked (the message names it and the fix)."""


@dataclass
class State:
    """Everything of a checkpoint that is not a tensor (``state.json``)."""

    step: int  # optimizer steps done
    examples_seen: int  # training examples consumed in all (the data position: step * batch_size)
    world_size: int
    config: dict[str, Any]  # the TrainConfig the run was started with
    scheduler: dict[str, Any]  # LambdaLR.state_dict()
    param_groups: list[dict[str, Any]]  # the optimizer's hyper-parameters per group
    param_names: list[str]  # the optimizer's parameters, in its order
    python_rng: list[Any]  # per rank: random.getstate()
    numpy_rng: list[Any]  # per rank: numpy's legacy global state as JSON
    losses: list[float]  # mean training loss of every step so far
    dev_losses: list[list[float]] = field(default_factory=list)  # [step, dev loss] of every evaluation so far
    index_version: str | None = None  # the version trained against (a resumed run keeps it)
    format: int = FORMAT


# safetensors' names of the dtypes a checkpoint holds (weights, Adam moments and steps, generator states)
_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}


def step_folder(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parameters_by_name(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, tied ones once, as contiguous CPU tensors (what safetensors takes)."""
    return {name: p.detach().cpu().contiguous() for name, p in model.named_parameters()}


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """The optimizer state as ``{"<i>.<key>": tensor}`` plus its param groups (JSON-safe)."""
    state = optimizer.state_dict()
    tensors = {f"{i}.{key}": value.detach().cpu().contiguous()
               for i, entries in state["state"].items() for key, value in entries.items()
               if isinstance(value, torch.Tensor)}
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()} for group in state["param_groups"]]
    return tensors, groups


def load_optimizer(optimizer: torch.optim.Optimizer, tensors: Mapping[str, torch.Tensor],
                   param_groups: list[dict[str, Any]]) -> None:
    entries: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        index, _, key = name.partition(".")
        entries.setdefault(int(index), {})[key] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in group.items()} for group in param_groups]
    optimizer.load_state_dict({"state": entries, "param_groups": groups})


def rng_state(device: torch.device) -> tuple[dict[str, torch.Tensor], Any, Any]:
    """This process's generator states: torch (tensors), Python and NumPy (JSON-safe)."""
    import random

    import numpy as np

    tensors = {"torch_cpu": torch.random.get_rng_state()}
    if device.type == "cuda":
        tensors["torch_cuda"] = torch.cuda.get_rng_state(device)
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return tensors, _jsonable(random.getstate()), [kind, keys.tolist(), pos, has_gauss, gauss]


def set_rng_state(device: torch.device, tensors: Mapping[str, torch.Tensor], python: Any, numpy_state: Any) -> None:
    import random

    import numpy as np

    torch.random.set_rng_state(tensors["torch_cpu"])
    if device.type == "cuda" and "torch_cuda" in tensors:
        torch.cuda.set_rng_state(tensors["torch_cuda"], device)
    random.setstate(_tupled(python))
    kind, keys, pos, has_gauss, gauss = numpy_state
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))


def _jsonable(value: Any) -> Any:
    return [_jsonable(v) for v in value] if isinstance(value, (tuple, list)) else value


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


# ----------------------------------------------------------------------------- writing


def serialise_tensors(tensors: Mapping[str, torch.Tensor]) -> bytearray:
    """``tensors`` in the safetensors format, built in one buffer of the file's size.

    ``safetensors.torch.save`` holds every tensor's bytes and then the file's (twice the optimizer state of a
    generator, ~2.5 GB for SmolLM2's Adam moments, on the rank that writes); here each tensor is copied once,
    straight to its place in the file."""
    header: dict[str, Any] = {}
    offset = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    start = 8 + len(encoded)
    out = bytearray(start + offset)
    out[:start] = len(encoded).to_bytes(8, "little") + encoded
    for name, tensor in tensors.items():
        begin, end = header[name]["data_offsets"]
        if end > begin:
            flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
            out[start + begin:start + end] = memoryview(flat.numpy())
    return out


def _write_with_manifest(store: Store, files: Iterable[tuple[str, bytes | bytearray]],
                         extra: Mapping[str, Any]) -> None:
    """Every file, then ``manifest.json`` naming them with their sha256 (what makes the folder visible).

    ``files`` is consumed one file at a time: a checkpoint's weights and optimizer states (gigabytes for a
    generator) are never all in memory at once beside the training rank's own tensors."""
    listed = {}
    for name, data in files:
        store.write_bytes(data, name)
        listed[name] = {"bytes": len(data), "sha256": _sha256(data)}
        del data
    store.write_json({"format": FORMAT, **extra, "files": listed}, MANIFEST)


def write_checkpoint(store: Store, state: State, model: nn.Module, optimizer: torch.optim.Optimizer,
                     rng_tensors: list[Mapping[str, torch.Tensor]], *, keep: int) -> str:
    """Write checkpoint ``state.step`` under ``store`` (the run's ``checkpoints/`` folder); keep the newest ``keep``.

    ``rng_tensors``: each rank's torch generator states, rank order. Returns the checkpoint's URL.
    """
    folder = store.child(step_folder(state.step))
    _remove(folder)  # what a run killed while writing this step left behind
    opt_tensors, groups = optimizer_tensors(optimizer)
    state.param_groups = groups
    rng = {f"{key}.{rank}": value for rank, states in enumerate(rng_tensors) for key, value in states.items()}
    files = (
        ("model.safetensors", lambda: serialise_tensors(parameters_by_name(model))),
        ("optimizer.safetensors", lambda: serialise_tensors(opt_tensors)),
        ("rng.safetensors", lambda: serialise_tensors(rng)),
        ("state.json", lambda: json.dumps(state.__dict__, indent=1).encode()),
    )
    _write_with_manifest(folder, ((name, serialise()) for name, serialise in files), {"step": state.step})
    for old in complete_steps(store)[:-keep] if keep > 0 else []:
        _remove(store.child(step_folder(old)))
    return folder.url


def _remove(folder: Store) -> None:
    folder.remove(MANIFEST)  # invisible first
    folder.remove()


# ----------------------------------------------------------------------------- reading


def complete_steps(store: Store) -> list[int]:
    """Steps of the checkpoints under ``store`` whose manifest exists, oldest first."""
    steps = []
    for name in store.list():
        match = _STEP.match(name)
        if match and store.exists(name, MANIFEST):
            steps.append(int(match.group(1)))
    return sorted(steps)


def remove_incomplete(store: Store) -> list[str]:
    """Remove the step folders without a manifest (checkpoints killed while being written); returns their names."""
    dead = [name for name in store.list() if _STEP.match(name) and not store.exists(name, MANIFEST)]
    for name in dead:
        store.remove(name)
    return dead


def latest_checkpoint(store: Store) -> int | None:
    """The newest complete checkpoint's step (None when there is none); half-written ones are skipped."""
    steps = complete_steps(store)
    return steps[-1] if steps else None


@dataclass
class Checkpoint:
    state: State
    parameters: dict[str, torch.Tensor]
    optimizer: dict[str, torch.Tensor]
    rng: dict[int, dict[str, torch.Tensor]]  # rank -> {"torch_cpu": ..., "torch_cuda": ...}
    url: str


def _listed_files(folder: Store) -> dict[str, dict[str, Any]]:
    """The files ``manifest.json`` names: each a path that stays inside ``folder``, with its bytes and sha256."""
    where = folder.url_of(MANIFEST)
    fix = f"the manifest was not written by wikirag: remove {folder.url} and rerun the run that wrote it"
    manifest = folder.read_json(MANIFEST)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise CheckpointError(f"{where}: no 'files' object naming the folder's files; {fix}")
    for name, entry in files.items():
        try:
            relative_path(name, where)
        except StorePathError:
            raise CheckpointError(f"{where}: names file {name!r}, which is not a path inside the folder (no '..', "
                                  f"'.', empty name or leading '/'); {fix}") from None
        entry = entry if isinstance(entry, dict) else {}
        if not isinstance(entry.get("bytes"), int) or not isinstance(entry.get("sha256"), str):
            raise CheckpointError(f"{where}: file {name!r} has no bytes (int) and sha256 (str); {fix}")
    return files


def _read_checked(folder: Store) -> dict[str, bytes]:
    files = {}
    for name, entry in _listed_files(folder).items():
        data = folder.read_bytes(name)
        if len(data) != entry["bytes"] or _sha256(data) != entry["sha256"]:
            raise CheckpointError(f"{folder.url_of(name)}: does not match its manifest (sha256); the folder is "
                                  f"damaged: remove {folder.url} and rerun (it resumes from the one before)")
        files[name] = data
    return files


def read_checkpoint(store: Store, step: int) -> Checkpoint:
    folder = store.child(step_folder(step))
    files = _read_checked(folder)
    state = State(**json.loads(files["state.json"]))
    if state.format != FORMAT:
        raise CheckpointError(f"{folder.url}: checkpoint format {state.format}, this version reads {FORMAT}; "
                              "start a new run (another output folder)")
    rng: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in load_tensors(files["rng.safetensors"]).items():
        key, _, rank = name.rpartition(".")
        rng.setdefault(int(rank), {})[key] = value
    return Checkpoint(state, load_tensors(files["model.safetensors"]), load_tensors(files["optimizer.safetensors"]),
                      rng, folder.url)


def load_parameters(model: nn.Module, parameters: Mapping[str, torch.Tensor], where: str) -> None:
    """Copy saved parameters into ``model``; every name must match, shape for shape."""
    own = dict(model.named_parameters())
    if set(own) != set(parameters):
        missing, extra = sorted(set(own) - set(parameters)), sorted(set(parameters) - set(own))
        raise CheckpointError(f"{where}: the checkpoint's parameters do not fit this model (missing {missing[:3]}, "
                              f"unexpected {extra[:3]}); resume with the generator and encoder it was made with")
    with torch.no_grad():
        for name, param in own.items():
            if param.shape != parameters[name].shape:
                raise CheckpointError(f"{where}: parameter {name} has shape {tuple(parameters[name].shape)} in "
                                      f"the checkpoint, {tuple(param.shape)} in the model; resume with the same "
                                      "generator and encoder")
            param.copy_(parameters[name])


# ----------------------------------------------------------------------------- the final model


def save_model(model: Any, store: Store) -> str:
    """``model.save_pretrained`` into ``store`` (the run's ``model/`` folder), manifest last; returns its URL."""
    if store.exists(MANIFEST):
        store.remove(MANIFEST)  # the old model is invisible while the new one is written
    with tempfile.TemporaryDirectory(prefix="wikirag-model-") as tmp:
        root = model.save_pretrained(Path(tmp) / "model")
        files = ((path.relative_to(root).as_posix(), path.read_bytes())
                 for path in sorted(root.rglob("*")) if path.is_file())
        _write_with_manifest(store, files, {"index_version": model.index_version, "kind": model.config.kind})
    return store.url


def download_model(store: Store, local_dir: str | Path) -> Path:
    """A saved model's files (checked against its manifest) copied into ``local_dir``; returns it."""
    if not store.exists(MANIFEST):
        raise CheckpointError(f"{store.url}: no {MANIFEST}; not a finished model (a run may still be saving it, "
                              "or was killed while saving: rerun it)")
    local = Path(local_dir)
    files = _read_checked(store)
    inside = local.resolve()
    targets = {name: (inside / name).resolve() for name in files}
    if outside := [name for name, target in targets.items() if not target.is_relative_to(inside)]:
        raise CheckpointError(f"{store.url_of(MANIFEST)}: {outside[0]!r} resolves outside {local} (a link there?); "
                              f"download into an empty folder")
    for name, data in files.items():
        targets[name].parent.mkdir(parents=True, exist_ok=True)
        targets[name].write_bytes(data)
    return local


def load_model(store: Store, retriever: Any, local_dir: str | Path,
               overrides: Mapping[str, Any] | None = None) -> Any:
    """The RagModel saved by :func:`save_model` in ``store``, copied to ``local_dir``, over ``retriever``'s index."""
    from rag_core.model.rag_model import RagModel

    return RagModel.from_pretrained(download_model(store, local_dir), retriever, overrides)
