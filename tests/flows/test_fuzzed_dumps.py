"""Guarantee: a fuzzed dump ends in success or in exit status 2 with one line naming the file; never a traceback,
a hang or a partial publish.

A small real multistream dump (short articles of the sample, three pages per
bz2 stream) is damaged in seeded, repeatable ways: bytes flipped inside its
bz2 streams, the file cut at random offsets, its index shuffled, garbled or
cut. Each case runs ``wikirag ingest`` (the CLI path that parses a dump) in
this process, on a Dask cluster whose workers write to a log this test reads,
so a traceback from a worker counts too. One case runs the whole
``wikirag index-rebuild`` as a user would, against a store with a published
index whose LATEST must stay as it was.
"""

from __future__ import annotations

import bz2
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from cli.wikirag import main
from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.ingest import read_passages
from rag_core.wiki.multistream import read_index
from runtime.process_groups import die_with_parent, stop_process_group
from tests.conftest import SAMPLE_BZ2
from tests.flows.conftest import PublishedIndex
from tests.helpers.pages import page_rows, write_dump

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SEED = 20261130
CASE_TIMEOUT_S = 120  # a hang is a failure, not a stuck CI job


class Dump(NamedTuple):
    data: bytes
    index: bytes  # the bz2 multistream index
    stream_offsets: list[int]  # where each bz2 stream starts (header, pages..., footer)


@pytest.fixture(scope="module")
def dump(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> Dump:
    """Nine short real articles, three per bz2 stream: parsing takes moments, every stream kind is there."""
    articles = [p for p in iter_pages(DumpSource(str(SAMPLE_BZ2)))
                if p.ns == 0 and not p.redirect and p.text and 3000 <= len(p.text) <= 20000
                and "(disambiguation)" not in p.title][:9]
    path, index = write_dump(tmp_path_factory.mktemp("dump"), page_rows(articles))
    data = path.read_bytes()
    offsets = sorted({0, *(s.offset for s in read_index(DumpSource(str(index))))})
    footer = data.rindex(b"BZh9")  # write_multistream's last stream is the footer
    return Dump(data, index.read_bytes(), [*offsets, footer])


def _flip(data: bytes, at: int, bit: int) -> bytes:
    return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1:]


def _index_lines(d: Dump) -> list[str]:
    return bz2.decompress(d.index).decode().splitlines()


def _cases() -> list[tuple[str, Callable[[Dump, random.Random], tuple[bytes, bytes | None]]]]:
    """(name, damage): damage returns the dump's bytes and its index's (None: ingest without an index)."""
    cases: list = []

    def in_stream(kind: str) -> Callable[[Dump, random.Random], tuple[bytes, bytes | None]]:
        def damage(d: Dump, rng: random.Random) -> tuple[bytes, bytes]:
            bounds = list(zip(d.stream_offsets, [*d.stream_offsets[1:], len(d.data)]))
            start, end = {"header": bounds[0], "footer": bounds[-1]}.get(kind) or rng.choice(bounds[1:-1])
            return _flip(d.data, rng.randrange(start, end), rng.randrange(8)), d.index
        return damage

    for i in range(3):
        cases.append((f"flip in a page stream #{i}", in_stream("page")))
    cases.append(("flip in the header stream", in_stream("header")))
    cases.append(("flip in the footer stream", in_stream("footer")))
    for i in range(3):
        cases.append((f"cut at a random offset #{i}", lambda d, rng: (d.data[:rng.randrange(1, len(d.data))], d.index)))
    cases.append(("cut at a page stream's start", lambda d, rng: (d.data[:rng.choice(d.stream_offsets[2:-1])], d.index)))
    # Every page is still there, only </mediawiki> is gone: success is fine, provided the passages are the real ones.
    cases.append(("cut before the footer stream", lambda d, rng: (d.data[:d.stream_offsets[-1]], d.index)))

    def shuffled(d: Dump, rng: random.Random) -> tuple[bytes, bytes]:
        lines = _index_lines(d)
        rng.shuffle(lines)
        return d.data, bz2.compress(("\n".join(lines) + "\n").encode())

    def ids_shuffled(d: Dump, rng: random.Random) -> tuple[bytes, bytes]:  # offsets in order, page ids swapped
        lines = [line.split(":", 2) for line in _index_lines(d)]
        ids = [line[1] for line in lines]
        while ids == [line[1] for line in lines]:
            rng.shuffle(ids)
        return d.data, bz2.compress("".join(f"{o}:{i}:{t}\n" for (o, _, t), i in zip(lines, ids)).encode())

    cases.append(("index lines shuffled", shuffled))
    cases.append(("index page ids shuffled", ids_shuffled))
    cases.append(("index with a flipped byte", lambda d, rng: (d.data, _flip(d.index, rng.randrange(4, len(d.index)),
                                                                           rng.randrange(8)))))
    cases.append(("index cut short", lambda d, rng: (d.data, d.index[:rng.randrange(1, len(d.index))])))
    cases.append(("no index, flip in a page stream", lambda d, rng: (in_stream("page")(d, rng)[0], None)))
    cases.append(("no index, cut at a random offset", lambda d, rng: (d.data[:rng.randrange(1, len(d.data))], None)))
    return cases


CASES = _cases()


class WorkerLog(NamedTuple):
    address: str
    path: Path


