"""Real runs of the ingest deployment's entry flow (``deployed_ingest``, Prefect server, a local Dask cluster)
given a loopback dump site in Wikimedia's layout: the newest complete dated dump is mirrored, verified and parsed
from the mirror; a second run against the unchanged site costs the listing and parses nothing, and a run with other
content settings parses the same mirror again without downloading it; a dump whose published sha1 is wrong ingests
and publishes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.ingest import deployed_ingest
from rag_core.storage import Store
from rag_core.wiki.dump_mirror import ChecksumMismatchError, piece_bounds
from rag_core.wiki.dump_site import DumpSiteConfig
from rag_core.wiki.ingest import published_manifest, read_passages
from tests.helpers.dumpsite import DUMP, EDITED, INDEX, NEW, OLD, RUNNING, DumpSiteServer, file_name, serve_site

pytestmark = pytest.mark.slow
PIECE_BYTES = 16 << 10


@pytest.fixture
def site(tmp_path: Path) -> Iterator[DumpSiteServer]:
    with serve_site(tmp_path / "site") as running:
        yield running


@pytest.fixture
def worker_env(home: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """The deployment's environment: a local store in a fresh workspace, one Dask worker; returns the store."""
    monkeypatch.setenv("WIKIRAG_WORKERS", "1")
    monkeypatch.setenv("WIKIRAG_PROCESS_TUNING", "off")  # start_process would retune this pytest process's malloc
    return Store(str(home / "store"))


def site_config(site: DumpSiteServer, wiki: str = "enwiki") -> dict:
    return DumpSiteConfig(site=site.url, wiki=wiki, piece_bytes=PIECE_BYTES, backoff_s=0.05).model_dump()


def flow_runs_of(flow_name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])))


def task_names_of(flow_run_id) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(run.task_key.rsplit("-", 1)[0] for run in runs)


def test_the_newest_dump_is_mirrored_and_parsed_from_the_mirror_then_an_unchanged_one_parses_nothing(
        site: DumpSiteServer, worker_env: Store, prefect_server: str) -> None:
    store = worker_env
    ingests = len(flow_runs_of("ingest"))
    passages_url = deployed_ingest(dump_site=site_config(site))
    assert len(flow_runs_of("ingest")) == ingests + 1

    dump_id = passages_url.rstrip("/").rsplit("/", 1)[-1]
    manifest = published_manifest(store, dump_id)
    mirror = ("dumps", "enwiki", NEW)
    assert manifest["dump"]["url"] == store.url_of(*mirror, file_name("enwiki", NEW, DUMP))
    assert manifest["index"] == store.url_of(*mirror, file_name("enwiki", NEW, INDEX))
    assert store.exists(*mirror, "mirror.json") and store.list("dumps", "enwiki") == [NEW]
    texts = "\n".join(read_passages(store, dump_id, ["text"]).column("text").to_pylist())
    assert all(f"The capital is {capital}." in texts for capital in EDITED.values())  # NEW's facts, not OLD's

    # Each byte of the dump came from the site once, by the mirror's range requests; ingest asked for none.
    for name in (file_name("enwiki", NEW, DUMP), file_name("enwiki", NEW, INDEX)):
        size = (site.root / "enwiki" / NEW / name).stat().st_size
        asked = sorted(r.range for r in site.requests_to(f"/enwiki/{NEW}/{name}"))
        assert asked == sorted(f"bytes={start}-{end - 1}" for start, end in piece_bounds(size, PIECE_BYTES))
    assert not [r for r in site.log if f"/{OLD}/" in r.path and r.path.endswith((DUMP, INDEX))]

    asked = len(site.log)
    state = deployed_ingest(dump_site=site_config(site), return_state=True)
    assert state.is_completed() and state.result() is None
    # The listing, and the status of the run still in progress (newer than NEW): nothing else of the site.
    assert [r.path for r in site.log[asked:]] == ["/enwiki/", f"/enwiki/{RUNNING}/dumpstatus.json"]
    assert len(flow_runs_of("ingest")) == ingests + 1  # no ingest ran: nothing hashed or parsed
    assert task_names_of(state.state_details.flow_run_id) == ["check_dump_site_for_passages"]
    assert [n for n in store.list("passages") if not n.startswith("_")] == [dump_id]

    # Other content settings: the same dump is not ingested yet for them; the mirror is re-hashed, not downloaded.
    asked = len(site.log)
    other_url = deployed_ingest(config={"dump": "unused: the mirror's", "words_per_passage": 50},
                                dump_site=site_config(site))
    assert other_url != passages_url
    other = published_manifest(store, other_url.rstrip("/").rsplit("/", 1)[-1])
    assert other["dump"]["url"] == manifest["dump"]["url"] and other["config"]["words_per_passage"] == 50
    assert [r.path for r in site.log[asked:]] == ["/enwiki/", f"/enwiki/{RUNNING}/dumpstatus.json",
                                                  f"/enwiki/{NEW}/dumpstatus.json"]


def test_a_wrong_published_sha1_ingests_and_publishes_nothing(site: DumpSiteServer, worker_env: Store,
                                                               prefect_server: str) -> None:
    store = worker_env
    ingests = len(flow_runs_of("ingest"))
    state = deployed_ingest(dump_site=site_config(site, "dewiki"), return_state=True)
    assert state.is_failed()
    dump = file_name("dewiki", OLD, DUMP)
    with pytest.raises(ChecksumMismatchError, match=f"/dewiki/{OLD}/{dump}: sha1 .* differs from the published"):
        state.result()

    assert len(flow_runs_of("ingest")) == ingests  # the ingest never started
    assert "plan_dump" not in task_names_of(state.state_details.flow_run_id)
    assert store.list("passages") == []
    folder = ("dumps", "dewiki", OLD)
    assert not store.exists(*folder, dump) and not store.exists(*folder, "mirror.json")
    assert store.files("dumps", "_staging") == {}  # the wrong bytes' pieces went too


def test_without_a_dump_site_or_a_dump_the_run_is_one_line(worker_env: Store, prefect_server: str) -> None:
    from rag_core.errors import WikiragError

    state = deployed_ingest(return_state=True)
    assert state.is_failed()
    with pytest.raises(WikiragError, match="^ingest-deployment: give dump_site .* or config .*"):
        state.result()
    assert not worker_env.exists()
