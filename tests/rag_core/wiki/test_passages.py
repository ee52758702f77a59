"""Passages: DPR windows, stable ids, counts that add up."""

from __future__ import annotations

import bz2
import re
from dataclasses import replace
from pathlib import Path

import pyarrow.compute as pc

from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.multistream import iter_shard_pages, plan_shards, read_index
from rag_core.wiki.passages import PASSAGE_SCHEMA, passages_from_pages, windows
from tests.conftest import MULTISTREAM, MULTISTREAM_INDEX, SAMPLE_BZ2
from tests.helpers.dumpfiles import export_xml, page_xml


def test_windows_are_disjoint_and_cover_every_word() -> None:
    text = " ".join(f"w{i}" for i in range(250))
    got = windows(text, 100)
    assert [len(w) for w in got] == [100, 100, 50]
    assert sum(got, []) == text.split()
    assert windows("", 100) == []


def test_sample_counts(wiki: Path) -> None:
    passages, redirects, counts = passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))))
    assert (counts.pages, counts.redirects, counts.articles) == (206, 100, 106)
    # 8 articles carry a disambiguation template (5 of them have "(disambiguation)" in the title).
    assert counts.disambiguation == 8 and counts.chunked == 98 and counts.other_namespace == 0
    assert counts.inconsistencies() == []
    assert passages.schema == PASSAGE_SCHEMA and passages.num_rows == counts.passages
    assert redirects.num_rows == 100
    assert pc.max(passages["n_words"]).as_py() == 100 and pc.min(passages["n_words"]).as_py() >= 1
    assert len(set(passages["passage_id"].to_pylist())) == passages.num_rows
    assert len(set(passages["page_id"].to_pylist())) == 98
    titles = set(passages["title"].to_pylist())
    assert "Anarchism" in titles and "Austin (disambiguation)" not in titles and "Alien" not in titles
    kept = passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))), skip_disambiguation=False)[2]
    assert kept.chunked == 106 and kept.disambiguation == 0


def test_ids_are_stable_across_formats_and_runs(wiki: Path, sample_xml: Path) -> None:
    def ids(pages) -> list[str]:
        return passages_from_pages(pages)[0]["passage_id"].to_pylist()

    dump = DumpSource(str(MULTISTREAM))
    shards = plan_shards(read_index(DumpSource(str(MULTISTREAM_INDEX))), dump.size(), 3)
    from_shards = [i for s in shards for i in ids(iter_shard_pages(dump, s))]
    first = ids(iter_pages(DumpSource(str(SAMPLE_BZ2))))
    assert first == ids(iter_pages(DumpSource(str(SAMPLE_BZ2))))
    assert first == ids(iter_pages(DumpSource(str(sample_xml)))) == from_shards
    xml = bz2.decompress(SAMPLE_BZ2.read_bytes()).decode()
    revision = re.search(r"<id>12</id>\s*<revision>\s*<id>(\d+)</id>", xml).group(1)
    assert first[0] == f"12-{revision}-0"  # Anarchism's first window, from its page and revision ids


def test_an_edit_changes_only_that_article_ids(wiki: Path) -> None:
    pages = [p for p in iter_pages(DumpSource(str(SAMPLE_BZ2)))][:40]
    before = passages_from_pages(pages)[0]
    target = next(p for p in pages if p.title == "Anarchism")
    edited = [replace(p, revision_id=p.revision_id + 1, text=p.text + "\nOne more sentence.") if p is target else p
              for p in pages]
    after = passages_from_pages(edited)[0]
    changed = set(before["passage_id"].to_pylist()) ^ set(after["passage_id"].to_pylist())
    assert changed and all(pid.startswith(f"{target.page_id}-") for pid in changed)


def test_empty_and_other_namespace_pages_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "small.xml"
    path.write_text(export_xml([
        page_xml(1, "Real", "Some real words here."),
        page_xml(2, "Only template", "{{Infobox|a=b}}"),
        page_xml(3, "Blank", "   "),
        page_xml(4, "Deleted", None, deleted=True),
        page_xml(5, "Template:Box", "{{{1}}}", ns=10),
        page_xml(6, "Moved", "", redirect="Real"),
    ]))
    passages, redirects, counts = passages_from_pages(iter_pages(DumpSource(str(path))))
    assert (counts.pages, counts.articles, counts.chunked, counts.empty) == (6, 4, 1, 3)
    assert (counts.other_namespace, counts.redirects) == (1, 1)
    assert counts.inconsistencies() == []
    assert passages["text"].to_pylist() == ["Some real words here."]
    assert redirects.to_pylist() == [{"page_id": 6, "title": "Moved", "target": "Real"}]
