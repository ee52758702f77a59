"""A Wikimedia-style dump site: which dated dump is the newest complete one, and whether it is newer than ours.

The layout (https://dumps.wikimedia.org and its mirrors)::

    <site>/<wiki>/                                   a listing with one link per dated run: 20261101/, 20261120/
    <site>/<wiki>/<date>/dumpstatus.json             {"jobs": {job: {"status", "files": {name: {size, url, sha1}}}}}
    <site>/<wiki>/<date>/<wiki>-<date>-sha1sums.txt  "<sha1>  <name>" per file
    <site>/<wiki>/<date>/<wiki>-<date>-pages-articles-multistream.xml.bz2
    <site>/<wiki>/<date>/<wiki>-<date>-pages-articles-multistream-index.txt.bz2

``latest/`` moves under a reader's feet and says nothing of completeness, so it is never read: a run resolves the
newest dated run whose multistream job is ``done``. The dates are compared with the one behind the published
index (:func:`dump_date_of` its dump's URL): when no dated run is newer, the check has cost one request, the listing.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from rag_core.storage import Store
from rag_core.wiki.dump_http import DumpSiteClient, DumpSiteError, DumpSiteNotFoundError, HttpPolicy
from rag_core.wiki.ingest import PASSAGES_DIR, published_manifest

# Large wikis write the multistream dump in parts, then recombine them into the one file (and index) named here.
MULTISTREAM_JOBS = ("articlesmultistreamdumprecombine", "articlesmultistreamdump")
DUMP_SUFFIX = "pages-articles-multistream.xml.bz2"
INDEX_SUFFIX = "pages-articles-multistream-index.txt.bz2"
_DATE_LINK = re.compile(r"""href=["']?(?:\./)?(\d{8})/?["'>\s]""")
_SHA1 = re.compile(r"[0-9a-f]{40}")


class DumpSiteConfig(BaseModel):
    """Which dump site and wiki to follow, and how politely; also the dump flow's parameter."""

    site: str = Field("https://dumps.wikimedia.org", pattern=r"^https?://[^/?#]+(/[^?#]*)?$",
                      description="the dump site's root URL, http(s) (or a mirror of it)")
    wiki: str = Field("enwiki", pattern=r"^[a-z0-9_]+$", description="the wiki's database name, e.g. enwiki")
    connections: int = Field(2, ge=1, le=8, description="connections at once; Wikimedia allows each client few")
    piece_bytes: int = Field(32 << 20, ge=4096, description="bytes per range request; a rerun keeps finished pieces")
    tries: int = Field(5, ge=1, description="attempts per request; 429 and 5xx wait as Retry-After asks")
    backoff_s: float = Field(2.0, ge=0, description="first wait when the site names none; doubles per try")
    max_wait_s: float = Field(300.0, ge=0, description="a longer Retry-After ends the run instead of waiting")
    timeout_s: float = Field(60.0, gt=0, description="longest wait for the site's next bytes")

    def policy(self) -> HttpPolicy:
        return HttpPolicy(tries=self.tries, backoff_s=self.backoff_s, max_wait_s=self.max_wait_s,
                          timeout_s=self.timeout_s)

    def client(self) -> DumpSiteClient:
        return DumpSiteClient(self.policy())

    def url(self, *parts: str) -> str:
        return "/".join([self.site.rstrip("/"), self.wiki, *parts])


@dataclass(frozen=True, slots=True)
class SiteFile:
    """One file of a dated dump as its dumpstatus.json lists it."""

    name: str
    url: str  # absolute, on the dump site
    size: int
    sha1: str | None  # some mirrors leave the sums out of dumpstatus.json; the sums file has them


@dataclass(frozen=True, slots=True)
class DatedDump:
    """A complete dated run's multistream dump and its index."""

    wiki: str
    date: str
    dump: SiteFile
    index: SiteFile

    @property
    def dump_id(self) -> str:
        return f"{self.wiki}-{self.date}"

    @property
    def files(self) -> tuple[SiteFile, SiteFile]:
        return (self.index, self.dump)


@dataclass(frozen=True, slots=True)
class DumpCheck:
    """What the site offers against the dump behind the published index."""

    wiki: str
    current: str | None  # the date behind LATEST; None when unknown (nothing published, or not a dated dump)
    newer: DatedDump | None  # the newest complete run after ``current``; None: nothing new to mirror
    in_progress: tuple[str, ...]  # newer runs whose multistream job is not done yet
    requests: int

    def as_dict(self) -> dict[str, Any]:
        newer = self.newer
        return {"wiki": self.wiki, "current": self.current, "in_progress": list(self.in_progress),
                "requests": self.requests, "newer": None if newer is None else {
                    "dump_id": newer.dump_id, "dump": newer.dump.url, "index": newer.index.url,
                    "bytes": newer.dump.size + newer.index.size}}

    def describe(self) -> str:
        have = f"{self.wiki}-{self.current}" if self.current else "no dated dump"
        waiting = f"; still running: {', '.join(self.in_progress)}" if self.in_progress else ""
        if self.newer is None:
            return (f"unchanged: the index is built from {have}, no newer complete dump{waiting} "
                    f"({self.requests} request(s))")
        size = self.newer.dump.size + self.newer.index.size
        return (f"newer: {self.newer.dump_id} is complete ({size / 1e6:,.1f} MB to mirror), the index is built from "
                f"{have}{waiting} ({self.requests} request(s))")


def dump_date_of(url: str, wiki: str) -> str | None:
    """The date of a dated multistream dump of ``wiki`` named by ``url`` (the site's or a mirror's); else None."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    match = re.fullmatch(rf"{re.escape(wiki)}-(\d{{8}})-{re.escape(DUMP_SUFFIX)}", name)
    return match[1] if match else None


def dump_date_behind_latest(store: Store, wiki: str) -> str | None:
    """The date of the dated ``wiki`` dump the LATEST index was built from (its manifest records the dump's URL);
    None when nothing is published or its dump is not a dated one of that wiki (a local file, a ``latest`` URL):
    any complete dump is then newer."""
    from rag_core.index.versions import latest_version, read_index_manifest  # faiss: only where an index is read

    if latest_version(store) is None:
        return None
    url = (read_index_manifest(store).dump or {}).get("url")
    return dump_date_of(url, wiki) if isinstance(url, str) else None


def dump_date_ingested(store: Store, wiki: str, content_key: dict[str, Any]) -> str | None:
    """The newest date of a dated ``wiki`` dump whose passages, cut with the settings of ``content_key``
    (``IngestConfig.content_key``), are published on ``store``; None when there is none (any complete dump is then
    newer). A dated dump is the same bytes wherever it was read from: the mirror or the site's dated URL."""
    dates = []
    for dump_id in store.list(PASSAGES_DIR):
        manifest = None if dump_id.startswith("_") else published_manifest(store, dump_id)
        if manifest is None or manifest.get("content_key") != content_key:
            continue
        url = (manifest.get("dump") or {}).get("url")
        if isinstance(url, str) and (date := dump_date_of(url, wiki)) is not None:
            dates.append(date)
    return max(dates, default=None)


def list_dates(config: DumpSiteConfig, client: DumpSiteClient) -> list[str]:
    """The dated runs the site lists for the wiki, newest first."""
    listing = client.get(config.url("")).decode("utf-8", errors="replace")
    dates = sorted(set(_DATE_LINK.findall(listing)), reverse=True)
    if not dates:
        raise DumpSiteError(f"{config.url('')}: the listing links no dated dumps (YYYYMMDD/); check the site URL "
                            f"and the wiki name {config.wiki!r}")
    return dates


def read_status(config: DumpSiteConfig, client: DumpSiteClient, date: str) -> DatedDump | None:
    """The dated run's multistream dump and index when its dumpstatus.json says the job is done; else None."""
    url = config.url(date, "dumpstatus.json")
    try:
        status = json.loads(client.get(url).decode("utf-8"))
        jobs = status["jobs"]
    except DumpSiteNotFoundError:
        return None  # a run just started has no status yet
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DumpSiteError(f"{url}: not a dump status ({type(exc).__name__}: {exc}); the site is not a Wikimedia "
                            "dump site, or the file was cut short: run the check again") from None
    names = {suffix: f"{config.wiki}-{date}-{suffix}" for suffix in (DUMP_SUFFIX, INDEX_SUFFIX)}
    found: dict[str, SiteFile] = {}
    for job_name in MULTISTREAM_JOBS:
        job = jobs.get(job_name) if isinstance(jobs, dict) else None
        if not isinstance(job, dict) or not isinstance(job.get("files"), dict):
            continue
        listed = {suffix: job["files"].get(name) for suffix, name in names.items()}
        if any(entry is None for entry in listed.values()):
            continue
        if job.get("status") != "done":
            return None
        for suffix, entry in listed.items():
            found[suffix] = _site_file(config, url, names[suffix], entry)
        break
    if not found:
        return None
    return DatedDump(config.wiki, date, found[DUMP_SUFFIX], found[INDEX_SUFFIX])


def check_site(config: DumpSiteConfig, current: str | None, client: DumpSiteClient | None = None) -> DumpCheck:
    """The newest complete dated run after ``current`` (a date, or None for any); one request when none is newer."""
    client = client or config.client()
    in_progress: list[str] = []
    for date in list_dates(config, client):
        if current is not None and date <= current:
            break
        dated = read_status(config, client, date)
        if dated is not None:
            return DumpCheck(config.wiki, current, dated, tuple(in_progress), client.requests)
        in_progress.append(date)
    return DumpCheck(config.wiki, current, None, tuple(in_progress), client.requests)


def published_sha1(config: DumpSiteConfig, client: DumpSiteClient, dated: DatedDump) -> dict[str, str]:
    """The sha1 of each file of ``dated``, from the run's sums file where it lists one, else its dumpstatus.json.

    The two are the site's own records of the same bytes: when both give a sum and they differ, the run is refused
    (one :class:`DumpSiteError` line) rather than verified against either."""
    url = config.url(dated.date, f"{config.wiki}-{dated.date}-sha1sums.txt")
    try:
        text = client.get(url).decode("utf-8", errors="replace")
    except DumpSiteNotFoundError:
        text = ""  # the sums in dumpstatus.json stand alone
    listed: dict[str, str] = {}
    for line in text.splitlines():
        sha1, _, name = line.strip().partition(" ")
        if _SHA1.fullmatch(sha1.lower()):
            listed[name.strip().lstrip("*")] = sha1.lower()
    sums: dict[str, str] = {}
    for file in dated.files:
        from_list, from_status = listed.get(file.name), file.sha1
        if from_list and from_status and from_list != from_status:
            raise DumpSiteError(f"{url}: sha1 of {file.name} is {from_list}, its dumpstatus.json says {from_status}; "
                                "the site's sums disagree, wait for the site to fix them and rerun")
        if not (from_list or from_status):
            raise DumpSiteError(f"{url}: no published sha1 for {file.name} (nor in dumpstatus.json); a mirror is only "
                                "kept when its sum matches: use a site that publishes sums")
        sums[file.name] = from_list or from_status  # type: ignore[assignment]
    return sums


def _site_file(config: DumpSiteConfig, status_url: str, name: str, entry: object) -> SiteFile:
    if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or not isinstance(entry.get("url"), str):
        raise DumpSiteError(f"{status_url}: the entry of {name} has no size or url; the status file is damaged")
    url = urllib.parse.urljoin(config.site.rstrip("/") + "/", entry["url"])
    site = urllib.parse.urlsplit(config.site)
    where = urllib.parse.urlsplit(url)
    if (where.scheme, where.netloc) != (site.scheme, site.netloc) or not where.path.endswith(f"/{name}"):
        raise DumpSiteError(f"{status_url}: {name} is said to be at {url}, not on {config.site} under its own name; "
                            "files are only mirrored from the site asked for")
    sha1 = entry.get("sha1")
    sha1 = sha1.lower() if isinstance(sha1, str) and _SHA1.fullmatch(sha1.lower()) else None
    return SiteFile(name, url, entry["size"], sha1)
