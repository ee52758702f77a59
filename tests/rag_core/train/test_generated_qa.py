"""Generated QA: the question rules on hand-worked sentences, spans on the real sample, the held-out filter,
and the round trip through a real index (real MiniLM, real FAISS) of real sample passages."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from rag_core.storage import Store
from rag_core.train.generated_qa import (
    PAIR_SCHEMA,
    GeneratedQAConfig,
    HeldOut,
    Search,
    ShardPairs,
    candidate_pairs,
    lead_targets,
    merge_shards,
    names_subject,
    pair_examples,
    round_trip,
    shard_pairs,
    shard_rows,
)
from rag_core.train.generated_qa_reader import generator_replies, lead_target, reader_agrees
from rag_core.train.generated_qa_store import held_out, held_out_examples, index_search
from rag_core.train.question_rules import RULE_NAMES, questions
from rag_core.wiki.ingest import read_passages
from tests.helpers.passagefiles import sample_passages
from tests.rag_core.train.generatedqafiles import publish_minilm_index


def _cases(table: str) -> list[tuple[str, ...]]:
    """The rows of a ``" | "``-separated table, one per line; an indented line goes on with the row above."""
    rows: list[str] = []
    for line in table.strip("\n").splitlines():
        if line.startswith(" "):
            rows[-1] += " " + line.strip()
        else:
            rows.append(line)
    return [tuple(cell.strip() for cell in row.split(" | ")) for row in rows]


# sentence | rule | question | answer: each rule worked by hand on a sentence of the kind it is for.
HAND_WORKED = _cases("""
Albert Einstein was born on 14 March 1879 in Ulm. | born-when | When was Albert Einstein born? | 14 March 1879
Albert Einstein was born in Ulm, in the Kingdom of Württemberg. | born-where | Where was Albert Einstein born? | Ulm
Tarkovsky died on 29 December 1986. | died-when | When did Tarkovsky die? | 29 December 1986
Tarkovsky died in Paris on 29 December 1986. | died-where | Where did Tarkovsky die? | Paris
The Mexican Anarchist Federation was established in 1945. | made-when |
    When was the Mexican Anarchist Federation established? | 1945
Connes was awarded the Fields Medal in 1982. | made-when | When was Connes awarded the Fields Medal? | 1982
Hamlet was written by William Shakespeare. | made-by | Who wrote Hamlet? | William Shakespeare
King George III issued a Proclamation of Rebellion in August 1775. | who-did |
    Who issued a Proclamation of Rebellion in August 1775? | King George III
Soviet Union invaded Afghanistan in December 1979. | who-did | What invaded Afghanistan in December 1979? | Soviet Union
The National Museum of Afghanistan is located in Kabul. | located |
    Where is the National Museum of Afghanistan located? | Kabul
Angola has a population of 24,383,301 inhabitants according to the census. | measure |
    What is the population of Angola? | 24,383,301 inhabitants
Alabama has 67 counties. | how-many | How many counties does Alabama have? | 67
Aristotle was the teacher of Alexander. | role-of | Who was the teacher of Alexander? | Aristotle
Algiers is the capital of Algeria. | role-of | What is the capital of Algeria? | Algiers
The capital of Alabama is Montgomery. | of-is | What is the capital of Alabama? | Montgomery
The Kingdom of Albania was established by Charles of Anjou. | made-by |
    Who established the Kingdom of Albania? | Charles of Anjou
Spain joined the war in 1779. | when-did | When did Spain join the war? | 1779
Aldous Leonard Huxley (26 July 1894 – 22 November 1963) was an English writer. | life-born |
    When was Aldous Leonard Huxley born? | 26 July 1894
Aldous Leonard Huxley (26 July 1894 – 22 November 1963) was an English writer. | life-died |
    When did Aldous Leonard Huxley die? | 22 November 1963
Neil Armstrong was the first person to walk on the Moon. | first-to |
    Who was the first person to walk on the Moon? | Neil Armstrong
