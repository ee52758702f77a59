"""Guarantee: the S3 server dying mid-run is one line, exit 2, nothing incomplete visible; a short outage is ridden through.

A SeaweedFS server of the test's own (the session's ``s3_server`` serves other
tests) is SIGKILLed, its whole process group at once, while ``wikirag
index-rebuild`` runs through the CLI against it with credentials in the
environment. The stage is read off the store itself, listed as the command
writes: the first embedding-range record (shards still embedding), the first
FAISS shard of the new version (the index build under way), a new version's
plan (a rerun about to embed and build). Then the server comes back on the
same data and port, as a restarted store would. Publishing is one PUT of the
manifest and then one of LATEST: no listing from outside lands a kill between
the last shard and it reliably (it was tried: the version was already
published when the kill came).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import s3fs

from cli.wikirag import main
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.search import ShardedIndex
from rag_core.index.versions import latest_version
from rag_core.storage import S3FS_TRIES, Store, StoreUnreachableError
from runtime.process_groups import die_with_parent
from runtime.settings import Settings, retry_window_s
from tests.conftest import S3Server, SeaweedFS
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.passagefiles import publish_small_index, sample_passages
from tests.helpers.processes import REPO
from tests.helpers.wikirag_runs import Busy503Proxy, Run, sample_dump

pytestmark = pytest.mark.slow
RECORD = re.compile(r"embeddings/[^/]+/[^/]+/rows-[^/]+\.json")
SHARD_IDS = re.compile(r"indexes/([^/]+)/shard-\d+\.ids\.parquet")
PLAN = re.compile(r"indexes/([^/]+)/plan\.json")
# Past the retries' worst case, a failed run still closes its Dask cluster (15 s at most) and its Prefect flow run.
CLOSE_S = 45
LEASE_TTL_S = 10


@pytest.fixture
def seaweed(tmp_path: Path) -> Iterator[SeaweedFS]:
    (tmp_path / "seaweedfs").mkdir()
    server = SeaweedFS(tmp_path / "seaweedfs")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(prefect_server: str) -> Iterator[str]:
    """A Dask cluster the test's runs share (as a team would share one): started once, not once a run."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", env={"PREFECT_API_URL": prefect_server}) as local:
        yield local.scheduler_address


