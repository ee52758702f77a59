"""``wikirag dumps check|mirror`` in process against a loopback dump site in Wikimedia's layout: the check's line
and JSON, a mirror through the flow, and the refusals (a wrong published sum, an unknown wiki) as one line each,
with nothing kept at the mirror's keys."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.wikirag import main
from rag_core.storage import Store
from tests.helpers.dumpsite import NEW, OLD, DumpSiteServer, serve_site

pytestmark = pytest.mark.slow


@pytest.fixture
def site(tmp_path: Path) -> Iterator[DumpSiteServer]:
    with serve_site(tmp_path / "site") as running:
        yield running


@pytest.fixture
def api(prefect_server: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    monkeypatch.setenv("PREFECT_HOME", str(home / "prefect"))
    return prefect_server


def test_check_says_what_is_newer_in_a_line_or_json(site: DumpSiteServer, home: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    store = str(tmp_path / "store")
    assert main(["dumps", "check", "--site", site.url, "--store", store]) == 0
    out = capsys.readouterr().out
    assert out.startswith("newer: enwiki-20261120 is complete") and "no dated dump" in out
    assert main(["dumps", "check", "--site", site.url, "--store", store, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["newer"]["dump_id"] == f"enwiki-{NEW}" and found["current"] is None
    assert found["newer"]["dump"] == f"{site.url}/enwiki/{NEW}/enwiki-{NEW}-pages-articles-multistream.xml.bz2"
    assert not Path(store).exists()  # a check writes nothing


def test_mirror_copies_the_newest_dump_and_prints_where(site: DumpSiteServer, api: str, home: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    store = tmp_path / "store"
    assert main(["dumps", "mirror", "--site", site.url, "--store", str(store), "--connections", "1"]) == 0
    dump_url, index_url = capsys.readouterr().out.split()
    assert dump_url == str(store / "dumps" / "enwiki" / NEW / f"enwiki-{NEW}-pages-articles-multistream.xml.bz2")
    assert Path(dump_url).read_bytes() == (site.root / "enwiki" / NEW / Path(dump_url).name).read_bytes()
    assert Path(index_url).read_bytes() == (site.root / "enwiki" / NEW / Path(index_url).name).read_bytes()


def test_a_wrong_published_sum_is_one_line_and_keeps_nothing(site: DumpSiteServer, api: str, home: Path,
                                                             tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = tmp_path / "store"
    code = main(["dumps", "mirror", "--site", site.url, "--wiki", "dewiki", "--store", str(store)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("wikirag: error:")]
    name = f"dewiki-{OLD}-pages-articles-multistream.xml.bz2"
    assert line.startswith(f"wikirag: error: {site.url}/dewiki/{OLD}/{name}: sha1 ")
    assert "nothing was kept" in line
    held = Store(str(store)).files("dumps")
    assert f"dewiki/{OLD}/{name}" not in held and f"dewiki/{OLD}/mirror.json" not in held
    assert [n for n in held if n.startswith("_staging/")] == []


def test_an_unknown_wiki_is_one_line(site: DumpSiteServer, home: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture) -> None:
    code = main(["dumps", "check", "--site", site.url, "--wiki", "nowiki", "--store", str(tmp_path / "store")])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.strip().splitlines()[-1] == (f"wikirag: error: {site.url}/nowiki/: not on the dump site (HTTP 404); "
                                            "check the site and wiki names, or the dump was removed: run the check "
                                            "again")


def test_help_shows_the_config_defaults(capsys: pytest.CaptureFixture) -> None:
    from rag_core.wiki.dump_site import DumpSiteConfig

    with pytest.raises(SystemExit):
        main(["dumps", "mirror", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    defaults = DumpSiteConfig()
    assert f"(default {defaults.site})" in text and f"(default {defaults.wiki})" in text
    assert f"(default {defaults.connections};" in text and f"(default {defaults.piece_bytes >> 20})" in text