Tirana is a city in Albania. | where-is | Where is Tirana? | Albania
Lincoln appointed 32 federal judges. | how-many-did | How many federal judges did Lincoln appoint? | 32
Alaska is also known as Alyeska. | known-as | What is Alaska also known as? | Alyeska
""")


@pytest.mark.parametrize(("sentence", "rule", "question", "answer"), HAND_WORKED)
def test_each_rule_makes_its_question_and_answer_span(sentence: str, rule: str, question: str, answer: str) -> None:
    made = [q for q in questions(sentence) if q.rule == rule]
    assert [(q.question, sentence[q.start:q.end]) for q in made] == [(question, answer)]


@pytest.mark.parametrize(("sentence", "title", "expected"), [
    # a one-word name is a name when the article's title has it ...
    ("Lincoln issued the Emancipation Proclamation in 1863.", "Abraham Lincoln",
     [("Who issued the Emancipation Proclamation in 1863?", "Lincoln")]),
    # ... and may be any sentence opener when it does not
    ("Lincoln issued the Emancipation Proclamation in 1863.", "Alabama", []),
    ("Later Einstein wrote it.", "Albert Einstein", []),
    ("Then Apollo struck the strings of his lyre.", "Apollo", []),
    # "The" opens the sentence, not the name; a thing is asked with What
    ("The Guttmacher Institute estimated the number of abortions.", "Abortion",
     [("What estimated the number of abortions?", "Guttmacher Institute")]),
    ("The Greeks built temples.", "Apollo", []),
])
def test_who_did_takes_its_name_from_the_sentence_and_the_title(sentence: str, title: str,
                                                                  expected: list[tuple[str, str]]) -> None:
    made = [(q.question, sentence[q.start:q.end]) for q in questions(sentence, title) if q.rule == "who-did"]
    assert made == expected


def test_every_rule_has_a_hand_worked_case() -> None:
    assert {case[1] for case in HAND_WORKED} == set(RULE_NAMES)


@pytest.mark.parametrize("sentence", [
    "He was born in 1950.",  # a pronoun: who?
    "The city was founded in 1821.",  # no name: which city?
    "In 1990 the city was founded.",  # a date first moves to the end, but "the city" names nothing
    "The journal is published by MDPI and was established in 2008.",  # a clause, not a noun phrase
    "Algeria is the capital of Algeria.",  # the question would show its answer
    "Lincoln was born in May 1809.",  # a month is no birthplace (born-when asks it)
])
def test_sentences_without_an_honest_question_give_none_or_only_the_right_rule(sentence: str) -> None:
    made = list(questions(sentence))
    assert all(q.rule == "born-when" for q in made)
    assert not made or sentence.startswith("Lincoln")


def test_spans_of_real_passages_are_inside_their_passage(wiki: Path) -> None:
    passages = sample_passages()
    texts = dict(zip(passages.column("passage_id").to_pylist(), passages.column("text").to_pylist(), strict=True))
    pairs = candidate_pairs(passages, per_passage=3)
    assert len(pairs) > 450 and len({p["rule"] for p in pairs}) >= 16
    for pair in pairs:
        assert 0 <= pair["answer_start"] < pair["answer_end"] <= len(texts[pair["passage_id"]])
        assert texts[pair["passage_id"]][pair["answer_start"]:pair["answer_end"]] == pair["answer"]
        assert pair["question"].endswith("?") and pair["question"][0].isupper()
        assert pair["answer"].lower() not in pair["question"].lower()


def test_shards_cover_every_row_once() -> None:
    for n in (0, 1, 7, 4391):
        rows = [r for s in range(4) for r in range(*shard_rows(n, s, 4))]
        assert rows == list(range(n))


@pytest.fixture(scope="module")
def index(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Search]:
    """The published index and its search (loaded once: the encoder takes seconds)."""
    store = Store(str(tmp_path_factory.mktemp("gqa") / "store"))
    return store, index_search(store, publish_minilm_index(store, "gqa"))


def test_round_trip_keeps_consistent_pairs_and_drops_a_question_that_finds_another_passage(index) -> None:
    store, search = index
    config = GeneratedQAConfig(top_k=5)
    pairs = candidate_pairs(read_passages(store, "gqa"), per_passage=3)
    counts: Counter[str] = Counter()
    kept = round_trip(pairs, search, config, counts)
    assert kept and counts["not_retrieved"] + counts["answer_not_in_top1"] == len(pairs) - len(kept)
    good = next(p for p in kept if p["rank"] == 1)
    # The same question said to be about another passage (one of another article): its own search finds
    # the first passage, not the one the pair claims, so the pair is inconsistent and goes.
    other = next(p for p in pairs if p["title"] != good["title"])
    swapped = {**good, "passage_id": other["passage_id"], "title": other["title"]}
    # An answer the best passage does not hold: the reader could not give it back.
    wrong = {**good, "answer": "Zanzibar Quux"}
    counts = Counter()
    assert round_trip([good, swapped, wrong], search, config, counts) == [{**good, "rank": 1}]
    assert counts == {"not_retrieved": 1, "answer_not_in_top1": 1}
    with_top1_check_off = round_trip([wrong], search, config.model_copy(update={"answer_in_top1": False}))
    assert [p["answer"] for p in with_top1_check_off] == ["Zanzibar Quux"]


def test_a_generated_question_in_a_dev_file_is_dropped(index, tmp_path: Path) -> None:
    store, search = index
    passages = read_passages(store, "gqa")
    config = GeneratedQAConfig()
    before = shard_pairs(passages, 0, search, HeldOut(), config)
    leaked = before.table.to_pylist()[0]
    place = before.table.to_pylist()[1]
    dev = tmp_path / "dev.jsonl"
    dev.write_text("\n".join(json.dumps(r) for r in [
        {"question": leaked["question"].upper() + "  ", "answers": ["whatever"]},  # the same question, normalised
        {"question": "Something else entirely?", "answers": [place["answer"]], "article": place["title"]},
    ]) + "\n")
    test = tmp_path / "test.tsv"
    test.write_text("1\tfactoid\tWhat is the answer?\tforty|two\n")
    held = held_out([str(dev), str(test)])
    after = shard_pairs(passages, 0, search, held, config)
    questions_after = set(after.table.column("question").to_pylist())
    assert leaked["question"] not in questions_after and place["question"] not in questions_after
    assert after.counts["held_out"] >= 2
    # Exactly the pairs the held-out items hold are gone; the round trip keeps the rest as before.
    assert after.table.to_pylist() == [r for r in before.table.to_pylist()
                                       if not held.holds(r["question"], r["answer"], r["passage_id"], r["title"])]
    assert "what is answer" in held.questions


def test_a_dev_file_without_questions_is_one_error_naming_it(tmp_path: Path) -> None:
    from rag_core.train.examples import TaskDataError

    bad = tmp_path / "dev.jsonl"
    bad.write_text('{"text": "no question here"}\n')
    with pytest.raises(TaskDataError, match=r"dev\.jsonl: no questions found"):
        held_out_examples(str(bad))


def test_merge_asks_each_question_once_and_splits_by_page(index) -> None:
    store, search = index
    passages = read_passages(store, "gqa")
    config = GeneratedQAConfig(dev_fraction=0.3, when_share=1.0)
    part = shard_pairs(passages, 0, search, HeldOut(), config)
    twice = ShardPairs(part.table, part.counts)
    table, counts = merge_shards([part, twice], config)
    assert table.num_rows == part.table.num_rows and counts["duplicate"] == part.table.num_rows
    by_page: dict[int, set[str]] = {}
    for row in table.to_pylist():
        by_page.setdefault(row["page_id"], set()).add(row["split"])
    assert all(len(splits) == 1 for splits in by_page.values())
    assert {"train", "dev"} == {s for splits in by_page.values() for s in splits}


def _asks_when(table) -> list[bool]:
    return [q.startswith("When ") for q in table.column("question").to_pylist()]


def test_merge_thins_when_questions_to_their_share_and_keeps_every_other(index) -> None:
    store, search = index
    part = shard_pairs(read_passages(store, "gqa"), 0, search, HeldOut(), GeneratedQAConfig())
    when = sum(_asks_when(part.table))
    others = part.table.num_rows - when
    assert 0 < others // 4 < when  # the sample's passages give more When questions than a fifth of the rows

    table, counts = merge_shards([part], GeneratedQAConfig(when_share=0.2))
    kept = sum(_asks_when(table))
    assert kept == others // 4 and table.num_rows == others + kept == counts["kept"]  # 20% of the rows left
    assert counts["when_capped"] == when - kept
    questions = set(table.column("question").to_pylist())
    assert all(q in questions for q, w in zip(part.table.column("question").to_pylist(), _asks_when(part.table),
                                              strict=True) if not w)
    whole, counts = merge_shards([part], GeneratedQAConfig(when_share=1.0))
    assert whole.num_rows == part.table.num_rows and counts["when_capped"] == 0


@pytest.mark.parametrize(("answer", "title", "subject"), [
    ("Lincoln", "Abraham Lincoln", True),
    ("Abraham Lincoln", "Abraham Lincoln", True),
    ("Asia", "Asia", True),
    ("Julia MacRae Books", "Animalia (book)", False),  # the qualifier is not the subject
    ("Original Georgian alphabet", "Alphabet", True),
    ("Bank of America", "Foreign relations of Angola", False),  # "of" is no name
    ("Portuguese", "Demographics of Angola", False),
    ("1809", "Abraham Lincoln", False),
])
def test_an_answer_names_its_pages_subject_when_it_shares_a_word_of_the_title(answer: str, title: str,
                                                                            subject: bool) -> None:
    assert names_subject(answer, title) is subject


def test_merge_thins_pairs_answered_by_their_pages_subject(index) -> None:
    store, search = index
    part = shard_pairs(read_passages(store, "gqa"), 0, search, HeldOut(), GeneratedQAConfig())
    rows = part.table.to_pylist()
    subject = [r["question"] for r in rows if names_subject(r["answer"], r["title"])]
    others = [r["question"] for r in rows if not names_subject(r["answer"], r["title"])]
    assert subject and others  # the sample's passages give both kinds

    table, counts = merge_shards([part], GeneratedQAConfig(subject_share=0.0, when_share=1.0))
    assert sorted(table.column("question").to_pylist()) == sorted(others) and counts["subject_capped"] == len(subject)
    table, counts = merge_shards([part], GeneratedQAConfig(subject_share=0.25, when_share=1.0))
    kept = [r for r in table.to_pylist() if names_subject(r["answer"], r["title"])]
    assert len(kept) == min(len(subject), len(others) // 3) and counts["subject_capped"] == len(subject) - len(kept)
    whole, counts = merge_shards([part], GeneratedQAConfig(when_share=1.0))
    assert whole.num_rows == part.table.num_rows and counts["subject_capped"] == 0


@pytest.mark.parametrize(("answer", "read", "agrees"), [
    ("Charles of Anjou", "Charles of Anjou", True),
    ("1945", "in 1945", True),
    ("the Fields Medal", "Fields Medal", True),  # articles and case aside
    ("Paris", "Parisian", False),  # whole words only
    ("1945", "1946", False),
    ("Kabul", "", False),
])
def test_the_reader_agrees_when_it_gives_the_answer_back(answer: str, read: str, agrees: bool) -> None:
    assert reader_agrees(answer, read) is agrees


def test_a_reader_that_does_not_give_the_answer_back_drops_the_pair(index, tmp_path: Path, one_torch_thread) -> None:
    """A real (tiny, random) decoder-only generator reads each pair's best passage: it never says the answer."""
    from tests.helpers.generatorfiles import save_tiny_llama

    store, search = index
    pairs = candidate_pairs(read_passages(store, "gqa"), per_passage=3)[:12]
    retrieved = round_trip(pairs, search, GeneratedQAConfig())
    assert retrieved
    replies = generator_replies(str(save_tiny_llama(tmp_path / "llama")), max_new_tokens=4)
    counts: Counter[str] = Counter()
    assert round_trip(pairs, search, GeneratedQAConfig(reader="generator"), counts, replies) == []
    assert counts["reader_disagrees"] == len(retrieved)
    with pytest.raises(ValueError, match="pass the generator's replies"):
        round_trip(pairs, search, GeneratedQAConfig(reader="generator"))


