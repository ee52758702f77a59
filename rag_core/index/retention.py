"""What keeps index files alive: pins, references between versions, delete and garbage collection.

- A **pin** (``indexes/<version>/pins/<name>.json``, one object per holder) keeps
  a version from being deleted; so does LATEST. A registered model pins the
  version it was trained against.
- A file is **referenced** when a published version's manifest names it: its
  own shard files, and the embedding files its vectors came from (shared by
  every version built from the same vectors).
- :func:`delete_version` removes a version and the files no remaining version
  references; :func:`collect_garbage` removes what killed runs left: unpublished
  version folders, unreferenced embedding files and staged passage parts, once
  nothing has written to them for ``older_than_hours`` (at least
  :data:`MIN_AGE_HOURS` unless ``ignore_min_age``).
- A live **build lease** (:mod:`rag_core.leases`) keeps what it protects from
  both, however old its files: a resumed build's embedding ranges, the version
  folder it writes, an ingest's staged parts.
"""

from __future__ import annotations

import datetime as dt
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from rag_core.index.embedding_files import EMBEDDINGS_DIR, record_files
from rag_core.index.latest import move_latest
from rag_core.index.manifest import MANIFEST, ManifestError
from rag_core.index.version_names import INDEXES_DIR, LATEST, PINS_DIR, PLAN, IndexVersionError, check_name
from rag_core.index.versions import latest_version, list_versions, read_index_manifest
from rag_core.leases import LeaseRecord, holding_lease, live_leases
from rag_core.storage import Store, relative_path
from rag_core.wiki.ingest import PASSAGES_DIR, STAGING_DIR


# Below this, gc could take the files of a build that is only pausing (a worker restarting, a resumed build that
# has not planned yet): leases protect the builds that hold one; this floor protects the rest.
MIN_AGE_HOURS = 1.0


class CleanupConfig(BaseModel):
    """How ``gc`` decides that a leftover is abandoned."""

    older_than_hours: float = Field(24.0, ge=0, description="collect only what nothing wrote to for this many "
                                    f"hours (at least {MIN_AGE_HOURS:g} unless ignore_min_age)")
    ignore_min_age: bool = Field(False, description=f"allow older_than_hours below {MIN_AGE_HOURS:g} (live build "
                                 "leases are honoured still)")

    def check_min_age(self) -> None:
        """Refuse, in one line, an age below :data:`MIN_AGE_HOURS` that was not asked for explicitly."""
        if self.older_than_hours < MIN_AGE_HOURS and not self.ignore_min_age:
            raise IndexVersionError(
                f"gc --older-than {self.older_than_hours:g}: below the minimum of {MIN_AGE_HOURS:g} hour, gc could "
                f"take the files of a build that is only pausing; give --older-than {MIN_AGE_HOURS:g} or more, or "
                "add --ignore-min-age (ignore_min_age=True) to collect younger leftovers (live leases still hold)")


@dataclass
class Removed:
    """What a delete or a cleanup removed, and what it left in place and why."""

    files: dict[str, int] = field(default_factory=dict)  # store-relative path -> bytes
    kept: list[str] = field(default_factory=list)  # shared files left because other versions read them
    notes: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(self.files.values())


