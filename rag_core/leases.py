"""Build leases: a small object on the store saying "a run is working on this; leave its files alone".

``leases/<kind>/<key>.json`` holds who (holder id, host, pid), since when, the
last heartbeat, the ttl and the store paths the run protects. While the run
works, a heartbeat thread rewrites it every ``ttl_s / 4``; at the end (also on
failure or a stop) the run deletes it. A lease whose heartbeat is older than its
ttl belongs to a run that died: the next taker takes it over. ``gc`` and
``delete`` keep whatever a live lease protects.

Every change is conditional on the record being the one last read, so two
takers never both win:

- S3: ``PUT`` with ``If-None-Match: *`` (create), ``If-Match: <etag>`` (heartbeat,
  takeover) and ``DELETE`` with ``If-Match`` (release). SeaweedFS 4.48 and AWS
  S3 honour all three (tests/rag_core/test_leases.py races 16 takers on
  SeaweedFS). A store that ignores the conditions gets the fallback: every
  write is read back and the lease counts as taken only when the record read
  names this holder (a race inside the read-back window can then let two win).
- Local disk (and ``file://``): the same read-compare-write under an
  exclusive ``flock`` of ``leases/<kind>/.lock``, records written aside and
  renamed into place.

Liveness compares the holder's clock with the reader's: hosts sharing a store
must agree on the time to well within the ttl.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from rag_core.errors import StoreError
from rag_core.storage import Store, is_local, translate_errors

LEASES_DIR = "leases"
DEFAULT_TTL_S = 120.0  # a heartbeat every 30 s; a killed run's lease is taken over 2 minutes after its last beat
_LOCK = ".lock"


class LeaseHeldError(StoreError):
    """Another run held the lease for longer than this run would wait."""


@dataclass(frozen=True)
class LeaseRecord:
    """What a lease object on the store says."""

    kind: str  # what is being built: "ingest", "index"
    key: str  # which one: a dump_id
    holder: str  # a fresh id per run
    host: str
    pid: int
    created: float  # POSIX seconds, the holder's clock
    heartbeat: float
    ttl_s: float
    protects: tuple[str, ...] = ()  # store-relative paths ("x/" a folder, "*" any name) that gc and delete keep
    note: str = ""

    def live(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) - self.heartbeat < self.ttl_s

    def describe(self, now: float | None = None) -> str:
        age = (time.time() if now is None else now) - self.heartbeat
        what = f" ({self.note})" if self.note else ""
        return (f"{self.kind} lease {self.key} held by {self.holder} on {self.host}, pid {self.pid}{what}, "
                f"heartbeat {age:.0f} s ago (ttl {self.ttl_s:g} s)")

    def held_here(self) -> bool:
        """Whether this process holds it (its own cleanup may remove what it protects from everyone else)."""
        return self.host == socket.gethostname() and self.pid == os.getpid()

    def covers(self, path: str) -> bool:
        """Whether the store-relative ``path`` (a file, or a folder ending in ``/``) lies under what this protects."""
        return any(fnmatch.fnmatchcase(path, p + "*" if p.endswith("/") else p) or
                   (path.endswith("/") and p.startswith(path)) for p in self.protects)

    def to_bytes(self) -> bytes:
        data = {**self.__dict__, "protects": list(self.protects)}
        return json.dumps(data, indent=2, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseRecord | None:
        """The record, or None when the bytes are not one (a damaged lease protects nothing and may be taken)."""
        try:
            raw = json.loads(data.decode("utf-8"))
            return cls(kind=str(raw["kind"]), key=str(raw["key"]), holder=str(raw["holder"]), host=str(raw["host"]),
                       pid=int(raw["pid"]), created=float(raw["created"]), heartbeat=float(raw["heartbeat"]),
                       ttl_s=float(raw["ttl_s"]), protects=tuple(str(p) for p in raw.get("protects") or ()),
                       note=str(raw.get("note") or ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def _file_name(key: str) -> str:
    if not isinstance(key, str) or not key or len(key) > 200:
        raise StoreError(f"lease key {key!r}: give a name of 1 to 200 characters (e.g. a dump_id)")
    return urllib.parse.quote(key, safe="-_.@+") + ".json"


# -- the conditional operations, one implementation per kind of store -------------------------------------------
def _precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is S3's answer to a condition that did not hold (412, or 409 for a concurrent conditional write)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return False
        response = getattr(seen, "response", None) or {}
        code = (response.get("Error") or {}).get("Code")
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _get_object(fs: Any, bucket: str, key: str) -> tuple[bytes, str]:
    """An S3 object's bytes and the ETag of those very bytes (one GET; s3fs's ``cat_file`` trusts its listing cache,
    which can miss an object another client has just created)."""
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    async with response["Body"] as body:
        return await body.read(), response["ETag"]


class _Slot:
    """One lease object: read it with its token, and create, replace or delete it only if it is still as read.

    A token is the object's ETag on S3, the sha256 of its bytes on a local disk.
    """

    def __init__(self, store: Store, kind: str, key: str) -> None:
        self.folder = store.child(LEASES_DIR, kind)
        self.name = _file_name(key)
        self.url = self.folder.url_of(self.name)
        self.local = is_local(store.url)
        self.path = self.folder.path_of(self.name)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        folder = self.folder.path_of()
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, _LOCK), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _local_read(self) -> tuple[bytes, str] | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def read(self) -> tuple[bytes, str] | None:
        """(bytes, token) of the object, or None when there is none."""
        with translate_errors(self.url, "reading a lease"):
            if self.local:
                return self._local_read()
            from fsspec.asyn import sync

            fs = self.folder.fs
            try:
                return sync(fs.loop, _get_object, fs, *fs.split_path(self.path)[:2])
            except FileNotFoundError:
                return None

    def write(self, data: bytes, token: str | None) -> str | None:
        """Create (``token`` None) or replace the object as it was read; the new token, or None when it changed."""
        with translate_errors(self.url, "writing a lease"):
            if self.local:
                with self._locked():
                    current = self._local_read()
                    if (current[1] if current else None) != token:
                        return None
                    self.folder.write_bytes(data, self.name)
                    return hashlib.sha256(data).hexdigest()
            bucket, key, _ = self.folder.fs.split_path(self.path)
            condition = {"IfNoneMatch": "*"} if token is None else {"IfMatch": token}
            try:
                self.folder.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, **condition)
            except OSError as exc:  # s3fs makes a failed If-None-Match a FileExistsError, a failed If-Match an OSError
                if isinstance(exc, FileExistsError) or _precondition_failed(exc):
                    return None
                raise
        # A store that ignores the condition answers 200 to every writer: read back who holds it now.
        now = self.read()
        return now[1] if now is not None and now[0] == data else None

    def delete(self, token: str) -> bool:
        """Delete the object if it is still as read; whether it was."""
        with translate_errors(self.url, "releasing a lease"):
            if self.local:
                with self._locked():
                    current = self._local_read()
                    if current is None or current[1] != token:
                        return False
                    os.unlink(self.path)
                    return True
            bucket, key, _ = self.folder.fs.split_path(self.path)
            try:
                self.folder.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=token)
            except OSError as exc:
                if _precondition_failed(exc):
                    return False
                raise
            return True


# -- holding a lease ------------------------------------------------------------------------------------------
@dataclass
class Lease:
    """A lease this process holds: refresh it (or let its heartbeat thread do so), widen what it protects, release it.

    As a context manager it beats while the block runs and is released when the block ends, however it ends.
    """

    store: Store
    record: LeaseRecord
    token: str
    took_over: LeaseRecord | None = None  # the expired lease of a run that died, when this one replaced it
    lost: bool = False  # another run took it over: this run's heartbeat had stopped for longer than the ttl
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def _slot(self) -> _Slot:
        return _Slot(self.store, self.record.kind, self.record.key)

    def _rewrite(self, change: Callable[[LeaseRecord], LeaseRecord]) -> bool:
        # the change is applied under the lock, so a heartbeat never writes back a record older than a protect's
        with self._lock:
            if self.lost:
                return False
            record = replace(change(self.record), heartbeat=time.time())
            token = self._slot.write(record.to_bytes(), self.token)
            if token is None:
                self.lost = True
                return False
            self.record, self.token = record, token
            return True

    def refresh(self) -> bool:
        """Write a new heartbeat; False when the lease was lost (taken over by another run)."""
        return self._rewrite(lambda record: record)

    def protect(self, *paths: str) -> bool:
        """Add store-relative paths to what gc and delete keep; False when the lease was lost."""
        return self._rewrite(lambda record: replace(
            record, protects=record.protects + tuple(p for p in paths if p not in record.protects)))

    def _beat(self, every_s: float, on_error: Callable[[Exception], None] | None) -> None:
        while not self._stop.wait(every_s):
            try:
                if not self.refresh():
                    return
            except StoreError as exc:  # a store hiccup: the next beat tries again, well within the ttl
                if on_error is not None:
                    on_error(exc)

    def start_heartbeat(self, every_s: float | None = None,
                        on_error: Callable[[Exception], None] | None = None) -> Lease:
        """Refresh the lease every ``every_s`` (default a quarter of its ttl) in a daemon thread until released."""
        if self._thread is None:
            every = every_s if every_s is not None else self.record.ttl_s / 4
            self._thread = threading.Thread(target=self._beat, args=(every, on_error), daemon=True,
                                            name=f"lease-{self.record.kind}-{self.record.key}")
            self._thread.start()
        return self

    def release(self) -> bool:
        """Stop the heartbeat and delete the lease if this run still holds it; whether it did."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self.lost:
                return False
            self.lost = True  # released: nothing may rewrite it any more
            return self._slot.delete(self.token)

    def __enter__(self) -> Lease:
        return self.start_heartbeat()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.release()
        except StoreError:
            if exc_type is None:
                raise
            # the run's own error says more; the lease expires after its ttl


