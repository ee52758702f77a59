"""The names of index versions and of the files beside them: what every module of the index's store layout shares.

Versions are ``20261130T114501.123Z-1a2b3c4d`` (UTC time to the millisecond,
then random hex): they sort by creation time and do not collide.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets

from rag_core.errors import WikiragError

INDEXES_DIR = "indexes"
LATEST = "LATEST"
PLAN = "plan.json"
PINS_DIR = "pins"
_VERSION_NAME = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]*$")
_VERSION_TIME = re.compile(r"^(\d{8}T\d{6})\.(\d{3})Z-[0-9a-f]+$")


class IndexVersionError(WikiragError):
    """An index version is missing, misnamed, held, or cannot be published or deleted."""


def new_version_id(now: dt.datetime | None = None) -> str:
    """``YYYYMMDDTHHMMSS.mmmZ-xxxxxxxx``: sorts by UTC creation time (to the millisecond); the hex keeps it unique."""
    now = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    return f"{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{secrets.token_hex(4)}"


def version_created_at(version: str) -> dt.datetime | None:
    """The UTC time a :func:`new_version_id` name carries; None for a name of another shape."""
    match = _VERSION_TIME.match(version)
    if match is None:
        return None
    stamp = dt.datetime.strptime(match.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC)
    return stamp + dt.timedelta(milliseconds=int(match.group(2)))


def is_version_name(name: str) -> bool:
    """Whether ``name`` can name a version folder (LATEST, a lock or a leftover file cannot)."""
    return bool(_VERSION_NAME.match(name)) and name != LATEST


def check_name(version: str) -> str:
    """``version`` when it can name a version folder, else a clear error."""
    if not isinstance(version, str) or not is_version_name(version):
        raise IndexVersionError(f"{version!r} is not an index version name (e.g. 20261130T114501.123Z-1a2b3c4d)")
    return version
