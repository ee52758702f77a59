"""The index manifest: one typed record per published version, validated whenever it is read.

``indexes/<version>/manifest.json`` is written last and makes a version
visible. It names every file the version reads, with its sha256, so that a
reader can check them and ``delete``/``gc`` can tell which files are still in
use:

- per shard, the FAISS file and the passages file (in the version's folder),
  and the embedding files its vectors came from (``embeddings``: store-relative
  paths under ``embeddings/``, shared between versions built from the same
  vectors);
- the encoder's fingerprint, the passage set (``dump_id``), the dump, the
  index settings and the gates' results.

Every path it names has the one shape the builder writes (``shard-00001.faiss``,
``embeddings/<fingerprint_id>/<dump_id>/rows-<start>-<stop>.<w>.npy``, ...), so a
manifest edited to name a file outside the store (or outside its version's folder
and its embedding folder) is refused when read, before any file it names is opened.

Schema versions: 1 had no embedding references (those versions read embedding
files that a rebuild with another shard count rewrote); 2 is this one. A
manifest of any other schema, or one that is not valid UTF-8 JSON of this
shape, is a :class:`ManifestError` naming the file, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from rag_core.errors import WikiragError

SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
SHA256 = r"^[0-9a-f]{64}$"
# The shapes of the paths a manifest names: those versions.shard_names and embeddings.embedding_ref write.
NAME = r"[0-9A-Za-z][0-9A-Za-z._-]*"  # a version or a passage set: one name, never '.' or '..'
FINGERPRINT_ID = r"^[0-9a-f]{16}$"
SHARD_FILE = re.compile(r"^shard-(\d{5,})\.faiss$")
SHARD_IDS_FILE = re.compile(r"^shard-(\d{5,})\.ids\.parquet$")
EMBEDDING_FILE = re.compile(rf"^embeddings/([0-9a-f]{{16}})/({NAME})/rows-(\d{{10,}})-(\d{{10,}})\.([0-9a-f]{{8}})"
                            r"\.(npy|ids\.parquet)$")


class ManifestError(WikiragError):
    """A manifest that cannot be read: not UTF-8 JSON, another schema version, or a field missing or wrong."""


class EmbeddingRef(BaseModel):
    """The embedding files one index shard was built from (paths relative to the store's root)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: int = Field(ge=0, description="first row of the passage set in this shard")
    stop: int = Field(ge=0, description="one past the last row")
    vectors: str = Field(description="float32 [n, dim] .npy, row i = passage start + i")
    vectors_sha256: str = Field(pattern=SHA256)
    ids: str = Field(description=".ids.parquet: passage_id and text_hash per row")
    ids_sha256: str = Field(pattern=SHA256)

    @field_validator("vectors", "ids")
    @classmethod
    def _written_by_embed(cls, path: str, info: ValidationInfo) -> str:
        """The two files of one range: ``embeddings/<fingerprint_id>/<dump_id>/rows-<start>-<stop>.<w>.<ext>``."""
        ext = "npy" if info.field_name == "vectors" else "ids.parquet"
        match = EMBEDDING_FILE.match(path)
        if match is None or match.group(6) != ext:
            raise ValueError(f"{path!r} is not an embedding file of this store "
                             f"(embeddings/<fingerprint_id>/<dump_id>/rows-<start>-<stop>.<8 hex>.{ext})")
        rows = int(match.group(3)), int(match.group(4))
        if rows != (info.data.get("start"), info.data.get("stop")):
            raise ValueError(f"{path!r} holds rows {rows[0]}..{rows[1]}, this reference rows "
                             f"{info.data.get('start')}..{info.data.get('stop')}")
        vectors = EMBEDDING_FILE.match(info.data.get("vectors") or "")
        if info.field_name == "ids" and vectors is not None and vectors.groups()[:5] != match.groups()[:5]:
            raise ValueError(f"{path!r} is not the ids file of the range {info.data['vectors']!r}")
        return path

    def folder(self) -> tuple[str, str]:
        """(fingerprint_id, dump_id) of the embedding folder both files are in."""
        match = EMBEDDING_FILE.match(self.vectors)
        return match.group(1), match.group(2)

    def paths(self) -> tuple[str, str]:
        """The two data files a reader of this shard's vectors opens."""
        return self.vectors, self.ids


class ShardEntry(BaseModel):
    """One shard of a version: its files in the version's folder and, when built from a passage set, its vectors."""

    model_config = ConfigDict(extra="forbid")

    shard: int = Field(ge=0)
    url: str = Field(description="the FAISS file, relative to the version's folder")
    ids_url: str = Field(description="passage_id (+ title, text) in FAISS row order")
    count: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=SHA256)
    ids_sha256: str = Field(pattern=SHA256)
    columns: list[str]
    meta: dict[str, Any] = Field(default_factory=dict, description="free-form: resolved factory, search "
                                 "parameters, measured recall and speed")
    embeddings: EmbeddingRef | None = Field(None, description="None for versions published from bare vectors")

    @field_validator("url", "ids_url")
    @classmethod
    def _written_by_publish(cls, name: str, info: ValidationInfo) -> str:
        """``shard-<shard>.faiss`` and ``shard-<shard>.ids.parquet``, in the version's folder."""
        pattern, ext = (SHARD_FILE, "faiss") if info.field_name == "url" else (SHARD_IDS_FILE, "ids.parquet")
        match, shard = pattern.match(name), info.data.get("shard")
        if match is None or int(match.group(1)) != shard:
            raise ValueError(f"{name!r} is not shard {shard}'s file in the version's folder (shard-<5 digits>.{ext})")
        return name


