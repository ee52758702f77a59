"""Guarantee: SIGTERM stops ``wikirag index-rebuild`` within 30 s, exit 143, with nothing left running; a rerun resumes.

The command runs for real as users run it: no PREFECT_API_URL, so it starts
its own Prefect server and its own local Dask cluster (worker processes).
Every process it started is found in /proc while it embeds; after the signal
each one must be gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.process_groups import die_with_parent
from rag_core.index.versions import latest_version
from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource, iter_pages
from tests.conftest import SAMPLE_BZ2
from tests.flows.test_index_rebuild import _pages, write_dump

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STOP_WITHIN_S = 30


def _proc_stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of a live process; None when gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return (None if fields[0] == "Z" else (int(fields[1]), fields[19]))


def _descendants(root: int) -> dict[int, str]:
    """pid -> start time of every live process below ``root``."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _proc_stat(int(entry))) is not None:
            parents[int(entry)] = stat
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, started) in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = started
                frontier.append(pid)
    return found


def _still_running(seen: dict[int, str]) -> list[str]:
    alive = []
    for pid, started in seen.items():
        stat = _proc_stat(pid)
        if stat is not None and stat[1] == started:  # the same process, not a reused pid
            alive.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
    return alive


def test_sigterm_mid_embedding_stops_everything_within_30_s_and_the_rerun_resumes(
        wiki: Path, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    articles = [p for p in iter_pages(DumpSource(str(SAMPLE_BZ2))) if p.ns == 0 and not p.redirect and p.text][:10]
    dump, index = write_dump(tmp_path, _pages(articles))
    env = {**os.environ, "WIKIRAG_WORKERS": "2", "PYTHONPATH": str(REPO)}
    # The packaged MiniLM: slow enough per shard that the signal lands while shards are still embedding.
    args = [sys.executable, "-m", "flows.cli", "index-rebuild", str(dump), "--index", str(index), "--shards", "8",
            "--encoder-dtype", "auto"]
    embeddings = home / "store" / "embeddings"
    proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent)  # an interrupted pytest takes it down too
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None and not list(embeddings.glob("*/*/rows-*.json")):
            seen |= _descendants(proc.pid)
            time.sleep(0.2)
        seen |= _descendants(proc.pid)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert len(seen) >= 3, seen  # its Prefect server and the Dask workers, at least
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
        stopped_in = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"stopped in {stopped_in:.1f} s; {len(seen)} processes it started")
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert stopped_in < STOP_WITHIN_S, stderr[-3000:]
    time.sleep(1)  # a stopped child's exit is reaped by init within moments
    assert _still_running(seen) == []
    finished = {p.name for p in embeddings.glob("*/*/rows-*.json")}
    assert 1 <= len(finished) < 8 and not (home / "store" / "indexes" / "LATEST").exists()

    rerun = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
                           preexec_fn=die_with_parent, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rerun.stderr.count("already embedded") >= len(finished)  # resumed: finished ranges were not encoded again
    assert latest_version(Store(str(home / "store"))) == rerun.stdout.strip()


@pytest.mark.skipif(os.environ.get("WIKIRAG_TEST_HOLD") != "1", reason="run by the test below, inside a pytest it kills")
def test_hold_the_services_until_killed(s3_server: object, prefect_server: str) -> None:
    print("services up", flush=True)
    time.sleep(600)


def test_an_interrupted_pytest_leaves_no_server_behind(tmp_path: Path) -> None:
    """SIGKILL a pytest whose fixtures started SeaweedFS and a Prefect server: the kernel's parent-death signal
    (not fixture teardown, which never runs) must stop both."""
    env = {**os.environ, "WIKIRAG_TEST_HOLD": "1", "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                              f"{__file__}::test_hold_the_services_until_killed", "--basetemp", str(tmp_path / "inner")],
                             env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             preexec_fn=die_with_parent)
    seen: dict[int, str] = {}
    try:
        assert inner.stdout is not None
        for line in inner.stdout:  # the fixtures are up once the test body prints
            if "services up" in line:
                break
        seen = _descendants(inner.pid)
        names = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:4] for pid in seen]
        assert any(b"weed" in part for cmd in names for part in cmd), names
        assert any(b"prefect" in part for cmd in names for part in cmd), names
        inner.send_signal(signal.SIGKILL)
        inner.wait(timeout=30)
        deadline = time.monotonic() + STOP_WITHIN_S
        while _still_running(seen) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _still_running(seen) == []
    finally:
        if inner.poll() is None:
            inner.kill()
        for pid in seen:  # do not leave them if the guarantee failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
