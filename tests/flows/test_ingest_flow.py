"""Real runs of the ingest flow: Prefect server, 2-worker Dask cluster, local and S3 stores."""

from __future__ import annotations

import bz2
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import Secret

from flows.ingest import ingest
from rag_core.errors import DumpError, GateError
from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.ingest import IngestConfig, published_manifest, read_passages
from rag_core.wiki.passages import passages_from_pages
from runtime.dask_runner import dask_runner
from runtime.settings import StoreAccess
from tests.conftest import MULTISTREAM, MULTISTREAM_INDEX, SAMPLE_BZ2, S3Server
from tests.helpers.dumpfiles import page_xml, write_multistream

pytestmark = pytest.mark.slow


def run_ingest(config: IngestConfig, store: str | StoreAccess) -> str:
    return ingest.with_options(task_runner=dask_runner(None, 2))(config=config, store=store)


@pytest.fixture(scope="module")
def expected_ids(wiki: Path) -> list[str]:
    return passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))))[0]["passage_id"].to_pylist()


def _artifact_keys() -> set[str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {a.key for a in client.read_artifacts() if a.key}


def test_multistream_sample_end_to_end(wiki: Path, home: Path, prefect_server: str, expected_ids: list[str]) -> None:
    store_url = str(home / "store")
    config = IngestConfig(dump=str(MULTISTREAM), index=str(MULTISTREAM_INDEX))
    url = run_ingest(config, store_url)
    dump_id = url.rsplit("/", 1)[-1]
    store = Store(store_url)
    manifest = published_manifest(store, dump_id)
    counts = manifest["counts"]
    assert (counts["pages"], counts["redirects"], counts["articles"], counts["disambiguation"]) == (206, 100, 106, 8)
    assert [p["path"] for p in manifest["parts"]] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert manifest["dump"]["schema_version"] == "0.10" and len(manifest["dump"]["sha256"]) == 64
    assert "passed" in manifest["gate"]
    passages = read_passages(store, dump_id)
    assert passages["passage_id"].to_pylist() == expected_ids  # same ids as the single-stream file, in order
    assert store.list("passages", "_staging") == []
    assert f"ingest-{dump_id}" in _artifact_keys()

    # A rerun on the same dump finds the published set and redoes nothing.
    assert run_ingest(config, store_url) == url
    assert published_manifest(store, dump_id)["created_at"] == manifest["created_at"]


def test_single_stream_dump_on_s3(wiki: Path, home: Path, prefect_server: str, s3_server: S3Server,
                                  expected_ids: list[str]) -> None:
    store_url = f"s3://{s3_server.bucket}/flow-test"
    access = StoreAccess(url=store_url, s3_options=Secret(s3_server.options()))  # the flow reads no environment
    url = run_ingest(IngestConfig(dump=str(SAMPLE_BZ2), batch_pages=60), access)
    assert url.startswith(store_url + "/passages/")
    store = Store(store_url, s3_server.options())
    dump_id = url.rsplit("/", 1)[-1]
    manifest = published_manifest(store, dump_id)
    assert len(manifest["parts"]) == 4  # 206 pages in batches of 60, cleaned on both workers
    assert read_passages(store, dump_id)["passage_id"].to_pylist() == expected_ids


def test_a_failed_shard_loses_only_itself(wiki: Path, home: Path, prefect_server: str, tmp_path: Path) -> None:
    lines = bz2.decompress(MULTISTREAM_INDEX.read_bytes()).decode().splitlines()
    offset, _, title = lines[-1].split(":", 2)
    lines[-1] = f"{offset}:424242:{title}"  # the last stream (shard 3 of 3) no longer matches the dump
    bad_index = tmp_path / "bad-index.txt"
    bad_index.write_text("\n".join(lines) + "\n")
    store_url = str(home / "store")
    with pytest.raises(DumpError, match="use the index published with this dump"):
        run_ingest(IngestConfig(dump=str(MULTISTREAM), index=str(bad_index)), store_url)
    staging = next((home / "store" / "passages" / "_staging").iterdir()) / "s3"
    staged = {p.name: p.stat().st_mtime_ns for p in staging.glob("part-*.parquet")}
    assert sorted(staged) == ["part-00000.parquet", "part-00001.parquet"]
    assert published_manifest(Store(store_url), staging.parent.name) is None

    url = run_ingest(IngestConfig(dump=str(MULTISTREAM), index=str(MULTISTREAM_INDEX)), store_url)
    published = Path(url)
    assert {name: (published / name).stat().st_mtime_ns for name in staged} == staged  # reused, not redone
    assert (published / "part-00002.parquet").exists()


def test_failing_gate_publishes_nothing(home: Path, prefect_server: str, tmp_path: Path) -> None:
    words = " ".join(f"word{i}" for i in range(60))
    # Doubly escaped entities survive cleaning as "&amp;": markup residue in 4 of 40 passages.
    pages = [(i, f"Page {i}", page_xml(i, f"Page {i}", f"{words} AT&amp;amp;T" if i % 10 == 0 else words))
             for i in range(1, 41)]
    dump, index = tmp_path / "residue.xml.bz2", tmp_path / "residue-index.txt.bz2"
    write_multistream(dump, index, pages, per_stream=10)
    store_url = str(home / "store")
    with pytest.raises(GateError, match=r"expect_column_values_to_not_match_regex\(text\): 4 rows.*report: ") as err:
        run_ingest(IngestConfig(dump=str(dump), index=str(index)), store_url)
    report = Path(str(err.value).rsplit("report: ", 1)[1])
    assert "| expect_column_values_to_not_match_regex | text | 4 of 40 |" in report.read_text()
    assert _published(home / "store") == []
    assert any(k.startswith("gate-residue") for k in _artifact_keys())


def _published(store: Path) -> list[str]:
    root = store / "passages"
    return [p.name for p in root.iterdir() if not p.name.startswith("_")] if root.exists() else []


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.wikirag", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_cli_bad_inputs_give_one_line_and_publish_nothing(wiki: Path, home: Path, prefect_server: str,
                                                          s3_server: S3Server, tmp_path: Path) -> None:
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "WIKIRAG_WORKERS": "2"}
    truncated = tmp_path / "truncated.xml.bz2"
    truncated.write_bytes(SAMPLE_BZ2.read_bytes()[:900_000])
    proc = _cli("ingest", str(truncated), env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("wikirag: error: truncated.xml.bz2: the bz2 data ends before its end-of-stream marker")
    assert "download the dump again" in last
    assert _published(home / "store") == []

    wrong = {**env, **s3_server.env(), "AWS_SECRET_ACCESS_KEY": "wrong-secret"}
    proc = _cli("ingest", str(SAMPLE_BZ2), "--store", f"s3://{s3_server.bucket}/cli", env=wrong)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"wikirag: error: s3://{s3_server.bucket}/cli: writing refused by the store")
    assert "wrong-secret" not in proc.stderr + proc.stdout

    # No retries: the default's backoff (up to 71 s) would only make this test slower.
    unreachable = {**env, **s3_server.env(), "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "WIKIRAG_STORE_RETRIES": "0"}
    proc = _cli("ingest", str(SAMPLE_BZ2), "--store", f"s3://{s3_server.bucket}/cli", env=unreachable)
    assert proc.returncode == 2 and "store unreachable" in proc.stderr.strip().splitlines()[-1]


def test_cli_help_lists_the_commands() -> None:
    proc = subprocess.run([sys.executable, "-m", "cli.wikirag", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for command in ("run", "ingest", "data", "passages"):
        assert command in proc.stdout


def test_workspace_server_is_reused_and_stopped(wiki: Path, home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["WIKIRAG_WORKERS"] = "1"
    start = _cli("server", "start", "--port", "0", env=env)
    assert start.returncode == 0, start.stderr
    url = start.stdout.strip()
    assert url.startswith("http://127.0.0.1:") and _cli("server", "status", env=env).stdout.strip() == url
    try:
        proc = _cli("ingest", str(MULTISTREAM), "--index", str(MULTISTREAM_INDEX), env=env)
        assert proc.returncode == 0, proc.stderr
        assert "local Prefect server at" not in proc.stderr  # reused, not started again
        assert proc.stdout.strip().startswith(str(home / "store" / "passages"))
    finally:
        assert _cli("server", "stop", env=env).returncode == 0
    assert _cli("server", "status", env=env).stdout.strip() == "not running"
