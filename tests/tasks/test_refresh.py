"""The pieces of a refresh on real components: gold passages compared across two published passage sets, the
tolerance rule, and ``rollback`` on a real MLflow store with real index pins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlflow import MlflowClient

from rag_core.evaluate.gold_passages import gold_diff, named_pages, page_texts
from rag_core.index.retention import pin_version, unpin_version, version_pins
from rag_core.index.versions import read_index_manifest
from rag_core.storage import Store
from rag_core.train.examples import Example, Provenance
from tasks.adapters.mlflow_registry import CHAMPION, PREVIOUS_TAG, RollbackError, model_name, pin_name, rollback
from tasks.refresh import Champion, decide, skip_reason
from tests.helpers.refreshfiles import NEW_FACT, TwoVersions, register_trained, two_versions


@pytest.fixture(scope="module")
def versions(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> TwoVersions:
    return two_versions(tmp_path_factory.mktemp("refresh"))


def _texts(versions: TwoVersions, index_version: str, examples: list[Example]):
    dump_id = read_index_manifest(versions.store, index_version).dump_id
    return page_texts(versions.store, dump_id, *named_pages(examples))


def test_only_the_question_whose_gold_passage_changed_is_set_apart(versions: TwoVersions) -> None:
    edited_page = versions.dev[0].provenance[0].passage_id.split("-")[0]
    page_only = Example(id="page-level", input="q?", targets=("a",), kind="nq",
                        provenance=(Provenance(wikipedia_id=edited_page),))
    untouched = next(e for e in versions.dev if e.provenance[0].wikipedia_id != edited_page)
    other_page = Example(id="other-page", input="q?", targets=("a",), kind="nq",
                         provenance=(Provenance(title=untouched.provenance[0].title),))
    no_gold = Example(id="no-gold", input="q?", targets=("a",), kind="nq")
    examples = [*versions.dev, page_only, other_page, no_gold]
    diff = gold_diff(examples, _texts(versions, versions.old, examples), _texts(versions, versions.new, examples))

    assert [c.example_id for c in diff.changed] == [versions.dev[0].id, "page-level"]
    assert [e.id for e in diff.left_out] == [versions.dev[0].id, "page-level"]
    passage = diff.changed[0]
    assert passage.gold == versions.dev[0].provenance[0].passage_id
    assert versions.fact in passage.old_text and NEW_FACT not in passage.old_text
    assert NEW_FACT in passage.new_text and passage.new_text == passage.old_text.replace(versions.fact, NEW_FACT)
    assert diff.changed[1].gold == f"page {edited_page}" and NEW_FACT in diff.changed[1].new_text
    # the rest of the edited page has new passage ids (a new revision) but the same text: compared
    assert [e.id for e in diff.kept] == [e.id for e in versions.dev[1:]] + ["other-page", "no-gold"]
    assert diff.unidentified == ["no-gold"]

    same = gold_diff(examples, _texts(versions, versions.old, examples), _texts(versions, versions.old, examples))
    assert same.changed == [] and len(same.kept) == len(examples)


def test_the_tolerance_is_in_points_of_the_metric() -> None:
    assert decide("em", 0.50, 0.49, 1.0, "a", "b", 10)[0]  # exactly one point worse: within
    assert not decide("em", 0.50, 0.485, 1.0, "a", "b", 10)[0]
    ok, reason = decide("em", 0.50, 0.40, 1.0, "a", "b", 10)
    assert not ok and "10.00 points worse, beyond the tolerance of 1: kept on a" in reason
    assert decide("em", 0.50, 0.60, 0.0, "a", "b", 10) == (True, "em 0.6000 on b vs 0.5000 on a (10 questions): "
                                                                 "within 0 points: re-bound to b")
    ok, reason = decide("em", 0.0, 0.0, 1.0, "a", "b", 0)
    assert not ok and "no dev question" in reason


def test_a_champion_is_never_moved_back_to_an_older_version_nor_evaluated_without_a_dev_set() -> None:
    bound, older, newer = ("20261205T081656.901Z-8a78e82c", "20261105T081656.901Z-0a78e82c",
                           "20270105T081656.901Z-1a78e82c")
    champion = Champion(name="wikirag-cloze", version="3", task_kind="cloze", index_version=bound, store="s",
                        metric="em", dev="dev.jsonl", max_examples=None)
    assert skip_reason(champion, bound) == f"already bound to {bound}"
    assert skip_reason(champion, older) == f"bound to {bound}, newer than {older}; kept"  # a late event
    assert skip_reason(champion, newer) is None
    assert "no dev set recorded" in skip_reason(champion.model_copy(update={"dev": None}), newer)


def test_rollback_restores_the_previous_champion_and_refuses_when_its_index_is_no_longer_pinned(
        versions: TwoVersions, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, name = MlflowClient(tracking_uri=uri), model_name("cloze")
    assert register_trained(uri, versions, versions.old, 0.10) == "1"
    with pytest.raises(RollbackError, match=re.escape(f"{name}: v1 is its first version")):
        rollback(uri, name, Store)
    assert register_trained(uri, versions, versions.new, 0.20) == "2"
    assert client.get_model_version(name, "2").tags[PREVIOUS_TAG] == "1"

    unpin_version(versions.store, versions.old, pin_name(name, "1"))  # as an operator unpinning by hand would
    with pytest.raises(RollbackError) as refused:
        rollback(uri, name, Store)
    assert "\n" not in str(refused.value) and f"{name} v1: its index {versions.old} is no longer pinned" in \
        str(refused.value)
    assert str(client.get_model_version_by_alias(name, CHAMPION).version) == "2"  # nothing moved

    pin_version(versions.store, versions.old, pin_name(name, "1"))
    done = rollback(uri, name, Store)
    assert (done.from_version, done.to_version, done.index_version) == ("2", "1", versions.old)
    champion = client.get_model_version_by_alias(name, CHAMPION)
    assert str(champion.version) == "1" and champion.tags["index_version"] == versions.old
    assert pin_name(name, "1") in version_pins(versions.store, versions.old)
    assert client.get_model_version(name, "2").tags["rolled_back"] == "champion moved back to v1"
    with pytest.raises(RollbackError, match="no champion"):
        rollback(uri, "wikirag-unknown", Store)
