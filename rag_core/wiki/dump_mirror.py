"""A dated dump copied from the dump site to a store, verified, so that ingest parses the copy and never the site.

Layout under ``<store>/dumps/``::

    _staging/<wiki>/<date>/<file>/piece-000003    bytes [3 * piece_bytes, 4 * piece_bytes) of <file>; whole or absent
    <wiki>/<date>/<file>                           written only once the pieces, read in order, match the published sha1
    <wiki>/<date>/mirror.json                      written last: the mirror exists once it does

Pieces come by range requests, ``connections`` at a time; each is written whole (one PUT, or a rename on a local
disk), so a run that dies keeps what it finished and a rerun asks only for the rest. A sum that does not match
leaves nothing at the file's key, and takes its pieces away too: they are the wrong bytes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from rag_core.storage import Store, is_local, translate_errors
from rag_core.wiki.dump_http import DumpSiteClient, DumpSiteError
from rag_core.wiki.dump_site import DatedDump, DumpSiteConfig, SiteFile, published_sha1
from rag_core.wiki.ingest import IngestConfig

DUMPS_DIR = "dumps"
STAGING_DIR = "_staging"
RECORD = "mirror.json"
READ_BYTES = 8 << 20


class ChecksumMismatchError(DumpSiteError):
    """A file's bytes do not hash to the sha1 published (or recorded) for them; nothing of it was kept."""


@dataclass(frozen=True, slots=True)
class MirroredDump:
    """A verified copy of a dated dump on the store: what ingest reads."""

    wiki: str
    date: str
    dump_url: str
    index_url: str
    record: dict[str, Any]  # mirror.json as written

    @property
    def dump_id(self) -> str:
        return f"{self.wiki}-{self.date}"

    def ingest_config(self, base: IngestConfig | None = None) -> IngestConfig:
        """``base``'s settings (default: IngestConfig's) reading this mirror's dump and index."""
        settings = base.model_dump(exclude={"dump", "index"}) if base is not None else {}
        return IngestConfig(dump=self.dump_url, index=self.index_url, **settings)


def mirror_folder(store: Store, wiki: str, date: str) -> Store:
    return store.child(DUMPS_DIR, wiki, date)


def find_mirror(store: Store, wiki: str, date: str) -> MirroredDump | None:
    """The mirror of ``<wiki>-<date>`` when one was completed (its mirror.json exists); else None."""
    folder = mirror_folder(store, wiki, date)
    if not folder.exists(RECORD):
        return None
    record = folder.read_json(RECORD)
    try:
        return MirroredDump(wiki, date, folder.url_of(record["dump"]), folder.url_of(record["index"]), record)
    except (KeyError, TypeError) as exc:
        raise DumpSiteError(f"{folder.url_of(RECORD)}: not a mirror record ({exc}); delete {folder.url} and mirror "
                            "again") from None


def verify_mirror(store: Store, mirror: MirroredDump) -> None:
    """Hash each mirrored file against the sha1 its record holds; a difference is a :class:`ChecksumMismatchError`
    (the copy was changed after it was verified)."""
    folder = mirror_folder(store, mirror.wiki, mirror.date)
    for name, entry in sorted(mirror.record["files"].items()):
        sha1, size = _sha1_of(folder, name)
        if (sha1, size) != (entry["sha1"], entry["size"]):
            raise ChecksumMismatchError(
                f"{folder.url_of(name)}: sha1 {sha1} ({size:,} bytes) differs from the {entry['sha1']} "
                f"({entry['size']:,} bytes) recorded when it was mirrored; the copy was changed: delete "
                f"{folder.url} and mirror again"
            )


