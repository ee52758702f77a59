"""Guarantee: ``wikirag index-rebuild`` reports what it published as published, on a real SeaweedFS.

- An older rebuild finishing last: its version is published and listed, LATEST stays on the newer one, and the
  command says so (exit 0).
- The store failing right after LATEST moved: the command exits 0 and prints the version (nothing is read from the
  store after publishing), its Prefect flow run is Completed, and LATEST names the version once the store is back.

The commands run as subprocesses with credentials in the environment, through a proxy in front of the real
SeaweedFS that holds or fails the requests a test picks (tests/flows/test_storage_outage.py's ``Busy503Proxy``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path

import pytest

from cli.wikirag import main, report_published
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.versions import latest_version, list_versions, read_index_manifest
from rag_core.storage import Store
from runtime.settings import Settings
from tests.conftest import S3Server
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.passagefiles import publish_small_index, sample_passages
from tests.helpers.processes import REPO
from tests.helpers.wikirag_runs import Busy503Proxy, Run, sample_dump

pytestmark = pytest.mark.slow
MANIFEST_PUT = re.compile(r".*/indexes/([^/]+)/manifest\.json")


def _env(s3_server: S3Server, proxy: Busy503Proxy, store: str, prefect_server: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WIKIRAG_"))}
    return {**env, **s3_server.env(), "AWS_ENDPOINT_URL": proxy.url, "WIKIRAG_STORE": store,
            "WIKIRAG_STORE_RETRIES": "2", "PREFECT_API_URL": prefect_server, "WIKIRAG_WORKERS": "2",
            "PYTHONPATH": str(REPO)}


def _rebuild_args(tmp_path: Path, tiny: Path) -> list[str]:
    dump, index = sample_dump(tmp_path, 3)
    return ["index-rebuild", str(dump), "--index", str(index), "--shards", "2", "--encoder", str(tiny),
            "--encoder-dtype", "float32"]


def test_an_older_rebuild_finishing_last_is_published_and_latest_stays_on_the_newer(
        s3_server: S3Server, prefect_server: str, home: Path, tmp_path: Path, wiki: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The rebuild (A) is held at its manifest's PUT; meanwhile a build planned later (B) publishes; then A's
    manifest goes through. A is published and listed, LATEST stays on B, and the command says so, exit 0."""
    url = f"s3://{s3_server.bucket}/older-last-{tmp_path.name}"
    direct = Store(url, s3_server.options())
    tiny = save_tiny_bert(tmp_path / "tiny")
    held, release = threading.Event(), threading.Event()

    def hold_the_manifest(method: str, path: str) -> bool:
        if method == "PUT" and MANIFEST_PUT.fullmatch(path.split("?")[0]):
            held.set()
            assert release.wait(120)
        return False  # then relayed unchanged

    with Busy503Proxy(s3_server.endpoint) as proxy:
        proxy.fail_when = hold_the_manifest
        run = Run(_rebuild_args(tmp_path, tiny), _env(s3_server, proxy, url, prefect_server))
        run.wait_for(held.is_set)
        encoder = Encoder.load(EncoderConfig(path=str(tiny), dtype="float32"))
        newer = publish_small_index(direct, "d2", sample_passages().slice(0, 40), encoder, 1)  # planned after A
        release.set()
        code, out, stderr = run.finish()
    older = out.strip()
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert re.search(rf"published index {re.escape(older)}: .*; LATEST stays on {re.escape(newer)} \(newer\)", stderr)
    assert latest_version(direct) == newer and list_versions(direct) == [older, newer]
    assert read_index_manifest(direct, older).created_at < read_index_manifest(direct, newer).created_at

    for key, value in {**s3_server.env(), "WIKIRAG_STORE": url}.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert main(["indexes", "list"]) == 0
    listed = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [f"  {older}", f"* {newer}"]


def _flow_run_states(store_url: str) -> list[str]:
    """The states of the index_rebuild flow runs whose parameters name this store."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["index_rebuild"])))
    return [r.state.type.value for r in runs if store_url in json.dumps(r.parameters, default=str)]


def test_the_store_failing_right_after_latest_moved_is_still_a_published_run(
        s3_server: S3Server, prefect_server: str, home: Path, tmp_path: Path) -> None:
    """From the moment LATEST is PUT, the store answers every request with 503 (through the retries): the command
    exits 0 and prints the version, the flow run is Completed, and LATEST names the version once the store is back."""
    url = f"s3://{s3_server.bucket}/dies-after-latest-{tmp_path.name}"
    moved = threading.Event()

    def down_after_latest(method: str, path: str) -> bool:
        if moved.is_set():
            return True
        if method == "PUT" and path.split("?")[0].endswith("/indexes/LATEST"):
            moved.set()  # this PUT goes through; every request after it fails
        return False

    with Busy503Proxy(s3_server.endpoint) as proxy:
        proxy.fail_when = down_after_latest
        code, out, stderr = Run(_rebuild_args(tmp_path, save_tiny_bert(tmp_path / "tiny")),
                                _env(s3_server, proxy, url, prefect_server)).finish()
        print(f"requests failed after LATEST moved: {proxy.failed}")
        version = out.strip()
        assert moved.is_set() and code == 0 and "Traceback" not in stderr, stderr[-3000:]
        assert f"published index {version}: " in stderr and "LATEST points at it" in stderr, stderr[-3000:]
        assert _flow_run_states(url) == ["COMPLETED"]
        proxy.fail_when = None  # the store is back
        assert latest_version(Store(url, {**s3_server.options(), "endpoint_url": proxy.url})) == version


def test_a_summary_that_cannot_be_read_after_publishing_is_a_warning(
        s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path,
        wiki: Path) -> None:
    """A run that publishes nothing new (LATEST already indexes the dump) reads the summary from the store: a store
    failing then is a warning naming the version, not a failed run."""
    url = f"s3://{s3_server.bucket}/summary-{tmp_path.name}"
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(tmp_path / "tiny")), dtype="float32"))
    # The name alone, as the flow returns LATEST when it publishes nothing new.
    published = publish_small_index(Store(url, s3_server.options()), "d1", sample_passages().slice(0, 20), encoder, 1)
    version = str(published)
    log = logging.getLogger("wikirag")
    caplog.set_level(logging.INFO, logger="wikirag")
    log.addHandler(caplog.handler)  # the command's logger does not propagate
    try:
        with Busy503Proxy(s3_server.endpoint) as proxy:
            for key, value in {**s3_server.env(), "AWS_ENDPOINT_URL": proxy.url, "WIKIRAG_STORE_RETRIES": "0"}.items():
                monkeypatch.setenv(key, value)
            settings = Settings(store=url)
            report_published(settings, version)
            assert caplog.messages[-1].startswith(f"published index {version}: 20 passages in 1 shards")
            assert caplog.messages[-1].endswith("; LATEST points at it")
            proxy.fail_next = 10_000
            report_published(settings, version)
            assert proxy.failed >= 1
    finally:
        log.removeHandler(caplog.handler)
    warning = caplog.records[-1]
    assert warning.levelno == logging.WARNING, warning
    assert warning.getMessage().startswith(f"index {version} is published; its summary could not be read: {url}/")
    assert "store answered HTTP 503" in warning.getMessage(), warning.getMessage()