def _env(seaweed: SeaweedFS, home: Path, store: str, prefect_server: str, cluster: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WIKIRAG_"))}
    # A run killed by its store cannot release its build lease; the rerun takes it over once its ttl has passed
    # since the last heartbeat: 10 s here instead of the default 120 s, or each rerun would wait two minutes.
    return {**env, **seaweed.server.env(), "WIKIRAG_HOME": str(home), "WIKIRAG_STORE": store,
            "WIKIRAG_DASK_ADDRESS": cluster, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(REPO),
            "WIKIRAG_LEASE_TTL_S": str(LEASE_TTL_S)}


def _objects(seaweed: SeaweedFS, prefix: str) -> list[str]:
    fs = s3fs.S3FileSystem(**seaweed.server.options(), skip_instance_cache=True)
    return sorted(o.removeprefix(f"{prefix}/") for o in fs.find(prefix))


def _matching(pattern: re.Pattern[str], objects: list[str]) -> list[str]:
    """The objects that match ``pattern``, or its group when it has one."""
    return [m.group(pattern.groups) for o in objects if (m := pattern.fullmatch(o))]


def _visible(objects: list[str]) -> list[str]:
    """What readers can see of the index: LATEST and the manifests of published versions."""
    return [o for o in objects if o.startswith("indexes/") and o.endswith(("/LATEST", "/manifest.json"))]


def _killed_when(seaweed: SeaweedFS, args: list[str], env: dict[str, str], retries: int,
                 stage: Callable[[], bool], name: str) -> None:
    """Run ``args``, SIGKILL the server once ``stage()``; the command must end in one line within its retries' worst
    case, exit 2, no traceback. The server is back when this returns."""
    run = Run(args, {**env, "WIKIRAG_STORE_RETRIES": str(retries)})
    killed = run.wait_for(stage)
    seaweed.kill()
    code, out, stderr = run.finish()
    failed_in = time.monotonic() - killed
    seaweed.start()
    last = stderr.strip().splitlines()[-1]
    print(f"{name}: exit {code} {failed_in:.1f} s after the kill: {last}")
    assert code == 2 and out == "", stderr[-3000:]
    assert last.startswith(f"wikirag: error: {env['WIKIRAG_STORE']}/") and "store unreachable" in last, stderr[-3000:]
    assert "check AWS_ENDPOINT_URL (or WIKIRAG_STORE) and that the server is running, then rerun" in last
    assert "Traceback" not in stderr, stderr[-5000:]
    assert failed_in < retry_window_s(retries) + CLOSE_S


def test_a_dead_store_is_one_line_and_nothing_visible_a_short_outage_is_ridden_through_the_rerun_publishes(
        seaweed: SeaweedFS, home: Path, tmp_path: Path, prefect_server: str, cluster: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    dump, index = sample_dump(tmp_path, 5)
    prefix = f"{seaweed.server.bucket}/outage"
    env = _env(seaweed, home, f"s3://{prefix}", prefect_server, cluster)
    # Eight shards on two workers: at the first finished shard, at least five are still to embed.
    args = ["index-rebuild", str(dump), "--index", str(index), "--shards", "8",
            "--encoder", str(save_tiny_bert(tmp_path / "tiny")), "--encoder-dtype", "float32"]

    # 1. Killed while shards embed: two retries (at most 3 s of backoff), then one line.
    _killed_when(seaweed, args, env, 2, lambda: len(_matching(RECORD, _objects(seaweed, prefix))) >= 1, "mid-embedding")
    objects = _objects(seaweed, prefix)
    finished = _matching(RECORD, objects)
    assert 1 <= len(finished) < 8 and _visible(objects) == [], objects

    # 2. Killed as the index build writes its first shard (at least five still to build): one retry, then one line.
    _killed_when(seaweed, args, env, 1, lambda: len(_matching(SHARD_IDS, _objects(seaweed, prefix))) >= 1,
                 "mid-index-build")
    objects = _objects(seaweed, prefix)
    assert 1 <= len(_matching(SHARD_IDS, objects)) < 8, objects
    assert _visible(objects) == [], objects  # shard files without a manifest: nobody sees them
    assert set(_matching(RECORD, objects)) >= set(finished)  # the first run's finished ranges were kept

    # 3. The rerun, with the default retries (up to 71 s of backoff), meets a 2 s outage as soon as it has planned
    # its version (its embedding and index stages follow): ridden through, it publishes.
    planned = set(_matching(PLAN, objects))
    run = Run(args, env)
    killed = run.wait_for(lambda: bool(set(_matching(PLAN, _objects(seaweed, prefix))) - planned))
    seaweed.kill()
    time.sleep(2)
    seaweed.start()
    print(f"outage: {time.monotonic() - killed:.1f} s")
    code, out, stderr = run.finish()
    assert code == 0, stderr[-3000:]
    assert "will start" not in stderr and "Retry" not in stderr  # botocore's retries rode it through, not Prefect's
    assert "took over the expired index lease" in stderr and f"(ttl {LEASE_TTL_S} s)" in stderr, stderr[-3000:]
    version = out.strip()
    assert set(_visible(_objects(seaweed, prefix))) == {"indexes/LATEST", f"indexes/{version}/manifest.json"}
    for key in ("WIKIRAG_STORE", *seaweed.server.env()):
        monkeypatch.setenv(key, env[key])
    capsys.readouterr()
    assert main(["search", "What is anarchism?", "-k", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"][0]["title"] == "Anarchism"


def test_the_retry_setting_reaches_botocore_and_bounds_s3fs(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """WIKIRAG_STORE_RETRIES becomes botocore's standard-mode attempts on the client a Store really uses, and s3fs's
    loop around them is cut to two tries, so the two do not multiply."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WIKIRAG_STORE_RETRIES", "3")
    store = Settings(store=f"s3://{s3_server.bucket}/retry-policy").open_store()
    store.check_writable()  # a real request: the client exists now
    assert store.fs.s3.meta.config.retries == {"mode": "standard", "total_max_attempts": 4}
    assert (store.fs.retries, retry_window_s(3), retry_window_s()) == (2, 7.0, 71.0)


def test_real_http_503s_are_retried_and_a_store_that_keeps_answering_503_is_one_line(
        s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answers 503 SlowDown (a real HTTP response, through a proxy in front of SeaweedFS): a few are
    ridden through by the retries; one that keeps answering 503 ends in the one-line unreachable-store error
    after a bounded number of requests, and the object is not there."""
    with Busy503Proxy(s3_server.endpoint) as proxy:
        for key, value in {**s3_server.env(), "AWS_ENDPOINT_URL": proxy.url, "WIKIRAG_STORE_RETRIES": "3"}.items():
            monkeypatch.setenv(key, value)
        store = Settings(store=f"s3://{s3_server.bucket}/busy").open_store()
        store.check_writable()
        proxy.fail_next = 3  # fewer than the 4 attempts a request gets
        store.write_json({"written": "through three 503s"}, "ridden.json")
        assert proxy.failed == 3 and proxy.fail_next == 0
        direct = s3fs.S3FileSystem(**s3_server.options(), skip_instance_cache=True)
        assert json.loads(direct.cat(f"{s3_server.bucket}/busy/ridden.json")) == {"written": "through three 503s"}

        proxy.failed, proxy.fail_next = 0, 10_000
        started = time.monotonic()
        with pytest.raises(StoreUnreachableError) as error:
            store.write_json({"never": "written"}, "refused.json")
        took = time.monotonic() - started
        message = str(error.value)
        assert "\n" not in message and "busy/refused.json" in message, message
        assert "the store answered HTTP 503" in message and "AWS_ENDPOINT_URL" in message, message
        # 4 botocore attempts per call, s3fs's two tries at most: bounded, never a loop
        assert 4 <= proxy.failed <= 4 * S3FS_TRIES, proxy.failed
        assert took < S3FS_TRIES * (retry_window_s(3) + 4 * 5), took
        print(f"503 until the end: {proxy.failed} requests, one line after {took:.1f} s: {message}")
        proxy.fail_next = 0
        assert not direct.exists(f"{s3_server.bucket}/busy/refused.json")


def test_a_store_failing_the_move_of_latest_leaves_latest_as_it_was_and_the_rerun_publishes(
        s3_server: S3Server, prefect_server: str, home: Path, tmp_path: Path) -> None:
    """The last step of publishing fails for real (every PUT of LATEST answered 503 through the retries): one line,
    exit 2, LATEST still on the version it named, which still answers; the rerun reuses the embedded shards and
    publishes. (The other stages' outages: the test above, with the server killed.)"""
    prefix = f"{s3_server.bucket}/publish-{tmp_path.name}"
    tiny = save_tiny_bert(tmp_path / "tiny")
    encoder = Encoder.load(EncoderConfig(path=str(tiny), dtype="float32"))
    old = publish_small_index(Store(f"s3://{prefix}", s3_server.options()), "d1", sample_passages().slice(0, 40),
                              encoder, 1)
    dump, index = sample_dump(tmp_path, 3)
    with Busy503Proxy(s3_server.endpoint) as proxy:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {**s3_server.env(), "AWS_ENDPOINT_URL": proxy.url, "WIKIRAG_STORE": f"s3://{prefix}",
                "WIKIRAG_STORE_RETRIES": "2", "PREFECT_API_URL": prefect_server, "WIKIRAG_WORKERS": "2",
                "PYTHONPATH": str(REPO)}
        args = [sys.executable, "-m", "cli.wikirag", "index-rebuild", str(dump), "--index", str(index), "--shards", "2",
                "--encoder", str(tiny), "--encoder-dtype", "float32"]
        proxy.fail_when = lambda method, path: method == "PUT" and path.split("?")[0].endswith("/indexes/LATEST")
        failed = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
                                preexec_fn=die_with_parent, check=False)
        last = failed.stderr.strip().splitlines()[-1]
        assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
        assert last.startswith("wikirag: error: ") and "indexes/LATEST" in last and "HTTP 503" in last, last
        assert proxy.failed >= 3  # the retries were spent on LATEST
        print(f"LATEST answered 503 {proxy.failed} times: {last}")
        direct = Store(f"s3://{prefix}", s3_server.options())
        assert latest_version(direct) == old  # readers still get the old version, whole
        hits = ShardedIndex.load(direct).search(encoder.encode_questions(["Who was Achilles?"]), 3)[0]
        assert len(hits) == 3 and all(h.passage_id for h in hits)  # and it answers

        proxy.fail_when = None
        rerun = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
                               preexec_fn=die_with_parent, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rerun.stderr.count("already embedded") == 2  # nothing encoded again
    assert latest_version(direct) == rerun.stdout.strip() != old