def mirror_dump(config: DumpSiteConfig, dated: DatedDump, store: Store, client: DumpSiteClient | None = None,
                on_piece: Callable[[str, int, int], None] | None = None) -> MirroredDump:
    """Copy ``dated``'s index and dump to ``<store>/dumps/<wiki>/<date>/``, each checked against its published sha1,
    then write mirror.json; returns the mirror (an existing one as it is: :func:`verify_mirror` re-hashes it).

    ``on_piece(file name, pieces done, pieces in all)`` is called as pieces arrive (a progress line)."""
    existing = find_mirror(store, dated.wiki, dated.date)
    if existing is not None:
        return existing
    client = client or config.client()
    sums = published_sha1(config, client, dated)
    folder = mirror_folder(store, dated.wiki, dated.date)
    for file in dated.files:
        mirror_file(config, client, dated, file, sums[file.name], store, on_piece)
    record = {
        "dump_id": dated.dump_id,
        "dump": dated.dump.name,
        "index": dated.index.name,
        "site": config.site,
        "files": {f.name: {"sha1": sums[f.name], "size": f.size, "source": f.url} for f in dated.files},
        "mirrored_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    folder.write_json(record, RECORD)
    store.remove(DUMPS_DIR, STAGING_DIR, dated.wiki, dated.date)
    return MirroredDump(dated.wiki, dated.date, folder.url_of(dated.dump.name), folder.url_of(dated.index.name), record)


def piece_bounds(size: int, piece_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each piece of a file of ``size`` bytes."""
    return [(start, min(start + piece_bytes, size)) for start in range(0, size, piece_bytes)]


def piece_name(number: int) -> str:
    return f"piece-{number:06d}"


def mirror_file(config: DumpSiteConfig, client: DumpSiteClient, dated: DatedDump, file: SiteFile, sha1: str,
                store: Store, on_piece: Callable[[str, int, int], None] | None = None) -> None:
    """Bring ``file`` of ``dated`` to its mirror folder: the pieces the staging lacks, then the whole file, verified,
    in one write."""
    folder = mirror_folder(store, dated.wiki, dated.date)
    if folder.exists(file.name):
        if _sha1_of(folder, file.name) == (sha1, file.size):
            return  # verified and written by a run that stopped before mirror.json
        folder.remove(file.name)
    staging = store.child(DUMPS_DIR, STAGING_DIR, dated.wiki, dated.date, file.name)
    pieces = piece_bounds(file.size, config.piece_bytes)
    held = staging.files()
    todo = [k for k, (start, end) in enumerate(pieces) if held.get(piece_name(k), (-1, 0))[0] != end - start]
    done = len(pieces) - len(todo)

    def fetch(k: int) -> None:
        start, end = pieces[k]
        staging.write_bytes(client.get(file.url, start, end), piece_name(k))

    with ThreadPoolExecutor(max_workers=config.connections, thread_name_prefix="dump-piece") as pool:
        futures = {pool.submit(fetch, k) for k in todo}
        try:
            while futures:
                finished, futures = wait(futures, return_when=FIRST_EXCEPTION)
                for future in finished:
                    future.result()  # the first failure stops the run; finished pieces stay staged
                    done += 1
                    if on_piece is not None:
                        on_piece(file.name, done, len(pieces))
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    _assemble_verified(staging, len(pieces), file, sha1, folder)
    staging.remove()


def _assemble_verified(staging: Store, n_pieces: int, file: SiteFile, sha1: str, folder: Store) -> None:
    """Write the pieces, in order, to ``folder/<name>`` while hashing them; kept only when the sha1 matches."""
    digest, size = hashlib.sha1(), 0
    with _uncommitted_write(folder, file.name) as (out, keep):
        for k in range(n_pieces):
            data = staging.read_bytes(piece_name(k))
            digest.update(data)
            size += len(data)
            out.write(data)
        if (digest.hexdigest(), size) == (sha1, file.size):
            keep()
            return
    staging.remove()
    raise ChecksumMismatchError(
        f"{file.url}: sha1 {digest.hexdigest()} ({size:,} bytes) differs from the published {sha1} ({file.size:,} "
        f"bytes); nothing was kept at {folder.url_of(file.name)}: rerun to download it again, or wait for the dump "
        "site to fix the file"
    )


@contextlib.contextmanager
def _uncommitted_write(folder: Store, name: str) -> Iterator[tuple[Any, Callable[[], None]]]:
    """A file to write ``folder/name`` through that readers never see unless ``keep()`` was called before the block
    ends: a sibling renamed into place on a local disk, a multipart upload completed (else aborted) on S3."""
    path = folder.path_of(name)
    kept = False

    def keep() -> None:
        nonlocal kept
        kept = True

    with translate_errors(folder.url_of(name), "writing"):
        if is_local(folder.url):
            folder.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            try:
                with folder.fs.open(tmp, "wb") as out:
                    yield out, keep
                if kept:
                    folder.fs.mv(tmp, path)
            finally:
                if folder.fs.exists(tmp):
                    folder.fs.rm_file(tmp)
        else:
            out = folder.fs.open(path, "wb", autocommit=False)
            try:
                yield out, keep
                out.close()
                if kept:
                    out.commit()
                else:
                    out.discard()
            except BaseException:
                with contextlib.suppress(Exception):
                    out.discard()
                raise


def _sha1_of(folder: Store, name: str) -> tuple[str, int]:
    digest, size = hashlib.sha1(), 0
    with translate_errors(folder.url_of(name), "reading"), folder.fs.open(folder.path_of(name), "rb") as f:
        while chunk := f.read(READ_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