class IndexManifest(BaseModel):
    """What a published version is and what it reads."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[2] = SCHEMA_VERSION
    version: str = Field(pattern=f"^{NAME}$", description="the version's folder under indexes/")
    created_at: dt.datetime
    count: int = Field(ge=0, description="passages in all shards")
    dim: int = Field(ge=1)
    metric: Literal["ip", "l2"]
    factory: str = Field(description="the resolved FAISS factory (comma-joined when shards differ)")
    factory_requested: str | None = Field(None, description="what was asked for, e.g. auto")
    index_config: dict[str, Any] | None = None
    encoder: dict[str, Any] | None = Field(None, description="the passage encoder's fingerprint")
    fingerprint_id: str | None = Field(None, pattern=FINGERPRINT_ID, description="names the embedding folder")
    encoder_config: dict[str, Any] | None = None
    dump_id: str | None = Field(None, pattern=f"^{NAME}$", description="the passage set the version was built from")
    passages: str | None = Field(None, description="that passage set's URL")
    dump: dict[str, Any] | None = Field(None, description="the dump behind the passages: url, sha256, bytes")
    gates: dict[str, Any] = Field(default_factory=dict, description="the gates' summaries and observed values")
    shards: list[ShardEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _embeddings_of_this_build(self) -> IndexManifest:
        """Embedding files are those of this version's encoder and passage set, the only ones its build reads."""
        for entry in self.shards:
            if entry.embeddings is not None and entry.embeddings.folder() != (self.fingerprint_id, self.dump_id):
                raise ValueError(f"shard {entry.shard}'s embeddings {entry.embeddings.vectors!r} are not in "
                                 f"embeddings/{self.fingerprint_id}/{self.dump_id}/, the folder of this version's "
                                 "fingerprint_id and dump_id")
        return self

    def files(self) -> list[str]:
        """Every file this version reads, relative to the store's root (its manifest included)."""
        root = f"indexes/{self.version}"
        out = [f"{root}/{MANIFEST}"]
        for entry in self.shards:
            out += [f"{root}/{entry.url}", f"{root}/{entry.ids_url}"]
            if entry.embeddings is not None:
                out += entry.embeddings.paths()
        return out

    def as_dict(self) -> dict[str, Any]:
        """The manifest as the JSON object stored (for readers that index it by key)."""
        return self.model_dump(mode="json")


# Fields publish fills in itself; callers give the rest.
GENERATED_FIELDS = ("schema_version", "version", "created_at", "count", "shards")
CALLER_FIELDS = tuple(name for name in IndexManifest.model_fields if name not in GENERATED_FIELDS)


def parse_manifest(data: bytes, where: str) -> IndexManifest:
    """Validate a manifest's bytes; ``where`` (its URL) names the file in every error."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{where}: not UTF-8 text (byte {exc.start}); the file is damaged: "
                            "restore it from a backup, or delete the version") from exc
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}; "
                            "truncated?); restore it from a backup, or delete the version") from exc
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: a manifest is a JSON object, this is a {type(obj).__name__}")
    schema = obj.get("schema_version", obj.get("format"))
    if schema != SCHEMA_VERSION:
        if schema == 1:
            fix = "it predates embedding references: rebuild the index, then delete this version"
        else:
            fix = "written by another wikirag: use that release to read it, or rebuild the index"
        raise ManifestError(f"{where}: manifest schema version {schema!r}, this wikirag reads {SCHEMA_VERSION}; {fix}")
    try:
        return IndexManifest.model_validate(obj)
    except ValidationError as exc:
        raise ManifestError(f"{where}: {describe_errors(exc)}; the file is damaged or was not written by wikirag") from exc


def describe_errors(exc: ValidationError, limit: int = 3) -> str:
    """Pydantic's errors in one line: ``field 'shards.0.sha256': Field required; ...``."""
    parts = []
    for error in exc.errors()[:limit]:
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        parts.append(f"field '{where}': {error['msg']}")
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
