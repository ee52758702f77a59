"""A Wikimedia-layout dump site on loopback, with real multistream dumps, for the dump check and mirror tests.

``enwiki`` has two complete dated runs (20261101, 20261120: three articles edited, each a new revision naming
another capital, one added), and a run still in
progress (20261201). ``dewiki`` has one run whose dump's published sha1 is wrong. The server honours Range, logs
every request, and can be told to answer busy (429/503 with Retry-After) or to cut a response short.
"""

from __future__ import annotations

import hashlib
import html
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.helpers.dumpfiles import page_xml, write_multistream

OLD, NEW, RUNNING = "20261101", "20261120", "20261201"
DUMP = "pages-articles-multistream.xml.bz2"
INDEX = "pages-articles-multistream-index.txt.bz2"
N_PAGES = 60
EDITED = {3: "Canberra", 17: "Ottawa", 42: "Wellington"}  # page number -> the capital its article names in NEW
COUNTRIES = {3: "Vexland", 17: "Quorria", 42: "Zembla"}  # the titles of those articles (the others: Article <k>)
OLD_CAPITAL = "Oldtown"  # what every article names in OLD


def site_pages(date: str) -> list[tuple[int, str, str]]:
    """The pages of ``enwiki``'s run ``date``: random words (so the bz2 streams stay tens of KB), a few facts."""
    rng = random.Random(7)
    vocabulary = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
                  for _ in range(3000)]
    pages = []
    for k in range(N_PAGES + (1 if date != OLD else 0)):
        capital = EDITED.get(k) if date != OLD else None
        fact = f"The capital is {capital or OLD_CAPITAL}. "
        words = " ".join(rng.choice(vocabulary) for _ in range(250))
        title = COUNTRIES.get(k, f"Article {k}")
        revision = (1000 + k) * 10 + (capital is not None)  # an edit is a new revision, as on Wikipedia
        pages.append((1000 + k, title, page_xml(1000 + k, title, None,
                                                revisions=[(revision, "2026-11-01T00:00:00Z", fact + words)])))
    return pages


def file_name(wiki: str, date: str, suffix: str) -> str:
    return f"{wiki}-{date}-{suffix}"


def _publish_run(root: Path, wiki: str, date: str, pages: list[tuple[int, str, str]], *, job: str,
                 wrong_sha1: str | None = None) -> None:
    folder = root / wiki / date
    folder.mkdir(parents=True)
    dump, index = folder / file_name(wiki, date, DUMP), folder / file_name(wiki, date, INDEX)
    write_multistream(dump, index, pages, per_stream=4)
    entries = {}
    for path in (dump, index):
        data = path.read_bytes()
        sha1 = hashlib.sha1(data).hexdigest()
        if path.name == wrong_sha1:
            sha1 = hashlib.sha1(data + b"tampered").hexdigest()
        entries[path.name] = {"size": len(data), "url": f"/{wiki}/{date}/{path.name}",
                              "md5": hashlib.md5(data).hexdigest(), "sha1": sha1}
    jobs = {job: {"status": "done", "updated": f"{date[:4]}-{date[4:6]}-02 06:00:00", "files": entries},
            "xmlstubsdump": {"status": "done", "files": {}}}
    if job == "articlesmultistreamdumprecombine":  # a large wiki: the parts are listed under the other job
        jobs["articlesmultistreamdump"] = {"status": "done", "files": {
            f"{wiki}-{date}-pages-articles-multistream1.xml-p1p1041.bz2": {"size": 1, "url": "/x", "sha1": "0" * 40}}}
    (folder / "dumpstatus.json").write_text(json.dumps({"jobs": jobs, "version": "0.8"}))
    (folder / f"{wiki}-{date}-sha1sums.txt").write_text(
        "".join(f"{e['sha1']}  {name}\n" for name, e in sorted(entries.items())))


def make_site(root: Path) -> Path:
    """Write the site's files under ``root``; returns it."""
    _publish_run(root, "enwiki", OLD, site_pages(OLD), job="articlesmultistreamdump")
    _publish_run(root, "enwiki", NEW, site_pages(NEW), job="articlesmultistreamdumprecombine")
    running = root / "enwiki" / RUNNING
    running.mkdir()
    (running / "dumpstatus.json").write_text(json.dumps({"jobs": {"articlesmultistreamdump": {
        "status": "in-progress", "files": {file_name("enwiki", RUNNING, DUMP): {"url": "/x"},
                                           file_name("enwiki", RUNNING, INDEX): {"url": "/x"}}}}}))
    (root / "enwiki" / "latest").mkdir()
    _publish_run(root, "dewiki", OLD, site_pages(OLD)[:20], job="articlesmultistreamdump",
                 wrong_sha1=file_name("dewiki", OLD, DUMP))
    return root


@dataclass
class Request:
    at: float
    path: str
    range: str | None


@dataclass
class DumpSiteServer:
    """The running site: ``url``, the request ``log``, and faults to inject."""

    root: Path
    url: str = ""
    log: list[Request] = field(default_factory=list)
    busy: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # path -> (status, Retry-After) to answer
    cut: set[tuple[str, int]] = field(default_factory=set)  # (path, range start): send half the bytes, then close
    delay_s: float = 0.0  # before each range response, so that concurrent requests overlap
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def requests_to(self, path: str, since: int = 0) -> list[Request]:
        return [r for r in self.log[since:] if r.path == path]


def _handler(site: DumpSiteServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            with site.lock:
                site.log.append(Request(time.monotonic(), self.path, self.headers.get("Range")))
                site.in_flight += 1
                site.max_in_flight = max(site.max_in_flight, site.in_flight)
                answers = site.busy.get(self.path)
                busy = answers.pop(0) if answers else None
            try:
                self._answer(busy)
            finally:
                with site.lock:
                    site.in_flight -= 1

        def _answer(self, busy: tuple[int, str] | None) -> None:
            if busy is not None:
                self.send_response(busy[0])
                self.send_header("Retry-After", busy[1])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            path = site.root / self.path.lstrip("/")
            if path.is_dir():
                links = "".join(f'<a href="{html.escape(p.name)}{"/" * p.is_dir()}">{html.escape(p.name)}</a>\n'
                                for p in sorted(path.iterdir()))
                return self._send(200, f"<html><body><pre>\n{links}</pre></body></html>".encode(), "text/html")
            if not path.is_file():
                return self._send(404, b"not found", "text/plain")
            data = path.read_bytes()
            wanted = self.headers.get("Range")
            if not wanted:
                return self._send(200, data, "application/octet-stream")
            first, _, last = wanted.removeprefix("bytes=").partition("-")
            start, end = int(first), min(int(last) + 1, len(data))
            time.sleep(site.delay_s)
            body = data[start:end]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if (self.path, start) in site.cut:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(body)

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def serve_site(root: Path) -> Iterator[DumpSiteServer]:
    """The site of :func:`make_site` served on 127.0.0.1 for the block."""
    site = DumpSiteServer(make_site(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(site))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    site.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
