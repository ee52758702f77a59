"""The change report's pure parts: page changes between two real passage sets, answers that changed, the markdown."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from rag_core.evaluate.change_report import (
    ChangeReport,
    ModelChanges,
    answer_changes,
    page_changes,
    page_digests,
    previous_version,
    to_markdown,
)
from rag_core.storage import Store
from tests.helpers.passagefiles import publish_passages, sample_passages
from tests.helpers.refreshfiles import edited


def test_pages_added_changed_removed_between_two_published_passage_sets(wiki: Path, tmp_path: Path) -> None:
    passages = sample_passages().slice(0, 400)
    pages = passages.column("page_id").to_pylist()
    first, last = pages[0], pages[-1]
    kept = passages.filter(pa.compute.not_equal(passages["page_id"], last))  # the last page is removed
    row = kept.slice(5, 1).to_pylist()[0]  # a passage of another page is edited
    changed = edited(kept, row["passage_id"], row["text"].split()[3], "Zanzibar")
    later = next(p for p in sample_passages().column("page_id").to_pylist()[400:] if p not in set(pages))
    added = sample_passages().filter(pa.compute.equal(sample_passages()["page_id"], later))
    store = Store(str(tmp_path / "store"))
    publish_passages(store, "d1", passages)
    publish_passages(store, "d2", pa.concat_tables([changed, added]))

    report = page_changes(page_digests(store, "d1"), page_digests(store, "d2"))
    title = {r["page_id"]: r["title"] for r in sample_passages().to_pylist()}
    assert report.added == [title[added["page_id"][0].as_py()]] and report.removed == [title[last]]
    assert report.changed == [row["title"]] and report.unchanged == len(set(pages)) - 2
    assert first in page_digests(store, "d2")  # an unchanged page keeps its digest
    assert page_changes(page_digests(store, "d1"), page_digests(store, "d1")).changed == []
    assert page_digests(store, "absent") == {}


def test_answers_that_changed_and_the_markdown() -> None:
    old = [{"id": "a", "prediction": "Oldtown"}, {"id": "b", "prediction": "same"}]
    new = [{"id": "a", "prediction": "Ottawa"}, {"id": "b", "prediction": "same"}, {"id": "c", "prediction": "x"}]
    [change] = answer_changes(old, new, {"a": "capital?"}, {"a": ["Ottawa"]}, gold_changed=["a"])
    assert (change.id, change.old_answer, change.new_answer, change.gold_changed) == ("a", "Oldtown", "Ottawa", True)
    assert previous_version(["v1", "v2", "v3"], "v3") == "v2" and previous_version(["v1"], "v1") is None

    report = ChangeReport.model_validate({
        "version": "v2", "previous": "v1", "dump_id": "d2", "previous_dump_id": "d1",
        "pages": {"added": ["New | page"], "changed": ["Quorria"], "removed": [], "unchanged": 5},
        "passages": 10, "encoded": 2, "reused": 8})
    report.models.append(ModelChanges(name="wikirag-cloze", version="1", bound_index="v1", rebound=True,
                                      reason="within 1 point", changed_gold=["a"], answers=[change]))
    text = to_markdown(report)
    assert "| 1 | 1 | 0 | 5 | 10 | 2 | 8 |" in text and "Added: New \\| page." in text
    assert "| capital? | Ottawa | Oldtown | Ottawa | yes |" in text
    assert report.metrics()["dev_answers_changed"] == 1 and report.metrics()["pages_changed"] == 1