def test_the_readers_replies_are_its_first_lines_and_its_answers_their_short_spans(index, tmp_path: Path,
                                                                                   one_torch_thread) -> None:
    """generator_replies gives each reply's first line beside its short answer (a real tiny random decoder-only
    generator, greedy)."""
    from rag_core.model.extract import short_answer
    from rag_core.train.generated_qa_reader import generator_replies
    from tests.helpers.generatorfiles import save_tiny_llama

    store, search = index
    pairs = candidate_pairs(read_passages(store, "gqa"), per_passage=3)[:4]
    items = [(p["question"], title, text) for p, (_, title, text) in
             zip(pairs, (hits[0] for hits in search([p["question"] for p in pairs], 1)), strict=True)]
    path = str(save_tiny_llama(tmp_path / "llama"))
    said = generator_replies(path, max_new_tokens=6)(items)
    assert len(said) == len(items)
    for (question, _, _), (reply, short) in zip(items, said, strict=True):
        assert "\n" not in reply and reply == reply.strip()
        assert short == short_answer(reply, question)


@pytest.mark.parametrize(("reply", "short", "answer", "target"), [
    # the reader's lead-in is kept, its own answer swapped for the pair's, and the target ends there
    ("The capital of Algeria is Algiers, on the coast.", "Algiers", "Algiers", "The capital of Algeria is Algiers."),
    ("Alexander was tutored by Plato.", "Plato", "Aristotle", "Alexander was tutored by Aristotle."),
    ("The answer is: 1945", "1945", "1945", "The answer is: 1945."),
    ("Algiers", "Algiers", "Algiers", "Algiers"),  # no lead-in: the bare answer, no full stop
    ("I do not know.", "", "Kabul", "Kabul"),  # no short answer: the bare answer
    ("It was in 1946.", "the year 1946", "1945", "1945"),  # a short answer the reply does not hold: bare too
])
def test_a_lead_target_keeps_the_readers_words_up_to_the_pairs_answer(reply: str, short: str, answer: str,
                                                                      target: str) -> None:
    assert lead_target(reply, short, answer) == target


