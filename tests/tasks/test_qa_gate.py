"""The gate on real questions (tasks/qa_gate.py, tasks.adapters.mlflow_registry.gate) on a real MLflow store, a
real index of the sample's passages and real (tiny) transformers models: a model that does not beat its zero-shot
start on the held-out test questions is not champion, and the summary says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from rag_core.evaluate.paired import beyond_chance
from rag_core.evaluate.real_questions import SPLITS, answer_in_output, real_questions, split_of
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.model.answers import weak_match_note
from rag_core.model.generators import GeneratorConfig
from rag_core.model.rag_model import RagConfig, RagModel
from rag_core.model.retriever import IndexRetriever
from rag_core.storage import Store
from rag_core.train.loaders import load_task
from tasks.adapters.mlflow_registry import CHALLENGER, CHAMPION, log_rag_model, model_name, register
from tasks.adapters.mlflow_tracking import tracked_run
from tasks.qa_gate import QA_TASK, ModelScores, QAGate, qa_answers, qa_gate, real_question_files, rejudge_champion
from tasks.reports import ASK_KEY, gate_sentence, summary_markdown
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.generatorfiles import save_tiny_llama
from tests.helpers.passagefiles import publish_small_index, sample_passages

QA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "qa"


@pytest.fixture(scope="module")
def small_index(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, str, Path, RagModel]:
    """The sample's first 400 real passages (7 articles) under a tiny BERT, and a RAG model over them (tiny Llama)."""
    root = tmp_path_factory.mktemp("qa-gate")
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(root / "encoder")), dtype="float32"))
    store = Store(str(root / "store"))
    version = publish_small_index(store, "d1", sample_passages().slice(0, 400), encoder, shards=2)
    config = RagConfig(n_docs=2, question_encoder=encoder.config,
                       generator=GeneratorConfig(path=str(save_tiny_llama(root / "llama"))))
    model = RagModel.create(config, IndexRetriever.load(store, version))
    return store, version, model.save_pretrained(root / "rag"), model


def _logged(uri: str, store: Store, version: str, model_dir: Path, task: str) -> tuple[str, str]:
    """(run id, logged model URI) of ``model_dir`` logged into a new run of experiment ``wikirag-<task>``."""
    with tracked_run(uri, f"wikirag-{task}", "finetune") as run:
        return run.run_id, log_rag_model(uri, run.run_id, model_dir, store_url=store.url, index_version=version)


def _champion(client: MlflowClient, name: str) -> str | None:
    try:
        return str(client.get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException:
        return None


def test_the_gate_refuses_a_worse_model(small_index, tmp_path: Path) -> None:
    store, version, model_dir, _ = small_index
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    name = model_name(QA_TASK)

    def gated(value: float, zero_shot: float):
        run_id, model_uri = _logged(uri, store, version, model_dir, QA_TASK)
        return register(uri, model_uri, QA_TASK, run_id=run_id, metric="test_em", value=value, margin=0.0,
                        store=store, index_version=version, baseline=zero_shot)

    worse = gated(0.20, zero_shot=0.30)  # the first version, yet below its zero-shot start: no champion at all
    assert worse.alias == CHALLENGER and "does not beat its zero-shot start's 0.3000" in worse.reason
    assert _champion(client, name) is None
    assert "kept as challenger" in client.get_model_version(name, worse.version).tags["promotion"]
    tie = gated(0.30, zero_shot=0.30)  # equal is not better
    assert tie.alias == CHALLENGER and _champion(client, name) is None
    better = gated(0.40, zero_shot=0.30)
    assert better.alias == CHAMPION and _champion(client, name) == better.version == "3"
    below_champion = gated(0.35, zero_shot=0.30)  # beats its own start, not the champion
    assert below_champion.alias == CHALLENGER and "< champion v3's 0.4000" in below_champion.reason
    assert _champion(client, name) == "3"


def test_a_win_within_chance_is_not_promoted(small_index, tmp_path: Path) -> None:
    """A higher test EM from 5 answers gained and 4 lost against the start (one question in 40, what chance gives)
    stays challenger; 9 gained and 1 lost (p = 0.02) is champion."""
    store, version, model_dir, _ = small_index
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)

    def gated(value: float, zero_shot: float, changed: tuple[int, int]):
        run_id, model_uri = _logged(uri, store, version, model_dir, QA_TASK)
        return register(uri, model_uri, QA_TASK, run_id=run_id, metric="test_em", value=value, margin=0.0,
                        store=store, index_version=version, baseline=zero_shot, changed=changed)

    lucky = gated(0.375, zero_shot=0.35, changed=(5, 4))
    assert lucky.alias == CHALLENGER and _champion(client, model_name(QA_TASK)) is None
    assert lucky.reason == ("test_em 0.3750 is above its zero-shot start's 0.3500 by 5 answers gained and 4 lost, "
                            "within chance (two-sided sign test p = 1.000, promotion needs < 0.05): kept as challenger")
    one_sided = gated(0.45, zero_shot=0.35, changed=(4, 0))  # all four changes for the better: still p = 0.125
    assert one_sided.alias == CHALLENGER
    better = gated(0.55, zero_shot=0.35, changed=(9, 1))
    assert better.alias == CHAMPION and _champion(client, model_name(QA_TASK)) == better.version


