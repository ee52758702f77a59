"""LATEST, the version readers get by default: it moves forward only, in one compare-and-write.

Builds finish in any order (a slow rebuild finishes after one started later),
so LATEST moves only to a version created after the one it names: versions
are ordered by their manifest's ``created_at`` (the time in the version's
name, given when its build was planned), then by name. The compare and the
write are one step, so two publishers racing never move LATEST backwards:

- S3: a conditional PUT, ``If-Match`` on the ETag of the LATEST that was
  compared (``If-None-Match: *`` when there was none); a lost race (412
  Precondition Failed) reads LATEST again and compares again. SeaweedFS and
  AWS S3 honour both headers; a store that answers 501 to them gets a plain
  PUT after the compare.
- a local folder: an exclusive ``flock`` on ``_latest.lock`` beside LATEST
  held over the read, the compare and the rename (released when the process
  dies; the file is removed on release).
- other fsspec stores: compare, then write.

``allow_backwards`` is for moves back on purpose (deleting the LATEST version).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
from collections.abc import Iterator

from rag_core.errors import StoreError
from rag_core.index.faiss_index import sha256_hex
from rag_core.index.manifest import MANIFEST, ManifestError, parse_manifest
from rag_core.index.version_names import INDEXES_DIR, LATEST, IndexVersionError, check_name
from rag_core.storage import Store, is_local, translate_errors

LOCK = "_latest.lock"  # a leading '_': never taken for a version folder or a build's leftover
TRIES = 20  # compares lost to other publishers before giving up: each loss means LATEST moved meanwhile


def parse_pointer(data: bytes, where: str) -> dict[str, Any]:
    """LATEST's bytes as ``{"version", "manifest_sha256"}``; else an error naming ``where`` (its URL) and the fix."""
    try:
        pointer = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        pointer = None
    if not isinstance(pointer, dict) or not isinstance(pointer.get("version"), str):
        raise IndexVersionError(f"{where}: not a LATEST pointer; point it at a version again "
                                "(rebuild, or write {\"version\": \"...\"}) or delete the file")
    return pointer


def move_latest(store: Store, version: str, *, allow_backwards: bool = False) -> str:
    """Point LATEST at the published ``version`` unless it names a newer one; returns what LATEST names on return.

    That is ``version`` when LATEST moved (or already named it), else the newer
    version it stays on. With ``allow_backwards`` LATEST moves whatever it names.
    """
    indexes = store.child(INDEXES_DIR)
    where = indexes.url_of(check_name(version), MANIFEST)
    try:
        data = indexes.read_bytes(version, MANIFEST)
    except FileNotFoundError:
        raise IndexVersionError(f"{indexes.url_of(version)}: no manifest; LATEST points at published versions "
                                "only") from None
    target = _order(parse_manifest(data, where).created_at, version)
    # The manifest's own checksum: a reader through LATEST detects a manifest edited after publishing.
    sha256 = sha256_hex(data)
    pointer = json.dumps({"version": version, "manifest_sha256": sha256}, indent=2, sort_keys=True).encode() + b"\n"
    slot = _slot(indexes)
    with slot.exclusive():
        for _ in range(TRIES):
            stored, tag = slot.read()
            if stored is not None:
                current = parse_pointer(stored, indexes.url_of(LATEST))
                if current["version"] == version and current.get("manifest_sha256") == sha256:
                    return version
                if not allow_backwards and (held := _created(indexes, current["version"])) is not None \
                        and _order(held, current["version"]) > target:
                    return current["version"]
            if slot.write(pointer, tag):
                return version
    raise StoreError(f"{indexes.url_of(LATEST)}: other publishers moved LATEST {TRIES} times while {version} was "
                     f"compared with it; {version} is published (readers can name it): rerun to move LATEST")


def _order(created_at: dt.datetime, version: str) -> tuple[dt.datetime, str]:
    return created_at.astimezone(dt.UTC), version


def _created(indexes: Store, version: str) -> dt.datetime | None:
    """``created_at`` of the version LATEST names; None when that is no version name, or its manifest is gone or
    unreadable (any published version is then better than it)."""
    try:
        check_name(version)
        return parse_manifest(indexes.read_bytes(version, MANIFEST), indexes.url_of(version, MANIFEST)).created_at
    except (FileNotFoundError, ManifestError, IndexVersionError):
        return None


class _Slot:
    """LATEST on a store with no condition to lean on: compare, then write."""

    def __init__(self, indexes: Store) -> None:
        self.indexes = indexes

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def read(self) -> tuple[bytes | None, str | None]:
        """(LATEST's bytes or None when absent, the token a conditional write is checked against)."""
        try:
            return self.indexes.read_bytes(LATEST), None
        except FileNotFoundError:
            return None, None

    def write(self, data: bytes, tag: str | None) -> bool:
        """Write LATEST unless it changed since ``read``; False when it did (the compare was lost)."""
        self.indexes.write_bytes(data, LATEST)
        return True


class _LocalSlot(_Slot):
    """A local folder: read, compare and rename under an exclusive lock on a file beside LATEST."""

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        import fcntl

        path = self.indexes.path_of(LOCK)
        with translate_errors(self.indexes.url_of(LOCK), "locking"):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            while True:
                lock = open(path, "a")  # noqa: SIM115 - closed below, which releases the lock
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:  # the holder before us unlinked the file it locked: lock the one at the path now
                    if os.fstat(lock.fileno()).st_ino == os.stat(path).st_ino:
                        break
                except FileNotFoundError:
                    pass
                lock.close()
        try:
            yield
        finally:
            # Removed while still held, so that the folder keeps only versions and LATEST; a waiter that opened
            # this file sees it gone and locks anew.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            lock.close()


class _S3Slot(_Slot):
    """S3: the write is conditional on the ETag read with LATEST (or on its absence)."""

    def read(self) -> tuple[bytes | None, str | None]:
        fs, path = self.indexes.fs, self.indexes.path_of(LATEST)
        with translate_errors(self.indexes.url_of(LATEST), "reading"):
            fs.invalidate_cache(path)
            try:
                # ETag first: if LATEST changes between the two calls, the write's If-Match on it fails.
                tag = fs.info(path)["ETag"]
                return fs.cat_file(path), tag
            except FileNotFoundError:
                return None, None

    def write(self, data: bytes, tag: str | None) -> bool:
        fs, path = self.indexes.fs, self.indexes.path_of(LATEST)
        condition = {"IfMatch": tag} if tag else {"mode": "create"}
        with translate_errors(self.indexes.url_of(LATEST), "writing"):
            try:
                fs.pipe_file(path, data, **condition)
            except OSError as exc:
                status = _status(exc)
                if status in (409, 412):  # 409: AWS's ConditionalRequestConflict, a concurrent conditional write
                    return False
                if status != 501 and exc.errno != errno.ENOSYS:
                    raise
                fs.pipe_file(path, data)  # the store does not do conditional writes: the compare was the check
        return True


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind an s3fs error (it wraps botocore's ClientError)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        status = (getattr(seen, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
        seen = seen.__cause__
    return None


def _slot(indexes: Store) -> _Slot:
    if is_local(indexes.url):
        return _LocalSlot(indexes)
    protocols = indexes.fs.protocol if isinstance(indexes.fs.protocol, tuple) else (indexes.fs.protocol,)
    return _S3Slot(indexes) if {"s3", "s3a"} & set(protocols) else _Slot(indexes)