def read_lease(store: Store, kind: str, key: str) -> LeaseRecord | None:
    """The lease on ``kind/key`` (live or expired), or None."""
    found = _Slot(store, kind, key).read()
    return LeaseRecord.from_bytes(found[0]) if found else None


def try_take_lease(store: Store, kind: str, key: str, *, ttl_s: float = DEFAULT_TTL_S, protects: Iterable[str] = (),
                   note: str = "") -> Lease | LeaseRecord:
    """Take the lease on ``kind/key`` now: the :class:`Lease` when taken (a fresh one, or an expired one taken
    over), else the live record of the run that holds it."""
    slot = _Slot(store, kind, key)
    now = time.time()
    mine = LeaseRecord(kind=kind, key=key, holder=uuid.uuid4().hex[:16], host=socket.gethostname(), pid=os.getpid(),
                       created=now, heartbeat=now, ttl_s=ttl_s, protects=tuple(protects), note=note)
    while True:
        found = slot.read()
        current = LeaseRecord.from_bytes(found[0]) if found else None
        if current is not None and current.live():
            return current
        token = slot.write(mine.to_bytes(), found[1] if found else None)
        if token is not None:
            return Lease(store, mine, token, took_over=current)
        # another taker changed it between the read and the write: read again


def take_lease(store: Store, kind: str, key: str, *, ttl_s: float = DEFAULT_TTL_S, wait_s: float = 0.0,
               poll_s: float | None = None, protects: Iterable[str] = (), note: str = "",
               on_wait: Callable[[LeaseRecord], None] | None = None) -> Lease:
    """Take the lease on ``kind/key``, waiting up to ``wait_s`` while another run holds it.

    ``on_wait(record)`` is called when the wait starts and whenever the holder changes. Past ``wait_s``, a
    :class:`LeaseHeldError` names the holder. The lease is returned without a heartbeat: use it as a context manager
    (or call ``start_heartbeat``).
    """
    deadline = time.monotonic() + wait_s
    poll = poll_s if poll_s is not None else max(0.05, min(5.0, ttl_s / 4))
    seen: str | None = None
    while True:
        got = try_take_lease(store, kind, key, ttl_s=ttl_s, protects=protects, note=note)
        if isinstance(got, Lease):
            return got
        if time.monotonic() >= deadline:
            raise LeaseHeldError(f"{store.url_of(LEASES_DIR, kind, _file_name(key))}: {got.describe()}, for longer "
                                 f"than this run waits ({wait_s:g} s); rerun once it has finished (its result is "
                                 f"reused), or once its lease expires if that run is gone")
        if on_wait is not None and got.holder != seen:
            on_wait(got)
        seen = got.holder
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))


def live_leases(store: Store, now: float | None = None) -> list[LeaseRecord]:
    """Every live lease on the store (damaged and expired ones left out), by kind and key."""
    found = []
    for kind in store.list(LEASES_DIR):
        for name in store.list(LEASES_DIR, kind):
            if not name.endswith(".json"):
                continue
            read = _Slot(store, kind, urllib.parse.unquote(name.removesuffix(".json"))).read()
            record = LeaseRecord.from_bytes(read[0]) if read else None  # None: released meanwhile, or damaged
            if record is not None and record.live(now):
                found.append(record)
    return sorted(found, key=lambda r: (r.kind, r.key))


def holding_lease(leases: Iterable[LeaseRecord], path: str) -> LeaseRecord | None:
    """The first of ``leases`` that protects the store-relative ``path`` (a folder ends in ``/``), or None."""
    return next((lease for lease in leases if lease.covers(path)), None)