def test_a_champion_placed_by_the_earlier_rule_is_judged_again(small_index, tmp_path: Path) -> None:
    """A workspace's wikirag-qa champion from before the chance rule (its report has no rule): a lead of 5 answers
    gained and 4 lost loses the alias on the next gate, tagged with why; a clear lead keeps it."""
    store, version, model_dir, _ = small_index
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    name = model_name(QA_TASK)

    def old_champion(gained: int, lost: int) -> str:
        run_id, model_uri = _logged(uri, store, version, model_dir, QA_TASK)
        promotion = register(uri, model_uri, QA_TASK, run_id=run_id, metric="test_em", value=0.35 + gained / 100,
                             margin=0.0, store=store, index_version=version, baseline=0.30)  # the old rule: means
        assert promotion.alias == CHAMPION
        old = _report(14, 14 + gained - lost, gained, lost).model_dump(exclude={"rule"})
        client.set_model_version_tag(name, promotion.version, "qa_gate", json.dumps({**old, "alias": CHAMPION}))
        return promotion.version

    lucky = old_champion(5, 4)
    rejudge_champion(client)
    assert _champion(client, name) is None
    tags = client.get_model_version(name, lucky).tags
    assert tags["promotion"].startswith("demoted: champion under gate rule 1; its lead over its zero-shot start (5 "
                                        "answers gained, 4 lost, two-sided sign test p = 1.000) is within chance")
    assert QAGate.model_validate_json(tags["qa_gate"]).alias == "none"
    clear = old_champion(9, 1)
    rejudge_champion(client)
    assert _champion(client, name) == clear  # p = 0.021: kept


def _report(zero_shot: int, fine_tuned: int, gained: int | None, lost: int | None, n: int = 40) -> QAGate:
    scores = {model: ModelScores(em=right / n, f1=right / n, answer_in_output=right / n, examples=n)
              for model, right in (("zero-shot", zero_shot), ("fine-tuned", fine_tuned), ("closed-book", 6))}
    promoted = fine_tuned > zero_shot and (gained is None or beyond_chance(gained, lost))  # the gate's rule
    return QAGate(test_questions=n, sources={"written": n}, scores=scores, name="wikirag-qa", version="2",
                  alias=CHAMPION if promoted else CHALLENGER, reason="", gained=gained, lost=lost)


