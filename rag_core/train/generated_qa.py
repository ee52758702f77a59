"""Question–answer pairs made from an index's own passages, kept only when retrieval answers them (PAQ-style).

In the spirit of PAQ (Lewis et al. 2021), for one shard of the passage set:

1. **Answer spans and questions**: each complete sentence of a passage (and its rewordings,
   with the passage's pronoun for its title: :mod:`rag_core.train.sentence_views`) goes through the
   rules of :mod:`rag_core.train.question_rules`; a rule that fits gives a question and
   the answer's offsets, kept as offsets into the passage text (``text[answer_start:
   answer_end] == answer``).
2. **Held out**: a pair whose normalised question is a dev or test question, or whose
   normalised answer and passage (or page title) are a dev or test item's, is dropped.
3. **Round trip**: the question is encoded with the index's question encoder and
   searched; the pair stays only if its own passage is among the top ``top_k`` and
   (with ``answer_in_top1``) its answer shows in the best passage, the one a reader
   reads first. Questions too vague to find their passage, or answered elsewhere by
   another passage, go. Optionally (``reader``) the generator reads that best passage
   too and the pairs it does not answer go (:mod:`rag_core.train.generated_qa_reader`).

:func:`merge_shards` then asks each question once across shards, thins the When questions and
those answered by their page's subject, and splits by page (an article's pairs all train or all
dev, the held-out pages drawn as for cloze). Each pair trains toward its answer span, or, with
``target="reader-lead"``, toward the generator's own reply to it around that answer
(:func:`lead_targets`, over the pairs the merge keeps).
Sharding is a pure function of ``(shard, shards)`` over the passage rows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, Field

from rag_core.evaluate.normalize import normalize_answer
from rag_core.train.cloze import ClozeConfig, dev_pages, sentences
from rag_core.train.examples import Example, Provenance
from rag_core.train.generated_qa_reader import Replies, lead_target, reader_agrees
from rag_core.train.question_rules import questions
from rag_core.train.sentence_views import title_pronoun

KIND = "generated-qa"
PAIR_SCHEMA = pa.schema([
    ("id", pa.string()), ("question", pa.string()), ("answer", pa.string()), ("passage_id", pa.string()),
    ("page_id", pa.int64()), ("title", pa.string()), ("answer_start", pa.int32()), ("answer_end", pa.int32()),
    ("rule", pa.string()), ("shard", pa.int32()), ("rank", pa.int32()),
    ("target", pa.string()),  # what the pair trains toward: its answer, or the reader's lead-in and the answer
])
# What each filter drops, in the order the filters run, then what is kept.
COUNTS = ("candidates", "held_out", "not_retrieved", "answer_not_in_top1", "reader_disagrees", "kept")

# Searches questions: for each, the top-k ``(passage_id, title, text)`` of the index, best first.
Search = Callable[[Sequence[str], int], list[list[tuple[str, str, str]]]]


class GeneratedQAConfig(BaseModel):
    """How question–answer pairs are made from an index's passages and filtered by a round trip."""

    shards: int = Field(4, ge=1)  # passage shards, mapped in parallel (one task each)
    top_k: int = Field(5, ge=1)  # round trip: the question must retrieve its own passage among the top k
    answer_in_top1: bool = True  # round trip: and the answer must show in the best passage retrieved
    reader: Literal["off", "generator"] = "off"  # round trip: and the generator must answer it from that passage
    generator: str | None = None  # the decoder-only generator folder the reader prompts (reader, target)
    per_passage: int = Field(3, ge=1)  # questions kept from one passage at most (in sentence order)
    seed: int = 0  # decides the held-out (dev) pages
    dev_fraction: float = Field(0.1, gt=0.0, lt=1.0)  # share of pages whose pairs form the dev split
    min_pairs: int = Field(10, ge=1)  # the gate fails below this many kept pairs (too few to train on)
    # The rules find dates far more often than people ask for them (on the sample: 56% of kept pairs ask When,
    # 3 of the 50 real dev questions do); a reader trained on that mix answers other questions with years.
    when_share: float = Field(0.2, gt=0.0, le=1.0)  # kept pairs asking "When ..." at most this share (1: no cap)
    # Many of the rules' pairs answer with the page's own subject ("Who vetoed only four bills?" -> Lincoln, read
    # from Lincoln's page), while real questions name the subject and ask for something else ("Who killed Achilles?").
    # Trained on that mix, the reader answers with the subject of the passage it reads: with the question's own words.
    subject_share: float = Field(1.0, ge=0.0, le=1.0)  # kept pairs answered by their page's subject at most this share
    # A bare span as the target teaches a reader that answers in sentences a new way to talk, not where the answer
    # is; "reader-lead" keeps the reader's own words around the pair's answer (generated_qa_reader.lead_target).
    target: Literal["answer", "reader-lead"] = "answer"  # what each pair trains toward (reader-lead: needs generator)

    def reads(self) -> bool:
        """Whether the stage runs the generator (the reader check, or reader-lead targets)."""
        return self.reader == "generator" or self.target == "reader-lead"