def test_reader_lead_targets_are_the_readers_words_around_each_pairs_answer(index, real_generator: Path) -> None:
    """Each pair's target is the lead target of what the real default generator (SmolLM2-135M-Instruct) replies to
    its question from its best passage; the examples train toward it, the row keeps the answer span."""
    store, search = index
    pairs = candidate_pairs(read_passages(store, "gqa"), per_passage=3)[:40]
    kept = round_trip(pairs, search, GeneratedQAConfig())[:10]
    assert kept and all(p["target"] == p["answer"] for p in kept)
    table = pa.Table.from_pylist([{**p, "shard": 0, "split": "train"} for p in kept],
                                 schema=PAIR_SCHEMA.append(pa.field("split", pa.string())))
    replies = generator_replies(str(real_generator))
    led = lead_targets(table, search, replies)
    assert led.drop_columns(["target"]) == table.drop_columns(["target"])
    said = replies([(p["question"], *search([p["question"]], 1)[0][0][1:]) for p in kept])
    targets = led.column("target").to_pylist()
    assert targets == [lead_target(reply, short, p["answer"]) for p, (reply, short) in zip(kept, said, strict=True)]
    assert all(t.removesuffix(".").endswith(p["answer"]) for t, p in zip(targets, kept, strict=True))
    assert any(t != p["answer"] for t, p in zip(targets, kept, strict=True))  # it answers in sentences: lead-ins
    # trained toward the lead target, scored (EM, recall) against the span too
    assert [e.targets for e in pair_examples(led, "train")] == [(t, p["answer"]) if t != p["answer"] else (t,)
                                                                for t, p in zip(targets, kept, strict=True)]


