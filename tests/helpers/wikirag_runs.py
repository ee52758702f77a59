"""``wikirag`` as a subprocess read as it prints, a small dump of the sample's articles, and a 503-answering S3 proxy."""

from __future__ import annotations

import http.client
import http.server
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import IO

from rag_core.wiki.dumps import DumpSource, iter_pages
from runtime.process_groups import die_with_parent
from tests.conftest import SAMPLE_BZ2
from tests.helpers.pages import page_rows, write_dump
from tests.helpers.processes import REPO


def sample_dump(tmp_path: Path, n: int) -> tuple[Path, Path]:
    articles = [p for p in iter_pages(DumpSource(str(SAMPLE_BZ2))) if p.ns == 0 and not p.redirect and p.text][:n]
    return write_dump(tmp_path, page_rows(articles))


class Run:
    """``wikirag ARGS`` as a subprocess whose stderr is read line by line as it is printed."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args, self.started = args, time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "cli.wikirag", *args], env=env, cwd=REPO, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=die_with_parent)
        self.lines: list[str] = []
        self.out: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stderr, self.lines), (self.proc.stdout, self.out))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], into: list[str]) -> None:
        into.extend(stream)

    def wait_for(self, done: Callable[[], bool], timeout: float = 300) -> float:
        """Block until ``done()`` while the command runs; the monotonic time it became true."""
        deadline = time.monotonic() + timeout
        while not done():
            assert self.proc.poll() is None, "".join(self.lines)[-3000:]
            assert time.monotonic() < deadline, "".join(self.lines)[-3000:]
            time.sleep(0.05)
        return time.monotonic()

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) once it ends."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        print(f"wikirag {self.args[0]}: exit {self.proc.returncode} in {time.monotonic() - self.started:.1f} s")
        return self.proc.returncode, "".join(self.out), "".join(self.lines)


class Busy503Proxy:
    """An HTTP proxy in front of the real S3 server that answers ``503 SlowDown`` to the next ``fail_next`` requests
    and to those ``fail_when(method, path)`` picks, and relays the rest unchanged (the Host header too, so that SigV4
    signatures still verify)."""

    BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")

    def __init__(self, backend: str) -> None:
        self.backend = urllib.parse.urlsplit(backend)
        self.fail_next, self.failed = 0, 0
        self.fail_when: Callable[[str, str], bool] | None = None
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet: pytest shows stderr on failures
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                body = self._body()
                with proxy.lock:
                    busy = proxy.fail_next > 0
                    proxy.fail_next -= busy
                    busy = busy or bool(proxy.fail_when and proxy.fail_when(self.command, self.path))
                    proxy.failed += busy
                if busy:
                    self.send_response(503)
                    for name, value in (("Content-Type", "application/xml"), ("Retry-After", "0"),
                                        ("Content-Length", str(len(Busy503Proxy.BODY)))):
                        self.send_header(name, value)
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(Busy503Proxy.BODY)
                    return
                conn = http.client.HTTPConnection(proxy.backend.hostname, proxy.backend.port, timeout=30)
                try:
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        if name.lower() != "transfer-encoding":
                            conn.putheader(name, value)
                    if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                        conn.putheader("Content-Length", str(len(body)))
                    conn.endheaders(body or None)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status, resp.reason)
                for name, value in resp.getheaders():
                    if name.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Busy503Proxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
