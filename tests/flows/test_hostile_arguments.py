"""Guarantee: an odd argument is one ``wikirag: error:`` line naming it, exit 2, before any work starts.

Every case runs the real CLI entry point against a real published version;
none may start a flow, change the store or print a traceback.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cli.wikirag import main
from tasks.adapters.index_queries import MAX_K
from tests.conftest import MULTISTREAM
from tests.flows.conftest import PublishedIndex

DUMP = str(MULTISTREAM)
# (arguments, what the one line must say); {store}, {version}, {file}, {dump} are filled in per test
CASES = {
    "index shards negative": (["index-rebuild", "{dump}", "--shards", "-1"], "--shards -1: Input should be greater"),
    "ingest shards negative": (["ingest", "{dump}", "--shards", "-3"], "--shards -3: Input should be greater"),
    "words 0": (["ingest", "{dump}", "--words", "0"], "field 'words_per_passage': Input should be greater"),
    "workers 0": (["ingest", "{dump}", "--workers", "0"], "--workers 0: Input should be greater"),
    "recall target 1.5": (["index-rebuild", "{dump}", "--recall-target", "1.5"],
                          "--recall-target 1.5: Input should be less than or equal to 1"),
    "k 0": (["search", "Who was Achilles?", "-k", "0"], "-k 0: Input should be greater"),
    "k negative": (["search", "Who was Achilles?", "-k", "-7"], "-k -7: Input should be greater"),
    "k over the cap": (["search", "Who was Achilles?", "-k", str(MAX_K + 1)],
                       f"-k {MAX_K + 1} is over the cap of {MAX_K} passages per question; ask for at most {MAX_K}"),
    "k huge": (["search", "Who was Achilles?", "-k", str(10**9)], f"-k {10**9} is over the cap of {MAX_K}"),
    "n-docs 0": (["ask", "Who was Achilles?", "--n-docs", "0", "--generator", "{generator}"],
                 "--n-docs must be 1 to 20, got 0"),
    "n-docs 100": (["ask", "Who was Achilles?", "--n-docs", "100", "--generator", "{generator}"],
                   "--n-docs must be 1 to 20, got 100: RAG-Sequence scores each passage's reply against every passage"),
    "ask a registered model with zero-shot flags": (
        ["ask", "Who was Achilles?", "--model", "models:/wikirag-qa/1", "--n-docs", "5", "--kind", "token"],
        "--kind token, --n-docs 5: choose the zero-shot model's parts; models:/wikirag-qa/1 brings its own"),
    "ingest a file that is no dump": (["ingest", "{file}"],
                                      "{file}: neither XML nor bz2-compressed XML; give a MediaWiki export"),
    "rebuild a missing dump": (["index-rebuild", "{file}.missing.xml.bz2"],
                               "{file}.missing.xml.bz2: no such file; check the path or URL"),
    "run on a file that is no dump": (["run", "--dump", "file://{file}"], "file://{file}: neither XML nor bz2"),
    "empty question": (["search", ""], "no questions: give them as arguments"),
    "blank question": (["search", "  \t "], "no questions: give them as arguments"),
    "empty ask": (["ask", "", "--generator", "{generator}"], "no questions: give them as arguments"),
    "empty questions file": (["search", "--questions", "{empty}"], "no questions: give them as arguments"),
    "missing questions file": (["search", "--questions", "{file}.missing"], ".missing: cannot read the questions file"),
    "store is a file": (["search", "Who was Achilles?", "--store", "{file}"], "{file}: a file, not a folder"),
    "list a store that is a file": (["indexes", "--store", "{file}"], "{file}: a file, not a folder"),
    "version with ..": (["search", "Who was Achilles?", "--version", "../{version}"], "is not an index version name"),
    "version with /": (["indexes", "show", "a/{version}"], "is not an index version name"),
    "delete ..": (["indexes", "delete", ".."], "'..' is not an index version name"),
    "pin outside": (["indexes", "pin", "../../etc", "--by", "me"], "'../../etc' is not an index version name"),
    "delete the LATEST file": (["indexes", "delete", "LATEST"], "'LATEST' is not an index version name"),
    "delete LATEST's version": (["indexes", "delete", "{version}"],
                                ("held by LATEST; LATEST points at it: publish another version first or force "
                                 "the delete")),
}


@pytest.fixture
def fill(published_index: PublishedIndex, tmp_path: Path, home: Path) -> dict[str, str]:
    (tmp_path / "a-file").write_text("not a folder\n")
    (tmp_path / "empty.txt").write_text("\n \n")
    return {"store": str(published_index.store), "version": published_index.version, "dump": DUMP,
            "file": str(tmp_path / "a-file"), "empty": str(tmp_path / "empty.txt"),
            "generator": str(published_index.generator)}


def _snapshot(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(CASES))
def test_an_odd_argument_is_one_line_and_exit_2(case: str, fill: dict[str, str], published_index: PublishedIndex,
                                                home: Path, capsys: pytest.CaptureFixture) -> None:
    args, expected = CASES[case]
    argv = [a.format(**fill) for a in args]
    if "--store" not in argv:
        argv += ["--store", fill["store"]]
    before = _snapshot(published_index.store)
    code = main(argv)
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), (argv, out, err)
    assert len(err.splitlines()) == 1 and err.startswith("wikirag: error: "), err
    assert expected.format(**fill) in err, err
    assert _snapshot(published_index.store) == before  # refused before any work
    assert not (home / "prefect").exists()  # no flow was started for it


def test_k_at_the_cap_and_a_100_kb_question_still_answer_within_bounds(fill: dict[str, str], home: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """Not errors: a k up to MAX_K is further held to the passages there are (no padding rows), a question is held
    to the encoder's max_length, with a warning that says so."""
    question = "Who was Achilles? " * 5600  # ~100 KB
    assert len(question.encode()) > 100_000
    assert main(["search", question, "-k", str(MAX_K), "--json", "--store", fill["store"]]) == 0
    out, err = capsys.readouterr()
    [line] = out.splitlines()
    hits = json.loads(line)["results"]
    assert len(hits) == 30  # every passage of the index, once
    assert "the question 'Who was Achilles? Who was Achilles? Who '... is " in err
    assert re.search(r"is [\d,]+ tokens; the question encoder reads its first \d+, so the rest", err)
    assert "indexing errors" not in err  # transformers' own length warning stays quiet
    assert len({h["passage_id"] for h in hits}) == 30


def test_deleting_the_latest_pointer_file_leaves_one_line_on_the_next_search(published_index: PublishedIndex,
                                                                             tmp_path: Path, home: Path,
                                                                             capsys: pytest.CaptureFixture) -> None:
    store = tmp_path / "store"
    shutil.copytree(published_index.store, store)
    (store / "indexes" / "LATEST").unlink()  # by hand: the CLI refuses to
    assert main(["search", "Who was Achilles?", "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert err == f"wikirag: error: {store}/indexes: no index has been published here (no LATEST); build one first\n"
    assert main(["search", "Who was Achilles?", "--version", published_index.version, "--store", str(store)]) == 0


def test_a_workspace_that_is_a_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "home").write_text("not a folder\n")
    monkeypatch.setenv("WIKIRAG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WIKIRAG_STORE", raising=False)
    assert main(["indexes"]) == 2
    assert capsys.readouterr().err == (f"wikirag: error: {tmp_path / 'home'}: a file, not a folder; point "
                                       "the workspace (--home, WIKIRAG_HOME) at a folder (new or existing)\n")