@dataclass(frozen=True)
class HeldOut:
    """Dev and test items a generated pair must not repeat."""

    questions: frozenset[str] = frozenset()  # normalised questions
    answer_places: frozenset[tuple[str, str]] = frozenset()  # (normalised answer, passage id or normalised title)

    @classmethod
    def of(cls, examples: Iterable[Example]) -> HeldOut:
        qs, places = set(), set()
        for e in examples:
            qs.add(normalize_answer(e.input))
            for target in e.targets:
                answer = normalize_answer(target)
                for p in e.provenance:
                    places.update((answer, where) for where in (p.passage_id, p.title and normalize_answer(p.title))
                                  if where)
        return cls(frozenset(qs), frozenset(places))

    def holds(self, question: str, answer: str, passage_id: str, title: str) -> bool:
        a = normalize_answer(answer)
        return (normalize_answer(question) in self.questions or (a, passage_id) in self.answer_places
                or (a, normalize_answer(title)) in self.answer_places)


@dataclass
class ShardPairs:
    """One shard's kept pairs and what each filter dropped."""

    table: pa.Table
    counts: Counter[str] = field(default_factory=Counter)


def shard_rows(n_rows: int, shard: int, shards: int) -> tuple[int, int]:
    """``[start, stop)`` of passage rows in ``shard`` of ``shards`` (contiguous, sizes differ by at most one)."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not one of 0..{shards - 1}")
    return n_rows * shard // shards, n_rows * (shard + 1) // shards


def passage_pairs(passage_id: str, page_id: int, title: str, text: str, per_passage: int) -> list[dict]:
    """Up to ``per_passage`` pairs from one passage, in sentence order, with the answer's offsets in ``text``."""
    out: list[dict] = []
    pronoun = title_pronoun(text, title)
    for start, end in sentences(text):
        for q in questions(text[start:end], title, pronoun):
            a, b = start + q.start, start + q.end
            out.append({"id": f"{passage_id}:{a}:{q.rule}", "question": q.question, "answer": text[a:b],
                        "passage_id": passage_id, "page_id": page_id, "title": title, "answer_start": a,
                        "answer_end": b, "rule": q.rule})
            if len(out) == per_passage:
                return out
    return out


def candidate_pairs(passages: pa.Table, per_passage: int) -> list[dict]:
    """Every passage's pairs, in passage order (``passages``: passage_id, page_id, title, text)."""
    columns = [passages.column(c).to_pylist() for c in ("passage_id", "page_id", "title", "text")]
    return [pair for row in zip(*columns, strict=True) for pair in passage_pairs(*row, per_passage)]


def round_trip(pairs: list[dict], search: Search, config: GeneratedQAConfig,
               counts: Counter[str] | None = None, replies: Replies | None = None) -> list[dict]:
    """The pairs whose question retrieves its own passage in the top ``top_k`` (and, with ``answer_in_top1``,
    whose answer shows in the first passage retrieved; with ``reader="generator"``, which the reader, ``replies``,
    answers from that passage with the pair's answer); ``rank`` (1-based) is added to each kept pair, and its
    answer as its ``target``."""
    counts = counts if counts is not None else Counter()
    found = search([p["question"] for p in pairs], config.top_k) if pairs else []
    kept, best = [], []
    for pair, hits in zip(pairs, found, strict=True):
        ids = [passage_id for passage_id, _, _ in hits]
        if pair["passage_id"] not in ids:
            counts["not_retrieved"] += 1
            continue
        answer = normalize_answer(pair["answer"])
        if config.answer_in_top1 and f" {answer} " not in f" {normalize_answer(hits[0][2])} ":
            counts["answer_not_in_top1"] += 1
            continue
        kept.append({**pair, "rank": ids.index(pair["passage_id"]) + 1, "target": pair["answer"]})
        best.append((pair["question"], hits[0][1], hits[0][2]))
    if config.reader == "off" or not kept:
        return kept
    if replies is None:
        raise ValueError("round_trip: the reader check is on (reader='generator'); pass the generator's replies")
    agreed = [reader_agrees(pair["answer"], short) for pair, (_, short) in zip(kept, replies(best), strict=True)]
    counts["reader_disagrees"] += agreed.count(False)
    return [pair for pair, ok in zip(kept, agreed, strict=True) if ok]


