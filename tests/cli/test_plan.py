"""``wikirag plan``: a real multistream dump of the sample's pages, calibrated with a real tiny encoder, in process."""

from __future__ import annotations

import bz2
import json
from pathlib import Path

import pytest

from cli.wikirag import main
from tests.helpers.encoderfiles import save_tiny_bert
from tests.rag_core.capacity.sample_dump import sample_multistream

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def dump(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("plan-cli")
    path, index = sample_multistream(folder, n_pages=30, per_stream=5)
    return path, index, save_tiny_bert(folder / "tiny")


def wikirag(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prints_the_predictions_as_json(dump, home: Path, capsys: pytest.CaptureFixture) -> None:
    path, index, tiny = dump
    code, out, _ = wikirag(capsys, "plan", str(path), "--index", str(index), "--workers", "2", "--encoder", str(tiny),
                           "--encoder-dtype", "float32", "--disk-gb", "100", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["pages"] == 30 and plan["passages"] > 30 and plan["workers"] == 2
    assert plan["factory"] == "Flat" and plan["shards"] == 4 and plan["fits"]
    assert set(plan["disk_gb"]) == {"dump", "passages", "embeddings", "index"}
    assert plan["hours_total"] > 0 and plan["worker_memory_gb"] > 0
    assert not (home / "store").exists()  # planning writes nothing to the store


def test_a_rebuild_that_does_not_fit_is_refused_in_one_line(dump, home: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    path, index, tiny = dump
    code, out, err = wikirag(capsys, "plan", str(path), "--index", str(index), "--workers", "1", "--encoder",
                             str(tiny), "--encoder-dtype", "float32", "--disk-gb", "0.0001", "--worker-memory-gb",
                             "0.01")
    assert code == 2
    line, = err.strip().splitlines()[-1:]
    assert line.startswith(f"wikirag: error: {path}: a rebuild of ") and "does not fit" in line
    assert "(budget 0.0001 GB)" in line and "(budget 0.01 GB)" in line
    assert "does NOT fit" in out  # the figures are printed above the refusal


def test_a_missing_dump_is_named_as_missing_not_as_one_without_an_index(home: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "enwiki-pages-articles.xml.bz2"  # no multistream name either: the missing file comes first
    code, out, err = wikirag(capsys, "plan", str(missing))
    assert (code, out) == (2, "")
    assert err.strip().splitlines()[-1] == f"wikirag: error: {missing}: no such file; check the path or URL"


def test_a_malformed_index_is_named(dump, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path, _, tiny = dump
    bad = tmp_path / "enwiki-bad-index.txt.bz2"
    bad.write_bytes(bz2.compress(b"0:1:Title\nnot an index line\n"))
    code, out, err = wikirag(capsys, "plan", str(path), "--index", str(bad), "--encoder", str(tiny))
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == ("wikirag: error: enwiki-bad-index.txt.bz2: line 2 is not "
                                           "'offset:page_id:title'; give the dump's multistream index")


def test_index_rebuild_with_a_budget_it_does_not_fit_is_refused_before_any_work(
        dump, home: Path, capsys: pytest.CaptureFixture) -> None:
    path, index, tiny = dump
    code, out, err = wikirag(capsys, "index-rebuild", str(path), "--index", str(index), "--workers", "1",
                             "--encoder", str(tiny), "--encoder-dtype", "float32", "--disk-gb", "0.0001")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"wikirag: error: {path}: a rebuild of ")
    assert "(budget 0.0001 GB)" in err
    assert not (home / "store").exists() and not (home / "prefect").exists()  # no ingest, no Prefect server