def test_the_summary_says_how_many_answers_changed_each_way_and_whether_that_is_chance() -> None:
    narrow = gate_sentence(_report(14, 15, gained=3, lost=2))  # one question in 40: what chance gives
    assert narrow.startswith("The fine-tune scored above its zero-shot start (test EM 0.375 vs its zero-shot start's "
                             "0.350 on 40 held-out questions), but its lead is within chance (below), so wikirag-qa "
                             "v2 is not promoted (challenger).")
    assert narrow.endswith("it answers 3 exactly that its start missed and misses 2 that its start answered: within "
                           "chance (two-sided sign test, p = 1.000).")
    clear = gate_sentence(_report(14, 22, gained=9, lost=1))  # 2 * P(X <= 1), X ~ Binomial(10, 1/2) = 0.0215
    assert clear.endswith("answers 9 exactly that its start missed and misses 1 that its start answered: more than "
                          "chance (two-sided sign test, p = 0.021).")
    assert clear.startswith("wikirag-qa v2 is champion: the fine-tune beat its zero-shot start (test EM 0.550 vs ")
    tie = gate_sentence(_report(14, 14, gained=3, lost=3))
    assert tie.startswith("The fine-tune did not beat its zero-shot start") and tie.endswith("p = 1.000).")
    before = gate_sentence(_report(14, 15, gained=None, lost=None))  # a report made before answers were counted
    assert before.endswith("on 40 held-out questions).") and "Question by question" not in before


def test_the_summary_marks_weak_matches_and_names_the_gated_model_as_consumers_load_it() -> None:
    from types import SimpleNamespace

    from flows.finetune import FinetuneOutcome

    questions = SimpleNamespace(counts={"written": {"dev": 10, "test": 40}}, test_size=40, notes=[])
    tuned = FinetuneOutcome(task="generated-qa", run_id="r", index_version="v", dev_examples=8, metric="em",
                            zero_shot=0.375, fine_tuned=0.625, gained=2, lost=0, model_version="1",
                            alias=CHALLENGER, reason="", steps=24, examples_per_s=None)
    answers = [{"question": "Which planet did Galileo observe moons around?", "answer": "Jupiter",
                "provenance": [{"title": "Apollo 8", "passage_id": "a-1", "score": 0.51, "similarity": 0.44},
                               {"title": "Apollo 8", "passage_id": "a-2", "score": 0.49, "similarity": 0.40}]},
               {"question": "Who was the teacher of Alexander the Great?", "answer": "Aristotle",
                "provenance": [{"title": "Aristotle", "passage_id": "b-1", "score": 1.0, "similarity": 0.64}]}]
    # marked as qa_answers marks them, by the note ask prints, for the default MiniLM's measured threshold
    minilm = SimpleNamespace(question_encoder=SimpleNamespace(base_fingerprint={"name": "all-MiniLM-L6-v2"}))
    answers = [{**item, "weak_match": weak_match_note(minilm, item)} for item in answers]
    markdown = summary_markdown("v", 100, [tuned], questions, _report(14, 15, gained=3, lost=2), "zero-shot",
                                answers, [], {})
    assert "| generated-qa | em | 0.375 | 0.625 | 2 / 0 | wikirag-generated-qa v1 | challenger | 24 | 8 |" in markdown
    galileo = markdown.split("**Which planet did Galileo observe moons around?**", 1)[1].splitlines()
    assert galileo[3] == ("  - weak match: the closest passage's similarity is 0.440, under 0.50: the index likely "
                          "does not hold this answer")
    teacher = markdown.split("**Who was the teacher of Alexander the Great?**", 1)[1].splitlines()
    assert "weak match" not in teacher[2]
    assert '- ask the fine-tune: `wikirag ask --model models:/wikirag-qa/2 "your question"`' in markdown
    # a workspace named by --home: the fine-tune's ask line keeps it, as the zero-shot one does
    promoted = summary_markdown("v", 100, [tuned], questions, _report(14, 22, gained=9, lost=1), "wikirag-qa v2",
                                answers, [], {ASK_KEY: 'wikirag --home /w ask "your question"'})
    assert ('- ask the fine-tune: `wikirag --home /w ask --model models:/wikirag-qa@champion "your question"`'
            in promoted)