def shard_pairs(passages: pa.Table, shard: int, search: Search, held_out: HeldOut,
                config: GeneratedQAConfig, replies: Replies | None = None) -> ShardPairs:
    """One shard's pipeline: candidates, minus held-out items, minus round-trip failures (module docstring)."""
    counts: Counter[str] = Counter()
    pairs = candidate_pairs(passages, config.per_passage)
    counts["candidates"] = len(pairs)
    fresh = [p for p in pairs if not held_out.holds(p["question"], p["answer"], p["passage_id"], p["title"])]
    counts["held_out"] = len(pairs) - len(fresh)
    kept = round_trip(fresh, search, config, counts, replies)
    counts["kept"] = len(kept)
    rows = [{**p, "shard": shard} for p in kept]
    return ShardPairs(pa.Table.from_pylist(rows, schema=PAIR_SCHEMA), counts)


def merge_shards(parts: Sequence[ShardPairs], config: GeneratedQAConfig) -> tuple[pa.Table, Counter[str]]:
    """All shards' pairs, each normalised question once (the first shard's), with a ``split`` column
    (``dev`` for the held-out pages, else ``train``); counts summed, ``duplicate`` counting the repeats."""
    counts: Counter[str] = Counter()
    for part in parts:
        counts.update(part.counts)
    table = pa.concat_tables([p.table for p in parts]) if parts else PAIR_SCHEMA.empty_table()
    seen: set[str] = set()
    keep = []
    for question in table.column("question").to_pylist():
        key = normalize_answer(question)
        keep.append(key not in seen)
        seen.add(key)
    table = table.filter(pa.array(keep, pa.bool_()))
    counts["duplicate"] = len(keep) - table.num_rows
    subject = [names_subject(a, t) for a, t in zip(*(table.column(c).to_pylist() for c in ("answer", "title")),
                                                      strict=True)]
    table = _cap(table, subject, config.subject_share, counts, "subject_capped")
    table = _cap(table, [q.startswith("When ") for q in table.column("question").to_pylist()], config.when_share,
                 counts, "when_capped")
    counts["kept"] = table.num_rows
    held = dev_pages(table.column("page_id").to_pylist(), ClozeConfig(seed=config.seed,
                                                                      dev_fraction=config.dev_fraction))
    split = ["dev" if page in held else "train" for page in table.column("page_id").to_pylist()]
    return table.append_column("split", pa.array(split, pa.string())), counts


def lead_targets(table: pa.Table, search: Search, replies: Replies) -> pa.Table:
    """``table`` (pairs) with each ``target`` in the reader's own words: what ``replies`` says to the pair's question
    from its best passage, cut after its short answer, the pair's answer in its place
    (:func:`rag_core.train.generated_qa_reader.lead_target`)."""
    if not table.num_rows:
        return table
    questions, answers = (table.column(c).to_pylist() for c in ("question", "answer"))
    best = [hits[0] for hits in search(questions, 1)]
    said = replies([(q, title, text) for q, (_, title, text) in zip(questions, best, strict=True)])
    targets = [lead_target(reply, short, a) for a, (reply, short) in zip(answers, said, strict=True)]
    return table.set_column(table.schema.get_field_index("target"), "target", pa.array(targets, pa.string()))


def names_subject(answer: str, title: str) -> bool:
    """Whether ``answer`` names the subject of the page ``title``: shares a word of four letters or more with the
    title, its parenthesised qualifier left out ("Lincoln" of "Abraham Lincoln", "Asia" of "Asia")."""
    subject = {w for w in normalize_answer(title.split(" (")[0]).split() if len(w) >= 4}
    return bool(subject & set(normalize_answer(answer).split()))


def _cap(table: pa.Table, flagged: list[bool], share: float, counts: Counter[str], name: str) -> pa.Table:
    """``table`` with its ``flagged`` rows thinned, evenly over its rows, to at most ``share`` of the rows left;
    ``counts[name]``: how many went."""
    total = sum(flagged)
    if share >= 1.0:
        room = total
    else:
        room = min(total, math.floor(share * (len(flagged) - total) / (1.0 - share) + 1e-9))
    keep, i = [], 0
    for is_flagged in flagged:
        keep.append(not is_flagged or (i + 1) * room // total > i * room // total)  # room of total, spread out
        i += is_flagged
    counts[name] = len(keep) - sum(keep)
    return table.filter(pa.array(keep, pa.bool_()))


def pair_examples(table: pa.Table, split: str) -> list[Example]:
    """The ``split`` rows of a pairs table as examples (question in, the passage as provenance): the first target is
    what the pair trains toward (a recipe reads only the first); a reader-lead target is followed by the answer span
    itself, which EM, F1 and retrieval recall then score against (each takes the best of the targets)."""
    rows = table.filter(pc.equal(table.column("split"), split)).to_pylist()
    return [Example(r["id"], r["question"], _targets(r["target"], r["answer"]), KIND,
                    provenance=(Provenance(str(r["page_id"]), r["title"], r["passage_id"]),)) for r in rows]


def _targets(target: str | None, answer: str) -> tuple[str, ...]:
    return (target, answer) if target and target != answer else (answer,)