def test_batched_replies_are_the_replies_one_at_a_time(index, tmp_path: Path, one_torch_thread) -> None:
    """Left padding does not change what a real (tiny, random) decoder-only generator says, greedy in float32."""
    from tests.helpers.generatorfiles import save_tiny_llama

    store, search = index
    pairs = candidate_pairs(read_passages(store, "gqa"), per_passage=3)[:9]
    items = [(p["question"], title, text) for p, (_, title, text) in
             zip(pairs, (hits[0] for hits in search([p["question"] for p in pairs], 1)), strict=True)]
    path = str(save_tiny_llama(tmp_path / "llama"))
    batched = generator_replies(path, max_new_tokens=6, batch_size=4)(items)
    assert batched == generator_replies(path, max_new_tokens=6, batch_size=1)(items)
    assert len({reply for reply, _ in batched}) > 1  # the replies depend on the prompt


def test_the_dataset_key_names_the_recipe_and_the_held_out_items() -> None:
    from rag_core.train.generated_qa_store import dataset_key

    base = dataset_key(GeneratedQAConfig(), HeldOut())
    assert base == dataset_key(GeneratedQAConfig(), HeldOut())
    assert base != dataset_key(GeneratedQAConfig(top_k=3), HeldOut())
    assert base != dataset_key(GeneratedQAConfig(), HeldOut(questions=frozenset({"who wrote hamlet"})))
    led = GeneratedQAConfig(target="reader-lead", generator="smollm2")
    assert dataset_key(led, HeldOut(), "float32") != dataset_key(led, HeldOut(), "bfloat16")  # replies differ a little


def test_the_reader_code_is_part_of_the_dataset_key_only_when_the_reader_is_on() -> None:
    from rag_core.train import generated_qa, generated_qa_reader, question_rules
    from rag_core.train.generated_qa_store import key_modules

    assert question_rules in key_modules(GeneratedQAConfig())
    assert generated_qa in key_modules(GeneratedQAConfig())  # its round trip and caps decide which pairs stay
    assert generated_qa_reader not in key_modules(GeneratedQAConfig())
    assert generated_qa_reader in key_modules(GeneratedQAConfig(reader="generator", generator="smollm2"))
    assert generated_qa_reader in key_modules(GeneratedQAConfig(target="reader-lead", generator="smollm2"))
