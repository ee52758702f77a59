"""The checksums of a model artifact: the sha256 of every file, and the check that refuses a changed one.

``checksums.json`` (``{"sha256": {path: digest}}``, paths relative to the artifact's root)
covers every other file of the artifact, MLmodel included. A check refuses, with one line
naming the file, a file that differs, one that is missing, and one that was added (an added
``.py`` is as refused as a changed weight). Only kinds of file that load without running
code may be listed: safetensors weights, JSON, text and Jinja templates, sentencepiece
models, and MLflow's own metadata at the root.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from rag_core.errors import WikiragError

CHECKSUMS = "checksums.json"
ROOT_FILES = frozenset({"MLmodel", "requirements.txt", "python_env.yaml", "conda.yaml"})
# What transformers reads under data/ without unpickling or running anything (no .bin, .pt, .pkl, .py)
DATA_SUFFIXES = (".safetensors", ".json", ".txt", ".jinja", ".model")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ModelArtifactError(WikiragError):
    """A model artifact that fails its checks (a changed, missing or added file, or another loader); not loaded."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(root: Path, where: str) -> dict[str, Path]:
    """Every file under ``root`` but checksums.json, by its path relative to ``root``; links are refused."""
    found = {}
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            if path.is_symlink():
                raise ModelArtifactError(f"{where}/{path.relative_to(root).as_posix()}: a link; refused: a model "
                                         "artifact holds plain files only (log the model again)")
        found.update({(Path(folder) / n).relative_to(root).as_posix(): Path(folder) / n for n in names})
    found.pop(CHECKSUMS, None)
    return found


def _check_kind(relative: str, where: str) -> None:
    if relative in ROOT_FILES or (relative.startswith("data/") and relative.endswith(DATA_SUFFIXES)):
        return
    raise ModelArtifactError(f"{where}/{relative}: not a file a wikirag model may carry (MLflow metadata at the root; "
                             f"{', '.join(DATA_SUFFIXES)} under data/); refused: nothing that could run is loaded")


def write_checksums(root: Path) -> str:
    """Write ``root/checksums.json`` over every other file (each of an allowed kind); returns its sha256."""
    files = _files(root, str(root))
    for relative in files:
        _check_kind(relative, str(root))
    record = {"sha256": {relative: file_sha256(path) for relative, path in sorted(files.items())}}
    (root / CHECKSUMS).write_text(json.dumps(record, indent=1, sort_keys=True))
    return file_sha256(root / CHECKSUMS)


def check_files(root: Path, where: str, *, anchor: tuple[str, str] | None = None,
                ignore: frozenset[str] | set[str] = frozenset()) -> None:
    """Refuse, with one line naming it, a file of the artifact at ``root`` that checksums.json does not vouch for.

    ``where`` names the artifact in messages; ``anchor``: (the sha256 checksums.json must have, where that
    digest was recorded), checked first; ``ignore``: files at the root that the loading side wrote
    (never read as the model).
    """
    file = root / CHECKSUMS
    if not file.is_file():
        raise ModelArtifactError(f"{where}/{CHECKSUMS}: missing; refused: its files cannot be checked "
                                 "(log the model with wikirag)")
    if anchor is not None and (digest := file_sha256(file)) != anchor[0]:
        raise ModelArtifactError(f"{where}/{CHECKSUMS}: sha256 {digest[:16]}... differs from {anchor[1]} "
                                 f"({anchor[0][:16]}...); refused: the artifact changed after it was registered")
    try:
        listed = json.loads(file.read_text())["sha256"]
        if not all(isinstance(k, str) and isinstance(v, str) and _SHA256.fullmatch(v) for k, v in listed.items()):
            raise ValueError("a digest is not 64 hex digits")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelArtifactError(f"{where}/{CHECKSUMS}: not a checksum list ({exc}); log the model again") from None
    present = {k: v for k, v in _files(root, where).items() if k not in ignore}
    for relative in sorted(present):
        if relative not in listed:
            raise ModelArtifactError(f"{where}/{relative}: not in {CHECKSUMS} (added after logging); refused")
        _check_kind(relative, where)
    for relative in sorted(listed):
        if relative not in present:
            raise ModelArtifactError(f"{where}/{relative}: listed in {CHECKSUMS} but missing; log the model again")
        if file_sha256(present[relative]) != listed[relative]:
            raise ModelArtifactError(f"{where}/{relative}: sha256 differs from {CHECKSUMS} (changed after "
                                     "logging); refused: log and register the model again")
