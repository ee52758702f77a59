"""Which dump mirrors (rag_core.wiki.dump_mirror) a store still needs, and removing the rest.

A mirror is kept when it is one of the ``keep`` newest complete ones, or the dump behind LATEST (a rebuild of the
published version parses it). A complete mirror older than all of those is removed whole. Staged pieces
(``dumps/_staging/<wiki>/<date>/``) are kept only for a date newer than every complete mirror: a copy still in
flight, which a rerun resumes; a date that is complete, or older (the check never mirrors it again), leaves them
behind as garbage. A dated folder without ``mirror.json`` and newer than every complete mirror is a copy in
flight too, and kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rag_core.errors import WikiragError
from rag_core.storage import Store
from rag_core.wiki.dump_mirror import DUMPS_DIR, RECORD, STAGING_DIR
from rag_core.wiki.dump_site import dump_date_behind_latest

KEEP_MIRRORS = 1  # complete mirrors kept besides the one behind LATEST


class DumpRetentionError(WikiragError):
    """A retention setting that would remove what a store needs."""


@dataclass
class MirrorGarbage:
    """What :func:`mirror_garbage` found for one wiki: (parts under the store) to remove, and what stays."""

    wiki: str
    mirrors: list[str] = field(default_factory=list)  # dates of complete mirrors removed
    staging: list[str] = field(default_factory=list)  # dates whose staged pieces are removed
    kept: list[str] = field(default_factory=list)  # dates kept (complete or in flight)
    behind_latest: str | None = None

    def paths(self) -> list[tuple[str, ...]]:
        return [*((DUMPS_DIR, self.wiki, d) for d in self.mirrors),
                *((DUMPS_DIR, STAGING_DIR, self.wiki, d) for d in self.staging)]


def _dates(names: list[str]) -> list[str]:
    return sorted(n for n in names if len(n) == 8 and n.isdigit())


def mirror_garbage(store: Store, wiki: str, keep: int = KEEP_MIRRORS) -> MirrorGarbage:
    """The mirrors and staged pieces of ``wiki`` on ``store`` that nothing needs (module docstring)."""
    if keep < 1:
        raise DumpRetentionError(f"keep={keep}: keep at least the newest complete mirror (keep >= 1)")
    out = MirrorGarbage(wiki, behind_latest=dump_date_behind_latest(store, wiki))
    dated = _dates(store.list(DUMPS_DIR, wiki))
    complete = [d for d in dated if store.exists(DUMPS_DIR, wiki, d, RECORD)]
    newest = complete[-1] if complete else None
    wanted = set(complete[-keep:]) | ({out.behind_latest} if out.behind_latest else set())
    for date in dated:  # an incomplete folder older than a complete mirror holds a failed copy's leftovers
        in_flight = date not in complete and (newest is None or date > newest)
        (out.kept if date in wanted or in_flight else out.mirrors).append(date)
    for date in _dates(store.list(DUMPS_DIR, STAGING_DIR, wiki)):
        if newest is not None and date <= newest:
            out.staging.append(date)
    return out


def remove_mirror_garbage(store: Store, garbage: MirrorGarbage) -> None:
    """Remove what :func:`mirror_garbage` found: staged pieces first, then whole mirrors, each record first, so
    that a folder caught half-removed is no longer a mirror anyone reads."""
    for date in garbage.staging:
        store.remove(DUMPS_DIR, STAGING_DIR, garbage.wiki, date)
    for date in garbage.mirrors:
        store.remove(DUMPS_DIR, garbage.wiki, date, RECORD)
        store.remove(DUMPS_DIR, garbage.wiki, date)
