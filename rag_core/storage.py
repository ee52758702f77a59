"""One interface over any fsspec store: a local folder, ``file://`` or ``s3://``.

Local and S3 stores differ only in their base URL and options; every stage
reads and writes through a :class:`Store`.  Failures of the store itself
(credentials, reachability, missing bucket) become one-line
:class:`~rag_core.errors.StoreError` messages that name the URL and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import posixpath
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import fsspec
from fsspec.core import url_to_fs

from rag_core.errors import StoreError

log = logging.getLogger("wikirag.store")


class DamagedFileError(StoreError, ValueError):
    """A file on the store that is not what wikirag wrote there (not UTF-8 JSON): tampered with or torn.

    A ValueError too, so that cleanup that tolerates unreadable records keeps doing so.
    """

class StoreUnreachableError(StoreError):
    """The store did not answer, or answered with a server error, through every retry: a run should stop, not go on
    meeting the same dead store shard after shard."""


S3FS_TRIES = 2  # s3fs's tries of a call when botocore's retries are configured (see Store._fs_and_root)
_CREDENTIAL_HINT = "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
_ENDPOINT_HINT = "check AWS_ENDPOINT_URL (or WIKIRAG_STORE) and that the server is running"
_RERUN_HINT = "then rerun (a rebuild reuses finished work)"
# HTTP 500 and 507 come from a server that is up and failing the request itself; a disk that has filled up is the
# usual cause (SeaweedFS: "no writable volumes"), not an address or a stopped server, which 502/503/504 point to.
_FAILING_HINT = "the server is up but failing: check its free disk space and its log"
# Connection refused, reset or timed out, after botocore's retries (names: no common base we can import cheaply).
_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ReadTimeoutError",
                "ConnectionClosedError", "ServerDisconnectedError"}


def user_cache_dir() -> Path:
    """This machine's cache of things wikirag can always make again (``$XDG_CACHE_HOME/wikirag``, else
    ``~/.cache/wikirag``): the Prefect database template, int8 encoder weights. Never a store's data."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "wikirag"