@pytest.fixture(scope="module")
def logged_cluster(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerLog]:
    """A 2-worker Dask cluster in a process of its own whose workers' stderr goes to a file this test reads."""
    log = tmp_path_factory.mktemp("dask") / "workers.log"
    code = ("from distributed import LocalCluster\n"
            "c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host='127.0.0.1', "
            "dashboard_address='127.0.0.1:0')\n"
            "print(c.scheduler_address, flush=True)\n"
            "import time\nwhile True: time.sleep(60)\n")
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(REPO)}
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=err,
                                text=True, start_new_session=True, preexec_fn=die_with_parent)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith("tcp://127.0.0.1:"), log.read_text()[-3000:]
        yield WorkerLog(address, log)
    finally:
        stop_process_group(proc.pid, timeout=15)
        proc.wait()


def _published(store: Path) -> dict[str, bytes]:
    """Every file a reader can see: all but the staging area (kept for a rerun), the failed runs' reports and the
    empty file a local store's lease lock is taken on (a released lease leaves no record)."""
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*"))
            if p.is_file() and "_staging" not in p.parts and "_reports" not in p.parts
            and p.relative_to(store).parts[::2] != ("leases", ".lock")}


def _write_case(folder: Path, data: bytes, index: bytes | None) -> list[str]:
    """The damaged files on disk; returns the dump arguments of the CLI."""
    folder.mkdir()
    (folder / "wiki.xml.bz2").write_bytes(data)
    if index is None:
        return [str(folder / "wiki.xml.bz2")]
    (folder / "wiki-index.txt.bz2").write_bytes(index)
    return [str(folder / "wiki.xml.bz2"), "--index", str(folder / "wiki-index.txt.bz2")]


def _check_failure(case: str, code: int, out: str, err: str) -> str:
    """Exit 2, nothing on stdout, and one ``wikirag: error:`` line naming the dump or its index, printed last."""
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert (code, out) == (2, ""), (case, err[-3000:])
    assert last.startswith("wikirag: error: ") and ("wiki.xml.bz2" in last or "wiki-index.txt.bz2" in last), (case, last)
    assert [line for line in err.splitlines() if line.startswith("wikirag: error:")] == [last], (case, err)
    return last


@pytest.mark.timeout(CASE_TIMEOUT_S * (len(CASES) + 1))
def test_fuzzed_dumps_end_in_success_or_one_line_naming_the_file(
        dump: Dump, logged_cluster: WorkerLog, prefect_server: str, home: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    monkeypatch.setenv("PREFECT_HOME", str(home / "prefect"))

    def ingest(name: str, data: bytes, index: bytes | None) -> tuple[int, str, str, str, float, Path]:
        """``wikirag ingest`` into a store of its own: (exit status, stdout, stderr, workers' log, seconds, store)."""
        store = tmp_path / name / "store"
        args = ["ingest", *_write_case(tmp_path / name, data, index), "--store", str(store),
                "--dask-address", logged_cluster.address]
        logged = logged_cluster.path.stat().st_size
        started = time.monotonic()
        code = main(args)
        took = time.monotonic() - started
        out, err = capsys.readouterr()
        time.sleep(0.2)  # the workers' last lines
        with logged_cluster.path.open("rb") as f:
            f.seek(logged)
            workers = f.read().decode(errors="replace")
        return code, out, err, workers, took, store

    code, out, err, _, took, store = ingest("clean", dump.data, dump.index)
    assert code == 0, err[-3000:]
    reference = read_passages(Store(str(store)), out.strip().rsplit("/", 1)[-1]).select(["passage_id", "title", "text"])
    outcomes = [f"the undamaged dump: exit 0 in {took:.1f} s, {reference.num_rows} passages"]

    rng = random.Random(SEED)
    for n, (case, damage) in enumerate(CASES):
        data, index = damage(dump, rng)
        code, out, err, workers, took, store = ingest(f"case-{n}", data, index)
        assert "Traceback" not in err + workers, (case, err[-3000:], workers[-3000:])
        assert code in (0, 2), (case, err[-3000:])
        if code == 2:
            last = _check_failure(case, code, out, err)
            assert _published(store) == {}, case  # no part, no manifest outside staging
        else:  # a change no checksum covers (a bz2 padding bit, say): the passages must then be the real ones
            last = out.strip()
            got = read_passages(Store(str(store)), last.rsplit("/", 1)[-1]).select(["passage_id", "title", "text"])
            assert got.equals(reference), case
        outcomes.append(f"{case}: exit {code} in {took:.1f} s: {last[:200]}")
    print("\n".join(outcomes))


def test_a_fuzzed_dump_leaves_a_published_index_as_it_was(dump: Dump, published_index: PublishedIndex,
                                                          prefect_server: str, home: Path, tmp_path: Path) -> None:
    """The whole ``wikirag index-rebuild`` as a user runs it (its own Dask cluster), on a store serving LATEST."""
    store = tmp_path / "store"
    shutil.copytree(published_index.store, store)
    before = _published(store)
    data, index = dict(CASES)["flip in a page stream #0"](dump, random.Random(SEED))
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "WIKIRAG_WORKERS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "cli.wikirag", "index-rebuild", *_write_case(tmp_path / "case", data, index),
                           "--store", str(store), "--encoder", str(published_index.encoder)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=CASE_TIMEOUT_S, check=False,
                          preexec_fn=die_with_parent)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = _check_failure("index-rebuild", proc.returncode, proc.stdout, proc.stderr)
    assert "wiki.xml.bz2: corrupt or cut-short bz2 stream at byte " in last, last
    assert _published(store) == before  # LATEST, its version and every passage set as they were