def test_real_questions_split_and_answerability(wiki: Path) -> None:
    table = sample_passages().slice(0, 400)
    texts: dict[str, list[str]] = {}
    for title, text in zip(table.column("title").to_pylist(), table.column("text").to_pylist()):
        texts.setdefault(title, []).append(text)
    articles = {t: " ".join(parts) for t, parts in texts.items()}
    items, _ = real_questions(articles, QA_DIR if QA_DIR.is_dir() else None)
    assert {i["source"] for i in items} >= {"written"} and {i["split"] for i in items} == set(SPLITS)
    for item in items:
        assert item["split"] == split_of(item["question"]) == split_of(item["question"].upper() + "  ")
        assert answer_in_output(articles[item["article"]], item["answers"]) == 1.0  # answerable from the index
        assert answer_in_output(item["question"], item["answers"]) == 0.0  # the question does not give it away
    written_only, notes = real_questions(articles, None)
    assert {i["source"] for i in written_only} == {"written"} and "written questions only" in notes[-1]
    assert [i for i in items if i["source"] == "written"] == written_only  # public sources only add questions
    assert answer_in_output("It was Aristotle, in 343 BC.", ["aristotle"]) == 1.0
    assert answer_in_output("Aristotelian", ["Aristotle"]) == 0.0  # whole words


def test_a_model_no_better_than_zero_shot_is_registered_but_not_champion(small_index, prefect_server: str,
                                                                          tmp_path: Path) -> None:
    """The whole gate on real evaluation: the same weights as the zero-shot start score the same on the held-out
    test questions, so wikirag-qa is challenger, the demo is answered by the zero-shot model, the summary says so."""
    store, version, model_dir, start = small_index
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    questions = real_question_files(store, version, str(QA_DIR) if QA_DIR.is_dir() else None)
    test = [e.input for e in load_task("nq", questions.test)]
    dev = [e.input for e in load_task("nq", questions.dev)]
    assert len(test) == questions.test_size > 0 and len(dev) == sum(c.get("dev", 0) for c in questions.counts.values())
    assert {split_of(q) for q in dev} == {"dev"} and {split_of(q) for q in test} == {"test"}

    run_id, model_uri = _logged(uri, store, version, model_dir, "generated-qa")
    source = register(uri, model_uri, "generated-qa", run_id=run_id, metric="em", value=0.0, margin=0.0, store=store,
                      index_version=version)
    decoding = {"max_new_tokens": 4, "mode": "fast", "precision": "float32"}
    gate = qa_gate(uri, store, version, questions, "generated-qa", source.version, run_id, start, decoding)
    assert set(gate.scores) == {"zero-shot", "fine-tuned", "closed-book"}
    assert all(s.examples == questions.test_size for s in gate.scores.values())
    assert gate.scores["fine-tuned"].em == gate.scores["zero-shot"].em  # the same weights, the same answers
    assert not gate.beat_zero_shot and gate.alias == CHALLENGER and _champion(client, model_name(QA_TASK)) is None
    metrics = client.get_run(run_id).data.metrics
    assert metrics["test_zero_shot_examples"] == metrics["test_fine_tuned_examples"] == questions.test_size
    assert {"test_closed_book_em", "test_fine_tuned_f1", "test_zero_shot_answer_in_output"} <= set(metrics)
    assert metrics["test_fine_tuned_gained"] == metrics["test_fine_tuned_lost"] == 0
    sentence = gate_sentence(gate)
    assert sentence.startswith("The fine-tune did not beat its zero-shot start (test EM ")
    assert f"on {questions.test_size} held-out questions), so wikirag-qa v{gate.version} is not promoted" in sentence
    assert gate.gained == gate.lost == 0  # the same weights change no answer, and the summary says so
    assert sentence.endswith("Question by question, the fine-tune changed no exact answer.")

    again = qa_gate(uri, store, version, questions, "generated-qa", source.version, run_id, start, decoding)
    assert again.reused and again.version == gate.version and again.scores == gate.scores  # nothing registered again
    assert len(client.search_model_versions(f"name='{model_name(QA_TASK)}'")) == 1

    who, answers = qa_answers(uri, start, ["Who was the teacher of Alexander the Great?"])
    assert who == "zero-shot" and answers[0]["provenance"]
    assert answers[0]["weak_match"] is None  # a tiny random encoder has no measured threshold
