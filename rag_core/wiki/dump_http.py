"""HTTP GETs to a dump site, politely: a bounded wait per read, retries with back-off on 429 and 5xx that honour
Retry-After, and byte ranges checked against what the server says it sent.

Wikimedia's dump servers limit the connections of each client and answer 503 (or 429) with Retry-After when busy;
a client that retries at once, or from many workers, is throttled harder. The standard library's ``urllib`` is
enough here: one request per call, no session state to share between threads.
"""

from __future__ import annotations

import email.utils
import http.client
import logging
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from rag_core.errors import DumpError
from rag_core.storage import StoreUnreachableError

log = logging.getLogger("wikirag.dumps")
USER_AGENT = "wikirag-dump-mirror/0.1 (https://github.com/wikirag; dump mirror for a retrieval index)"
_RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class DumpSiteError(DumpError):
    """The dump site answered with what a run cannot use: a missing file, a bad listing, a longer wait than allowed."""


class DumpSiteNotFoundError(DumpSiteError):
    """The dump site has no file at the URL (HTTP 404)."""


class DumpSiteUnavailableError(StoreUnreachableError):
    """The dump site did not answer, or stayed busy (429/5xx), through every try: a transport error, rerun later."""


@dataclass(frozen=True)
class HttpPolicy:
    """How hard to press a dump site."""

    tries: int = 5  # attempts per request, the first included
    backoff_s: float = 2.0  # wait before the second attempt when the server names none; doubles each time
    max_wait_s: float = 300.0  # a Retry-After longer than this ends the run (rerun later) rather than sleeping
    timeout_s: float = 60.0  # the longest wait for the server's next bytes


@dataclass
class DumpSiteClient:
    """GETs with retries; ``requests`` counts every request sent (a retry too), for the run's log."""

    policy: HttpPolicy = field(default_factory=HttpPolicy)
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """The body of ``url``, or bytes ``[start, end)`` of it; a 404 is a :class:`DumpSiteError`, a site that
        stays busy or unreachable through every try a :class:`DumpSiteUnavailableError`."""
        headers = {"User-Agent": USER_AGENT}
        if start is not None and end is not None:
            headers["Range"] = f"bytes={start}-{end - 1}"
        problem = ""
        for attempt in range(1, self.policy.tries + 1):
            with self._lock:
                self.requests += 1
            wait = self.policy.backoff_s * 2 ** (attempt - 1)
            try:
                with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                            timeout=self.policy.timeout_s) as response:
                    body = response.read()
                    return _checked_range(url, body, response.status, response.headers.get("Content-Range"), start, end)
            except urllib.error.HTTPError as exc:
                if exc.code not in _RETRIED_STATUS:
                    raise _refusal(url, exc) from None
                problem = f"HTTP {exc.code}"
                asked = retry_after_s(exc.headers.get("Retry-After"))
                if asked is not None:
                    if asked > self.policy.max_wait_s:  # not retried by the caller either: it asked us to wait
                        raise DumpSiteError(
                            f"{url}: the dump site answered {problem} and asks to wait {asked:.0f} s, longer than "
                            f"max_wait_s ({self.policy.max_wait_s:g} s); rerun later (a mirror keeps the pieces it has)"
                        ) from None
                    wait = asked
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                # Refused, reset, timed out, or a body cut short (IncompleteRead): the next attempt may get through.
                cause = getattr(exc, "reason", None) or exc
                problem = "gaierror" if isinstance(cause, socket.gaierror) else type(cause).__name__
            if attempt < self.policy.tries:
                pause = min(wait, self.policy.max_wait_s)
                log.warning("%s: %s; try %d of %d in %.1f s", url, problem, attempt + 1, self.policy.tries, pause)
                time.sleep(pause)
        if problem == "gaierror":  # the name did not resolve: the network or the URL, not the site's load
            raise DumpSiteUnavailableError(
                f"{url}: the host name does not resolve (gaierror) through {self.policy.tries} tries; check this "
                "machine's network and DNS, or the dump site's URL"
            )
        if problem == "ConnectionRefusedError":  # nothing listens there: a wrong --site as often as a site down
            raise DumpSiteUnavailableError(
                f"{url}: connection refused through {self.policy.tries} tries; check the dump site's URL, or "
                "rerun later if it is down (a mirror keeps the pieces it has)"
            )
        raise DumpSiteUnavailableError(
            f"{url}: {problem} through {self.policy.tries} tries; the dump site is busy or down, rerun later "
            "(a mirror keeps the pieces it has)"
        )


def retry_after_s(value: str | None) -> float | None:
    """Seconds a Retry-After header asks for (a number or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _refusal(url: str, exc: urllib.error.HTTPError) -> DumpSiteError:
    if exc.code == 404:
        return DumpSiteNotFoundError(f"{url}: not on the dump site (HTTP 404); check the site and wiki names, or "
                                     "the dump was removed: run the check again")
    if exc.code == 416:
        return DumpSiteError(f"{url}: the file is shorter than its dumpstatus.json says (HTTP 416); the dump was "
                             "replaced on the site: run the check again")
    return DumpSiteError(f"{url}: the dump site refused the request (HTTP {exc.code} {exc.reason})")


def _checked_range(url: str, body: bytes, status: int, content_range: str | None, start: int | None,
                   end: int | None) -> bytes:
    """``body`` when it is the bytes asked for; a server that ignored Range is refused unless it sent them all."""
    if start is None or end is None:
        return body
    if status == 206:
        match = _CONTENT_RANGE.fullmatch((content_range or "").strip())
        if match is None or (int(match[1]), int(match[2]) + 1) != (start, end) or len(body) != end - start:
            raise DumpSiteError(f"{url}: asked for bytes {start:,}-{end - 1:,}, the server sent "
                                f"{content_range or 'no Content-Range'} ({len(body):,} bytes); its range support is "
                                "broken, use another mirror of the dumps")
        return body
    if start == 0 and len(body) == end:
        return body  # the whole file was one piece
    raise DumpSiteError(f"{url}: the server ignores range requests (HTTP {status} to a Range); a resumable mirror "
                        "needs them, use another mirror of the dumps")
