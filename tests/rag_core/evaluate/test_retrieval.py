"""Retrieval recall: hand-made passage lists, and cloze questions against a real MiniLM index of the sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_core.evaluate import RetrievedPassage, has_answer, retrieval_scores, retrieved_passages, score
from rag_core.train import Example, Provenance, load_task
from tests.rag_core.train.qafiles import qa_file


def _p(passage_id: str, title: str, text: str) -> RetrievedPassage:
    return RetrievedPassage(passage_id, title, text)


def test_answer_recall_uses_normalised_words_or_the_regex() -> None:
    nq = Example("1", "when was the last moon landing", ("December 1972",), "nq")
    assert has_answer(nq, "Apollo 17 landed in December, 1972.")  # punctuation and case normalised
    assert not has_answer(nq, "Apollo 17 landed in December 19722.")  # whole words only
    trec = Example("2", "q", ("September",), "curatedtrec", answer_regex="Sept?(ember)?")
    assert has_answer(trec, "held each sept in New York")  # searched anywhere in the text, case-blind
    retrieved = [[_p("1-1-0", "A", "nothing"), _p("2-1-0", "B", "In December 1972 it left")],
                 [_p("3-1-0", "C", "Sept."), _p("4-1-0", "D", "x")]]
    assert retrieval_scores([nq, trec], retrieved, (1, 2, 5), answers=True) == {
        "answer_recall@1": 0.5, "answer_recall@2": 1.0}  # k runs up to the passages there are


def test_page_recall_by_wikipedia_id_or_title_and_passage_recall() -> None:
    by_id = Example("1", "q", ("a",), "kilt", provenance=(Provenance("10593264", "Therefore sign"),))
    by_title = Example("2", "q", ("SUPPORTS",), "kilt", provenance=(Provenance(title="Soul Food (film)"),))
    none = Example("3", "q", ("a",), "kilt")
    retrieved = [
        [_p("5-1-0", "Other", ""), _p("10593264-99-3", "Renamed since", "")],  # the page id matches
        [_p("7-1-0", "soul_Food_(film)", "")],  # underscores and a lower-case first letter name the same page
        [_p("10593264-1-0", "Therefore sign", "")],  # no provenance: not counted
    ]
    out = retrieval_scores([by_id, by_title, none], retrieved, (1, 2), answers=False)
    assert out == {"page_recall@1": 0.5, "page_recall@2": 1.0}
    cloze = Example("4", "t: [MASK] x.", ("y",), "cloze", provenance=(Provenance("9", "T", "9-1-2"),))
    out = retrieval_scores([cloze], [[_p("9-1-1", "T", "y"), _p("9-1-2", "T", "y")]], (1, 2), answers=True)
    assert out == {"answer_recall@1": 1.0, "page_recall@1": 1.0, "passage_recall@1": 0.0,
                   "answer_recall@2": 1.0, "page_recall@2": 1.0, "passage_recall@2": 1.0}


def test_kilt_score_with_retrieval() -> None:
    examples = load_task("kilt", str(qa_file("kilt/nq-dev-kilt.jsonl")))
    retrieved = retrieved_passages([["10593264-1-0"]] * len(examples), [["Therefore sign"]] * len(examples),
                                   [["the therefore sign ( ∴ ) is used"]] * len(examples))
    out = score("kilt", examples, ["therefore sign"] * len(examples), retrieved)
    assert out["page_recall@1"] == pytest.approx(1 / len(examples))  # only the first question is about that page
    assert out["answer_recall@1"] == pytest.approx(1 / len(examples))


@pytest.mark.slow
def test_cloze_answers_are_retrievable_from_a_real_index(wiki: Path, tmp_path: Path) -> None:
    """Cloze questions of the sample, asked of a real MiniLM index of their passages: the passage comes back."""
    from rag_core.perf.precision import choose_precision
    from rag_core.index.encoders import Encoder, EncoderConfig
    from rag_core.model.retriever import IndexRetriever
    from rag_core.storage import Store
    from rag_core.train.cloze import ClozeConfig, cloze_examples
    from rag_core.wiki.dumps import DumpSource, iter_pages
    from rag_core.wiki.passages import passages_from_pages
    from tests.conftest import SAMPLE_BZ2
    from tests.helpers.passagefiles import publish_small_index

    passages = passages_from_pages(iter_pages(DumpSource(str(SAMPLE_BZ2))))[0].slice(0, 120)
    store = Store(str(tmp_path))
    encoder = Encoder.load(EncoderConfig(dtype=choose_precision("auto").dtype))
    publish_small_index(store, "sample", passages, encoder, shards=2)
    task = cloze_examples(passages, ClozeConfig(seed=0))
    examples = task.train + task.dev
    retriever = IndexRetriever.load(store)
    found = retriever.retrieve(encoder.encode_questions([e.input for e in examples]), 5)
    retrieved = retrieved_passages(found.passage_ids, found.titles, found.texts)
    out = score("cloze", examples, [e.targets[0] for e in examples], retrieved)
    assert out["em"] == 1.0
    assert out["passage_recall@5"] >= 0.8 and out["page_recall@5"] >= out["passage_recall@5"]
    assert out["answer_recall@5"] >= out["passage_recall@5"]  # the passage holds the span
