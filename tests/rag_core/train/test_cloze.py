"""The cloze task on the real sample's passages, published on a store and read back as a user's index would be."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag_core.evaluate.normalize import normalize_answer
from rag_core.evaluate.retrieval import has_answer
from rag_core.storage import Store
from rag_core.train import ClozeConfig, Example, Provenance, cloze_examples, cloze_task, load_task, write_examples
from rag_core.train.cloze import guessable, salient_spans, sentences
from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.ingest import publish, read_passages, stage_part
from rag_core.wiki.passages import passages_from_pages
from tests.conftest import SAMPLE_BZ2

DUMP_ID = "sample-cloze"


@pytest.fixture(scope="module")
def store(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The sample's passages published on a local store, the way ingest publishes them."""
    store = Store(str(tmp_path_factory.mktemp("store")))
    passages, redirects, counts = passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))))
    record = stage_part(store, DUMP_ID, "test", 0, passages, redirects, counts)
    publish(store, DUMP_ID, "test", {"parts": [record]})
    return store


@pytest.fixture(scope="module")
def task(store: Store):
    return cloze_task(store, DUMP_ID, ClozeConfig(seed=7))


def test_questions_are_answerable_from_their_passage_and_not_guessable(store: Store, task) -> None:
    passages = read_passages(store, DUMP_ID).to_pandas().set_index("passage_id")
    assert len(task.train) > 1000 and len(task.dev) > 100
    for example in task.train + task.dev:
        (prov,) = example.provenance
        passage = passages.loc[prov.passage_id]  # the passage is in the published set the index is built from
        assert str(passage.page_id) == prov.wikipedia_id and passage.title == prov.title
        (target,) = example.targets
        title, _, masked = example.input.partition(": ")
        assert title == passage.title and masked.count("[MASK]") == 1
        assert masked.replace("[MASK]", target) in passage.text  # one sentence of the passage, span restored
        assert has_answer(example, passage.text)  # what answer_recall@k will look for is there
        rest = f" {normalize_answer(masked.replace('[MASK]', ' '))} "
        assert f" {normalize_answer(target)} " not in rest  # the answer does not show elsewhere in its sentence
        assert f" {normalize_answer(target)} " not in f" {normalize_answer(title)} "


def test_split_by_page_with_no_shared_question(task) -> None:
    train_pages = {e.provenance[0].wikipedia_id for e in task.train}
    dev_pages = {e.provenance[0].wikipedia_id for e in task.dev}
    assert not train_pages & dev_pages
    assert dev_pages == {str(p) for p in task.dev_pages}
    assert 0.03 < len(dev_pages) / (len(train_pages) + len(dev_pages)) < 0.3  # about dev_fraction=0.1 of 98 articles
    train_inputs = {normalize_answer(e.input) for e in task.train}
    assert not train_inputs & {normalize_answer(e.input) for e in task.dev}
    assert len(train_inputs) == len(task.train)


def test_all_span_kinds_are_asked(task) -> None:
    assert set(task.counts) == {"date", "number", "name"}
    assert min(task.counts.values()) > 0.1 * sum(task.counts.values())
    assert sum(task.counts.values()) == len(task.train) + len(task.dev)


def test_deterministic_given_the_seed(store: Store, task) -> None:
    passages = read_passages(store, DUMP_ID).slice(0, 1000)
    base = cloze_examples(passages, ClozeConfig(seed=7))
    again = cloze_examples(passages, ClozeConfig(seed=7))
    assert again.train == base.train and again.dev == base.dev
    assert set(base.train) <= set(task.train)  # the same draw per passage as on the whole set
    other = cloze_examples(passages, ClozeConfig(seed=8))
    assert other.dev_pages != base.dev_pages and other.train != base.train
    # Order-free: the draw depends on the seed and the ids, not on where a passage sits in the table.
    shuffled = cloze_examples(passages.take(np.random.default_rng(0).permutation(passages.num_rows)),
                              ClozeConfig(seed=7))
    assert set(shuffled.train) == set(base.train) and set(shuffled.dev) == set(base.dev)
    two = cloze_examples(passages, ClozeConfig(seed=7, per_passage=2))
    assert len(two.train) > len(base.train) and two.dev_pages == base.dev_pages


def test_streamed_in_blocks_and_sampled(store: Store, task) -> None:
    streamed = cloze_task(store, DUMP_ID, ClozeConfig(seed=7), block_rows=700)  # 7 blocks of a 4,391-row set
    assert streamed.train == task.train and streamed.dev == task.dev
    sampled = cloze_task(store, DUMP_ID, ClozeConfig(seed=7, max_passages=500))
    assert sampled.dev_pages == task.dev_pages  # the held-out pages do not depend on the sample
    assert 250 < len(sampled.train) + len(sampled.dev) < 600
    assert sampled == cloze_task(store, DUMP_ID, ClozeConfig(seed=7, max_passages=500))


def test_round_trip_through_the_examples_file(task, tmp_path: Path) -> None:
    url = write_examples(task.dev, str(tmp_path / "cloze" / "dev.jsonl"))
    assert load_task("cloze", url) == task.dev
    every_field = Example("x", "T: [MASK] is.", ("a", "b"), "cloze", answer_regex="a|b", label="L",
                          provenance=(Provenance("1", "T", "1-2-3"), Provenance(title="U")))
    assert load_task("cloze", write_examples([every_field], str(tmp_path / "all.jsonl"))) == [every_field]


@pytest.mark.parametrize(("sentence", "spans"), [
    ("On 14 December 1972, Eugene Cernan left the Moon with 110 kg of samples.",
     [("14 December 1972", "date"), ("Eugene Cernan", "name"), ("110", "number")]),
    ("In World War II the Royal Air Force lost 8,325 aircraft in 1943.",
     [("World War II", "name"), ("Royal Air Force", "name"), ("8,325", "number"), ("1943", "date")]),
    ("The committee met on July 12, 1776 and again in May 1786 to discuss 3.5 percent.",
     [("July 12, 1776", "date"), ("May 1786", "date"), ("3.5", "number")]),
    ("Examples of Lewis acids include 2 cations.", []),  # sentence-initial capitals are not names; 1 digit is no number
])
def test_salient_spans(sentence: str, spans: list[tuple[str, str]]) -> None:
    assert [(sentence[s.start:s.end], s.kind) for s in salient_spans(sentence)] == spans


def test_sentences_keep_abbreviations_and_drop_fragments() -> None:
    text = ("of the war ended. The Spirit of St. Louis flew in 1927. J. Smith met Dr. Jones in the U.S. and left. "
            "It was cut off mid")
    assert [text[a:b] for a, b in sentences(text)] == [
        "The Spirit of St. Louis flew in 1927.", "J. Smith met Dr. Jones in the U.S. and left."]


def test_spans_that_give_themselves_away_are_skipped() -> None:
    sentence = "Paris is the capital; Paris has 2,100,000 people and Victor Hugo wrote of Hugo's city."
    spans = {sentence[s.start:s.end]: s for s in salient_spans(sentence)}
    assert guessable(sentence, spans["Victor Hugo"], "France")  # "Hugo" shows again
    assert not guessable(sentence, spans["2,100,000"], "France")
    assert guessable(sentence, spans["2,100,000"], "2,100,000")  # in the title