# -- pins -------------------------------------------------------------------------
def _pin_file(name: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise IndexVersionError(f"pin name {name!r}: give a name of 1 to 200 characters (e.g. a registered model)")
    return urllib.parse.quote(name, safe="-_.@+") + ".json"


def pin_version(store: Store, version: str, by: str, *, note: str | None = None) -> None:
    """Record that ``by`` relies on ``version``: it cannot be deleted until every holder unpins it.

    One object per holder, so concurrent pinners never overwrite each other;
    pinning twice by one name is one pin. The version is checked again after
    the pin is written, so no pin survives on a version a concurrent delete removed.
    """
    root = store.child(INDEXES_DIR, check_name(version))
    name = _pin_file(by)
    if not root.exists(MANIFEST):
        raise IndexVersionError(f"{root.url}: index version {version} is not published; pin a published version")
    root.write_json({"by": by, "at": dt.datetime.now(dt.UTC).isoformat(), "note": note}, PINS_DIR, name)
    if not root.exists(MANIFEST):
        root.remove(PINS_DIR, name)
        raise IndexVersionError(f"{root.url}: index version {version} was deleted while it was being pinned")


def unpin_version(store: Store, version: str, by: str) -> None:
    """Remove ``by``'s pin on ``version``; a pin that is not there is an error naming the pins that are."""
    root = store.child(INDEXES_DIR, check_name(version))
    name = _pin_file(by)
    if not root.exists(PINS_DIR, name):
        held = ", ".join(repr(p) for p in version_pins(store, version)) or "none"
        raise IndexVersionError(f"{root.url}: {by!r} holds no pin on {version}; its pins: {held}")
    root.remove(PINS_DIR, name)


def version_pins(store: Store, version: str) -> list[str]:
    """The names holding pins on ``version``, sorted."""
    names = store.child(INDEXES_DIR, check_name(version), PINS_DIR).list()
    return sorted(urllib.parse.unquote(n.removesuffix(".json")) for n in names if n.endswith(".json"))


def holders(store: Store, version: str) -> list[str]:
    """Who keeps ``version`` from being deleted: ``LATEST``, and ``pin 'NAME'`` for each pin."""
    pins = [f"pin {name!r}" for name in version_pins(store, version)]
    return (["LATEST"] if latest_version(store) == version else []) + pins


# -- references and delete -------------------------------------------------------------
def referenced_files(store: Store, *, besides: str | None = None) -> tuple[set[str], list[str]]:
    """(store-relative paths that published versions other than ``besides`` read, versions whose manifest is unreadable)."""
    files: set[str] = set()
    unreadable = []
    for version in list_versions(store):
        if version != besides:
            try:
                files.update(read_index_manifest(store, version).files())
            except ManifestError:
                unreadable.append(version)
    return files, unreadable


def remove_embedding_files(store: Store, paths: Iterable[str], removed: Removed) -> None:
    """Remove embedding data files, after the range records (JSON) that name them: no record may name a gap."""
    by_folder: dict[str, set[str]] = {}
    for path in paths:
        folder, _, name = path.rpartition("/")
        by_folder.setdefault(folder, set()).add(name)
    for folder, names in by_folder.items():
        root, sizes = store.child(folder), store.files(folder)
        for record in sorted({f"{n.split('.', 1)[0]}.json" for n in names} & set(sizes)):
            try:
                named = set(record_files(root.read_json(record)))
            except (ValueError, KeyError):  # a damaged record names nothing that can be read
                named = names
            if named & names or not named & set(sizes):
                root.remove(record)
                removed.files[f"{folder}/{record}"] = sizes[record][0]
        for name in sorted(names & set(sizes)):
            root.remove(name)
            removed.files[f"{folder}/{name}"] = sizes[name][0]


def delete_version(store: Store, version: str, *, force: bool = False) -> Removed:
    """Delete a version (or an unpublished leftover) and the files no other published version references.

    Refused while the version is pinned, while another process's live build
    lease holds its folder, and while LATEST points at it unless ``force`` (LATEST then moves
    to the newest other version, or goes when none is left). The manifest goes
    first (the version vanishes at once), then its folder, then its embedding
    files that no remaining version references and no live lease protects. A
    pin that arrives meanwhile brings the manifest back.
    """
    indexes = store.child(INDEXES_DIR)
    folder = indexes.files(check_name(version))
    if not folder:
        available = ", ".join(list_versions(store)) or "none"
        raise IndexVersionError(f"{indexes.url}: index version {version} not found; available: {available}")
    leases = [lease for lease in live_leases(store) if not lease.held_here()]  # a build may remove its own leftovers
    if (lease := holding_lease(leases, f"{INDEXES_DIR}/{version}/")) is not None:
        raise IndexVersionError(f"{indexes.url}: refusing to delete {version}: a build is writing it ({lease.describe()}); "
                                "wait until it has finished, or until its lease expires if that run is gone")
    held = holders(store, version)
    if held and not (force and held == ["LATEST"]):
        fix = ("unpin it first (wikirag indexes unpin VERSION --by NAME)" if held != ["LATEST"]
               else "LATEST points at it: publish another version first or force the delete")
        raise IndexVersionError(f"{indexes.url}: refusing to delete {version}: held by {', '.join(held)}; {fix}")
    removed, own = Removed(), []
    if MANIFEST in folder:
        try:
            # checked again here: whatever a manifest names, a delete stays under embeddings/
            own = [relative_path(p, indexes.url_of(version, MANIFEST), under=EMBEDDINGS_DIR)
                   for e in read_index_manifest(store, version).shards if e.embeddings for p in e.embeddings.paths()]
        except ManifestError as exc:
            removed.notes.append(f"its embedding files are left for gc ({exc})")
        others, unreadable = referenced_files(store, besides=version)
        if unreadable:  # what they reference is unknown: keep every shared file rather than guess
            removed.notes.append(f"embedding files kept: unreadable manifests of {', '.join(unreadable)}")
            others.update(own)
        building = {f"{EMBEDDINGS_DIR}/{f}" for v in unpublished_versions(store) for f in planned_folders(store, v)}
        if busy := [p for p in own if p not in others and any(p.startswith(f) for f in building)]:
            removed.notes.append(f"{len(busy)} embedding files kept: a build in progress may use them (gc collects "
                                 "them once it is abandoned)")
            others.update(busy)
        if leased := _leased(leases, [p for p in own if p not in others]):
            removed.notes += [f"{len(paths)} embedding files kept: held by the {lease.describe()}"
                              for lease, paths in leased.items()]
            others.update(p for paths in leased.values() for p in paths)
        removed.kept, own = sorted(p for p in own if p in others), [p for p in own if p not in others]
        if held:  # forced: LATEST steps back first, so readers of LATEST never meet a missing version
            rest = [v for v in list_versions(store) if v != version]
            if rest:
                move_latest(store, rest[-1], allow_backwards=True)
            else:
                indexes.remove(LATEST)
        manifest_bytes = indexes.read_bytes(version, MANIFEST)
        indexes.remove(version, MANIFEST)
        if pins := version_pins(store, version):
            indexes.write_bytes(manifest_bytes, version, MANIFEST)
            raise IndexVersionError(f"{indexes.url}: refusing to delete {version}: pinned meanwhile by "
                                    f"{', '.join(map(repr, pins))}; unpin it first")
    indexes.remove(version)
    removed.files.update({f"{INDEXES_DIR}/{version}/{name}": size for name, (size, _) in folder.items()})
    remove_embedding_files(store, own, removed)
    return removed


# -- builds in progress and garbage collection -------------------------------------------
def planned_folders(store: Store, version: str) -> list[str]:
    """The embedding folders (``<fingerprint_id>/<dump_id>/``) an unpublished version's build writes or reads."""
    try:
        plan = store.child(INDEXES_DIR, version).read_json(PLAN)
        return [f"{plan['fingerprint_id']}/{d}/" for d in (plan["dump_id"], plan.get("reuse_from")) if d]
    except (FileNotFoundError, ValueError, KeyError, TypeError):  # no plan (or a damaged one): nothing to protect
        return []


def unpublished_versions(store: Store) -> list[str]:
    """Version folders without a manifest: builds in progress, or leftovers of killed ones."""
    indexes = store.child(INDEXES_DIR)
    return [n for n in indexes.list() if n != LATEST and not n.startswith("_") and not indexes.exists(n, MANIFEST)]


# -- garbage collection ----------------------------------------------------------------
def collect_garbage(store: Store, config: CleanupConfig | None = None, *, now: float | None = None) -> Removed:
    """Remove what killed or failed runs left, once nothing has written to it for ``config.older_than_hours``.

    - unpublished version folders (shard files written, no manifest);
    - embedding files no published version references (range records go with
      their files), except in the folders a live build works on;
    - staged passage parts of ingest runs (``passages/_staging/<dump_id>``).
    Published versions and the files they read are never touched, nor
    anything a live build lease protects (a note names its holder). When a
    manifest cannot be read, no embedding file is collected (its references
    are unknown) and a note says so. ``older_than_hours`` below
    :data:`MIN_AGE_HOURS` is refused (one line) unless ``ignore_min_age``.
    ``now`` moves the clock of the age rule only; leases live by the real clock.
    """
    config = config or CleanupConfig()
    config.check_min_age()
    cutoff = (time.time() if now is None else now) - config.older_than_hours * 3600
    removed = Removed()
    leases = live_leases(store)
    embeddings = store.files(EMBEDDINGS_DIR)  # "<fingerprint_id>/<dump_id>/<name>" -> (bytes, modified)

    def newest(files: dict[str, tuple[int, float]], prefix: str = "") -> float:
        return max((m for p, (_, m) in files.items() if p.startswith(prefix)), default=0.0)

    live: set[str] = set()  # embedding folders a running build reads or writes
    indexes = store.child(INDEXES_DIR)
    for name in unpublished_versions(store):
        files, folders = indexes.files(name), planned_folders(store, name)
        if (lease := holding_lease(leases, f"{INDEXES_DIR}/{name}/")) is not None:
            live.update(folders)
            removed.notes.append(f"kept {INDEXES_DIR}/{name}: held by the {lease.describe()}")
            continue
        if max([newest(files), *(newest(embeddings, f) for f in folders)]) > cutoff:
            live.update(folders)
            removed.notes.append(f"kept {INDEXES_DIR}/{name}: unpublished, but a build wrote to it recently")
            continue
        indexes.remove(name)
        removed.files.update({f"{INDEXES_DIR}/{name}/{p}": size for p, (size, _) in files.items()})

    refs, unreadable = referenced_files(store)
    if unreadable:
        removed.notes.append(f"no embedding file collected: the manifests of {', '.join(unreadable)} are unreadable")
    else:
        stale = [f"{EMBEDDINGS_DIR}/{p}" for p, (_, m) in embeddings.items()
                 if m <= cutoff and not p.endswith(".json") and not any(p.startswith(f) for f in live)]
        stale = [p for p in stale if p not in refs]
        leased = _leased(leases, stale)
        removed.notes += [f"kept {len(paths)} embedding files: held by the {lease.describe()}"
                          for lease, paths in leased.items()]
        kept = {p for paths in leased.values() for p in paths}
        remove_embedding_files(store, [p for p in stale if p not in kept], removed)
        _remove_dangling_records(store, embeddings, cutoff, live, removed, leases)

    staging = store.files(PASSAGES_DIR, STAGING_DIR)
    for dump_id in sorted({p.split("/", 1)[0] for p in staging}):
        if (lease := holding_lease(leases, f"{PASSAGES_DIR}/{STAGING_DIR}/{dump_id}/")) is not None:
            removed.notes.append(f"kept {PASSAGES_DIR}/{STAGING_DIR}/{dump_id}: held by the {lease.describe()}")
        elif newest(staging, f"{dump_id}/") <= cutoff:
            store.remove(PASSAGES_DIR, STAGING_DIR, dump_id)
            removed.files.update({f"{PASSAGES_DIR}/{STAGING_DIR}/{p}": size for p, (size, _) in staging.items()
                                  if p.startswith(f"{dump_id}/")})
    return removed


def _leased(leases: list[LeaseRecord], paths: list[str]) -> dict[LeaseRecord, list[str]]:
    """The store-relative ``paths`` that live leases protect, by the lease that protects them."""
    out: dict[LeaseRecord, list[str]] = {}
    for path in paths:
        if (lease := holding_lease(leases, path)) is not None:
            out.setdefault(lease, []).append(path)
    return out


def _remove_dangling_records(store: Store, embeddings: dict[str, tuple[int, float]], cutoff: float,
                             live: set[str], removed: Removed, leases: list[LeaseRecord]) -> None:
    """Range records whose data files are gone (a killed delete): the range must count as not done."""
    for path, (size, modified) in embeddings.items():
        if (not path.endswith(".json") or modified > cutoff or any(path.startswith(f) for f in live)
                or holding_lease(leases, f"{EMBEDDINGS_DIR}/{path}") is not None):
            continue
        folder, _, name = f"{EMBEDDINGS_DIR}/{path}".rpartition("/")
        if f"{folder}/{name}" in removed.files:
            continue
        try:
            named = record_files(store.child(folder).read_json(name))
        except FileNotFoundError:
            continue
        except (ValueError, KeyError):
            named = ()
        if not all(f"{folder.removeprefix(EMBEDDINGS_DIR + '/')}/{n}" in embeddings for n in named) or not named:
            store.child(folder).remove(name)
            removed.files[f"{folder}/{name}"] = size