def write_aside(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Make the local file ``path`` with ``write(f)``: written to a temporary file beside it, then renamed over it,
    so a reader (another process sharing the user's cache) sees the old file or the whole new one, never half.
    Raises OSError (a read-only or full disk); no temporary file is left behind either way."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class StorePathError(StoreError):
    """A path inside a store that could leave the folder it is joined to: a ``..``, ``.`` or empty name in it."""


def relative_path(path: str, where: str, *, under: str | None = None) -> str:
    """``path`` when it is names joined by ``/`` (below ``under/`` when given) that stay inside the folder they are
    joined to: no ``..``, ``.`` or empty name, so no leading, trailing or doubled ``/`` either.

    Else a :class:`StorePathError` whose message starts with ``where`` (the file that named the path, or the URL
    being made), so a path read from the store can never name a file outside it.
    """
    if not isinstance(path, str):
        raise StorePathError(f"{where}: {path!r} is not a path; give names joined by '/'")
    bad = next((name for name in path.split("/") if name in ("", ".", "..") or "\x00" in name), None)
    if bad is not None:
        problem = ("an empty name (a leading, trailing or doubled '/')" if bad == "" else
                   "a NUL character" if "\x00" in bad else f"a {bad!r}")
        raise StorePathError(f"{where}: path {path!r} has {problem}; a path on a store is names joined by '/' "
                             "that stays inside the folder it is joined to")
    if under is not None and not path.startswith(f"{under}/"):
        raise StorePathError(f"{where}: path {path!r} is not under {under}/, the only folder it may name")
    return path


def join_url(base: str, *parts: str) -> str:
    """``base/part/part``; works for paths and URLs. Each part is a name or names joined by ``/``, checked by
    :func:`relative_path`: a part never leads out of ``base`` (``..``), nor starts again from the root (``/x``)."""
    out = base.rstrip("/")
    for part in parts:
        out = f"{out}/{relative_path(part, f'{out}/{part}')}"
    return out


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


@contextlib.contextmanager
def translate_errors(url: str, action: str) -> Iterator[None]:
    """Turn the many shapes of store failures into one StoreError line."""
    try:
        yield
    except StoreError:
        raise
    except PermissionError as exc:
        raise StoreError(f"{url}: {action} refused by the store ({error_reason(exc)}); {_CREDENTIAL_HINT}") from exc
    except FileNotFoundError:
        raise
    except (NotADirectoryError, IsADirectoryError, FileExistsError) as exc:
        raise StoreError(f"{url}: {action} failed ({exc.strerror or exc}); the store path is blocked by a file") from exc
    except Exception as exc:  # botocore and aiohttp errors have no common base we can import cheaply
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StoreError(f"{url}: {action} failed: {exc.strerror}; free space on the store's disk (or point "
                             "--store/WIKIRAG_STORE at a larger one) and rerun: nothing was published, finished "
                             "work is reused") from exc
        name = type(exc).__name__
        text = str(exc)
        if name == "NoCredentialsError" or "Unable to locate credentials" in text:
            raise StoreError(f"{url}: no credentials for the store; {_CREDENTIAL_HINT}") from exc
        if name in _UNREACHABLE or isinstance(exc, (ConnectionError, TimeoutError)):
            raise StoreUnreachableError(f"{url}: {action} failed: store unreachable ({name}); {_ENDPOINT_HINT}, "
                                        f"{_RERUN_HINT}") from exc
        if (status := server_error_status(exc)) is not None:
            hint = _FAILING_HINT if status in (500, 507) else _ENDPOINT_HINT
            raise StoreUnreachableError(f"{url}: {action} failed: the store answered HTTP {status} "
                                        f"({error_reason(exc)}); {hint}, {_RERUN_HINT}") from exc
        if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
            raise StoreError(f"{url}: the bucket does not exist; create it first") from exc
        if any(code in text for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Forbidden")):
            raise StoreError(f"{url}: {action} refused by the store ({error_reason(exc)}); {_CREDENTIAL_HINT}") from exc
        raise


def server_error_status(exc: BaseException) -> int | None:
    """The HTTP status (5xx) of a server error behind ``exc`` (s3fs wraps botocore's ClientError in an OSError)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        status = (getattr(seen, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int) and status >= 500:
            return status
        seen = seen.__cause__ or seen.__context__
    return None


def error_reason(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its class name when it has none), at most 160 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]


def retry_window_s(retries: int) -> float:
    """The longest botocore's "standard" mode sleeps between the ``retries`` retries of one request: its backoff's
    worst case, ``min(2 ** i, 20)`` seconds before retry ``i + 1``."""
    return float(sum(min(2 ** i, 20) for i in range(retries)))


class RetryNotice:
    """botocore's ``needs-retry`` hook on an S3 store's client: a warning for a failed try that botocore's "standard"
    mode will try again, at most one each ``every_s`` seconds. Without it a store that does not answer is silent
    for the whole retry window (tens of seconds) before its one-line error. It never returns a delay: botocore's
    own handler decides whether and when to retry. ``tries``: per request, None when not known."""

    def __init__(self, tries: int | None, every_s: float = 10.0) -> None:
        from botocore.retries.standard import ThrottledRetryableChecker, TransientRetryableChecker

        self.tries, self.every_s, self.last = tries, every_s, -math.inf
        # botocore's own tables of what standard mode retries besides connection errors, so they cannot drift
        self.statuses = frozenset(getattr(TransientRetryableChecker, "_TRANSIENT_STATUS_CODES", (500, 502, 503, 504)))
        self.codes = frozenset(getattr(TransientRetryableChecker, "_TRANSIENT_ERROR_CODES", ())) | frozenset(
            getattr(ThrottledRetryableChecker, "_THROTTLED_ERROR_CODES", ()))

    def __call__(self, attempts: int = 0, caught_exception: BaseException | None = None, response: Any = None,
                 endpoint: Any = None, **_: Any) -> None:
        if caught_exception is not None:
            problem = type(caught_exception).__name__
        else:
            status = getattr(response[0], "status_code", None) if response else None
            code = ((response[1] if response else None) or {}).get("Error", {}).get("Code")
            if status not in self.statuses and code not in self.codes:
                return None  # an answer: success, or a refusal no retry changes
            problem = f"HTTP {status}" + (f" ({code})" if code else "")
        if self.tries is not None and attempts >= self.tries:
            return None  # the last try: the StoreError line that follows says the rest
        now = time.monotonic()
        if now - self.last < self.every_s:
            return None
        self.last = now
        where = urlsplit(getattr(endpoint, "host", "") or "")  # host and port only: a URL may hold user:password
        left = ("" if self.tries is None else
                f" of {self.tries}; retrying, with up to {retry_window_s(self.tries - 1):.0f} s of backoff,")
        log.warning("S3 store at %s: %s on try %d%s before giving up", where.netloc.rpartition("@")[2] or "?",
                    problem, attempts, left or "; retrying")
        return None


def _tries(options: Mapping[str, Any]) -> int | None:
    """Tries per request that ``options`` give botocore's "standard" mode (None: another mode, or its default)."""
    retries = (options.get("config_kwargs") or {}).get("retries") or {}
    if retries.get("mode") != "standard":
        return None
    if "total_max_attempts" in retries:
        return int(retries["total_max_attempts"])
    return int(retries["max_attempts"]) + 1 if "max_attempts" in retries else None


def watch_retries(fs: fsspec.AbstractFileSystem, options: Mapping[str, Any]) -> None:
    """Give an s3fs filesystem a :class:`RetryNotice` (other filesystems are left as they are), once: on its client
    when it has one, else on the session it will make its client from, which it then keeps when it refreshes."""
    if not hasattr(fs, "_s3") or getattr(fs, "_wikirag_retry_notice", False):
        return
    notice = RetryNotice(_tries(options))
    if fs._s3 is not None:  # opened already, by whoever shares this cached instance
        fs._s3.meta.events.register("needs-retry.s3", notice)
    else:
        if fs.session is None:
            import aiobotocore.session

            fs.session = aiobotocore.session.AioSession(**getattr(fs, "kwargs", {}))
            fs._session_is_owned = False  # s3fs would otherwise make a fresh session, without the hook, on refresh
        fs.session.register("needs-retry.s3", notice)
    fs._wikirag_retry_notice = True


@dataclass(frozen=True)
class Store:
    """A base URL plus the fsspec options needed to reach it.

    Options are explicit (never read from the environment here) so that the
    same object can be shipped to Dask workers, which do not share the
    client's environment.
    """

    url: str
    options: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials

    def __post_init__(self) -> None:
        # here, not on first use: a child's URL is joined to this one (s3:// with no bucket would become s3:/indexes)
        scheme, sep, rest = self.url.partition("://")
        if sep and scheme not in fsspec.available_protocols():
            raise StoreError(f"{self.url}: {scheme}:// is no storage protocol fsspec knows; give a folder, file:// "
                             "or s3://BUCKET/PREFIX")
        if scheme in ("s3", "s3a") and not rest.split("/", 1)[0]:
            raise StoreError(f"{self.url}: no bucket; give s3://BUCKET or s3://BUCKET/PREFIX")

    @cached_property
    def _fs_and_root(self) -> tuple[fsspec.AbstractFileSystem, str]:
        with translate_errors(self.url, "connecting"):
            fs, root = url_to_fs(self.url, **dict(self.options))
        if "retries" in (self.options.get("config_kwargs") or {}) and hasattr(fs, "retries"):
            # s3fs repeats timed-out and cut-short calls in a loop of its own (5 tries; a class attribute, not an
            # option) around botocore's retries: with botocore's retries set explicitly, s3fs gets one more try
            # only (a body read cut short, which botocore does not retry), so that the two loops do not multiply.
            fs.retries = min(fs.retries, S3FS_TRIES)
        watch_retries(fs, self.options)
        return fs, root.rstrip("/")

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        return self._fs_and_root[0]

    def __getstate__(self) -> dict[str, Any]:
        # The filesystem object is rebuilt on the worker rather than pickled.
        return {"url": self.url, "options": dict(self.options)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "url", state["url"])
        object.__setattr__(self, "options", state["options"])

    def child(self, *parts: str) -> Store:
        """The store rooted at ``url/parts``, with the same options."""
        return Store(join_url(self.url, *parts), self.options)

    def url_of(self, *parts: str) -> str:
        return join_url(self.url, *parts)

    def path_of(self, *parts: str) -> str:
        return join_url(self._fs_and_root[1], *parts) if parts else self._fs_and_root[1]

    # -- reading -----------------------------------------------------------
    def exists(self, *parts: str) -> bool:
        with translate_errors(self.url_of(*parts), "reading"):
            return self.fs.exists(self.path_of(*parts))

    def read_bytes(self, *parts: str) -> bytes:
        with translate_errors(self.url_of(*parts), "reading"):
            return self.fs.cat_file(self.path_of(*parts))

    def read_json(self, *parts: str) -> Any:
        """The parsed JSON file; a damaged one is one :class:`DamagedFileError` line naming it, never a traceback."""
        data = self.read_bytes(*parts)
        try:
            return json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problem = f"not UTF-8 text (byte {exc.start})"
        except json.JSONDecodeError as exc:
            problem = f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}; truncated?)"
        raise DamagedFileError(f"{self.url_of(*parts)}: {problem}; the file is damaged: delete it and rerun the "
                               "command that wrote it (finished work elsewhere is reused), or restore it from a backup")

    def list(self, *parts: str) -> list[str]:
        """Names (not paths) directly under ``parts``; empty when absent."""
        path = self.path_of(*parts)
        with translate_errors(self.url_of(*parts), "listing"):
            try:
                entries = self.fs.ls(path, detail=False, refresh=True)
            except FileNotFoundError:
                return []
        return sorted(posixpath.basename(e.rstrip("/")) for e in entries)

    def files(self, *parts: str) -> dict[str, tuple[int, float]]:
        """Every file under ``parts``, recursively: relative path -> (bytes, last modified, POSIX seconds).

        Empty when absent. Used by cleanup to size what it frees and to leave
        alone what a running job wrote recently (``*.tmp`` files of a local
        write in flight are listed too).
        """
        path = self.path_of(*parts)
        with translate_errors(self.url_of(*parts), "listing"):
            self.fs.invalidate_cache(path)
            try:
                found = self.fs.find(path, detail=True)
            except FileNotFoundError:
                return {}
        out = {}
        for name, info in found.items():
            if info.get("type") == "directory":
                continue
            modified = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or 0.0
            stamp = modified.timestamp() if hasattr(modified, "timestamp") else float(modified)
            out[name[len(path.rstrip("/")) + 1:]] = (int(info.get("size") or 0), stamp)
        return out

    # -- writing -----------------------------------------------------------
    def write_bytes(self, data: bytes, *parts: str) -> None:
        """Write a whole object so that readers see all of it or nothing.

        On S3 one PUT is atomic; on a local disk we write a sibling and rename.
        """
        path = self.path_of(*parts)
        with translate_errors(self.url_of(*parts), "writing"):
            if is_local(self.url):
                self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
                tmp = f"{path}.{uuid.uuid4().hex}.tmp"
                try:
                    self.fs.pipe_file(tmp, data)
                    self.fs.mv(tmp, path)
                except BaseException:
                    # A full disk leaves the partial sibling behind: take it away so as not to fill it further.
                    with contextlib.suppress(OSError):
                        self.fs.rm_file(tmp)
                    raise
            else:
                self.fs.pipe_file(path, data)

    def write_json(self, obj: Any, *parts: str) -> None:
        self.write_bytes(json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n", *parts)

    def remove(self, *parts: str) -> None:
        """Remove a file or a folder tree; absent is fine."""
        path = self.path_of(*parts)
        with translate_errors(self.url_of(*parts), "deleting"):
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)

    def move_tree(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        """Move a folder's files into ``dst`` with :meth:`copy_missing`, then remove ``src``: the source goes only
        once every file is at the destination, and nothing ``dst`` held is deleted first."""
        self.copy_missing(src, dst)
        self.remove(*src)

    def copy_missing(self, src: tuple[str, ...], dst: tuple[str, ...], names: Iterable[str] | None = None) -> list[str]:
        """Bring into ``dst`` each file of ``src`` (``names``: only these, relative to ``src``) that ``dst`` lacks;
        returns the names brought, sorted.

        Idempotent: a file ``dst`` already holds with the same size (and the same ETag on S3, the same bytes on a
        local disk) is kept as it is, so a retried move brings only what is missing and never deletes or empties
        ``dst``; a file there that differs (a leftover of another attempt, never published) is replaced. Each
        file arrives whole: a rename on a local disk, a server-side copy (one object) on S3; ``src`` keeps its
        copies (local: what was renamed is gone from it). Local writes in flight (``*.tmp``) are left behind.
        Afterwards every file is looked for at ``dst``: one :class:`StoreError` line names any missing.
        """
        src_path, dst_path = self.path_of(*src), self.path_of(*dst)
        local = is_local(self.url)
        with translate_errors(self.url_of(*dst), "publishing"):
            have, held = self._file_details(src_path), self._file_details(dst_path)
            wanted = sorted(n for n in have if not n.endswith(".tmp")) if names is None else sorted(set(names))
            for name in wanted:
                relative_path(name, self.url_of(*src, name))
            todo = [n for n in wanted if n in have and not self._same_file(src_path, dst_path, n, have[n], held.get(n))]
            if local:
                for name in todo:
                    os.makedirs(posixpath.dirname(f"{dst_path}/{name}"), exist_ok=True)
                    os.replace(f"{src_path}/{name}", f"{dst_path}/{name}")
            elif todo:
                self.fs.copy([f"{src_path}/{n}" for n in todo], [f"{dst_path}/{n}" for n in todo])
            arrived = self._file_details(dst_path)
        missing = [n for n in wanted if n not in arrived or (n in have and arrived[n]["size"] != have[n]["size"])]
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            raise StoreError(f"{self.url_of(*dst)}: {shown} did not arrive from {self.url_of(*src)}; rerun (the "
                             "move brings only what is missing)")
        return todo

    def _file_details(self, path: str) -> dict[str, dict[str, Any]]:
        """fsspec's details (``size``, and ``ETag`` on S3) of every file under ``path``, by relative name."""
        self.fs.invalidate_cache(path)
        try:
            found = self.fs.find(path, detail=True)
        except FileNotFoundError:
            return {}
        return {name[len(path) + 1:]: info for name, info in found.items() if info.get("type") != "directory"}

    def _same_file(self, src_path: str, dst_path: str, name: str, have: dict[str, Any],
                   held: dict[str, Any] | None) -> bool:
        if held is None or held.get("size") != have.get("size"):
            return False
        if is_local(self.url):
            import filecmp

            return filecmp.cmp(f"{src_path}/{name}", f"{dst_path}/{name}", shallow=False)
        # A server-side copy keeps the ETag (the MD5 of a one-part object): equal ETags, equal bytes.
        return not (have.get("ETag") and held.get("ETag")) or have["ETag"] == held["ETag"]

    def check_writable(self) -> None:
        """Fail fast, before any work, when the store refuses writes or is down."""
        path = self.path_of("_probe", f"{uuid.uuid4().hex}.txt")
        with translate_errors(self.url, "writing"):
            if is_local(self.url):
                self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.fs.pipe_file(path, b"ok")
            ok = self.fs.cat_file(path) == b"ok"
            self.fs.rm(path)
        if not ok:
            raise StoreError(f"{self.url}: a probe write did not read back; the store is inconsistent")
