"""Prefect tasks of the generated-QA stage: plan, one shard's pairs, merge, the GX gate, publish.

The gate, on the merged pairs before anything is written: question, answer and id
present and non-empty; ids and normalised questions unique; every answer is its
passage's text at its offsets; no pair repeats a dev or test item; splits are
train or dev, both present; at least ``min_pairs`` pairs. A failure keeps a report
(a Prefect artifact, and a file under the dataset's ``_reports``) and publishes nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pandas as pd
import pyarrow as pa
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel

from rag_core.errors import GateError, WikiragError
from rag_core.evaluate.normalize import normalize_answer
from rag_core.index.versions import read_index_manifest
from rag_core.storage import Store
from rag_core.train.generated_qa import (
    GeneratedQAConfig,
    HeldOut,
    ShardPairs,
    lead_targets,
    merge_shards,
    shard_pairs,
    shard_rows,
)
from rag_core.train.generated_qa_store import (
    dataset_folder,
    dataset_key,
    held_out,
    index_search,
    publish_dataset,
    published_dataset,
)
from rag_core.wiki.ingest import published_manifest, read_passage_rows
from tasks.quality import GateResult, _validate, artifact_key, report_markdown
from tasks.retry_policy import retry_unless_bad_input


class GeneratedQAPlan(BaseModel):
    """What every shard task needs: the index version, its passage set, the dataset folder, the held-out items."""

    index_version: str
    dump_id: str
    n_passages: int
    key: str
    url: str  # the dataset folder
    held_out_files: list[str]
    held_questions: list[str]
    held_answer_places: list[tuple[str, str]]
    manifest: dict[str, Any] | None = None  # set when the dataset is already published
    # The dtype the generator reads in, decided once here by the precision rule (a Dask cluster of another CPU
    # class reads in it too); part of the key, since greedy replies differ a little between float32 and bfloat16.
    reader_dtype: str | None = None

    def held(self) -> HeldOut:
        return HeldOut(frozenset(self.held_questions), frozenset(self.held_answer_places))


@task
def plan_generated_qa(store: Store, index_version: str | None, config: GeneratedQAConfig,
                      held_out_files: list[str], held_out_options: dict[str, Any]) -> GeneratedQAPlan:
    """The version (LATEST when None), its passage set, the held-out items and the dataset folder they decide."""
    manifest = read_index_manifest(store, index_version)
    if not manifest.dump_id:
        raise WikiragError(f"index {manifest.version} names no passage set to make questions from; rebuild it "
                           "with wikirag index-rebuild")
    passages = published_manifest(store, manifest.dump_id)
    if passages is None:
        raise WikiragError(f"index {manifest.version}: its passage set {manifest.dump_id} is not on the store "
                           f"{store.url}; rebuild the index")
    held = held_out(held_out_files, held_out_options)
    reader_dtype = None
    if config.reads():
        from rag_core.perf.precision import choose_precision

        if not config.generator:
            raise WikiragError("generated QA: the reader check and reader-lead targets need a generator folder "
                               "(config.generator)")
        reader_dtype = choose_precision("auto", "cpu").dtype
    key = dataset_key(config, held, reader_dtype)
    folder = dataset_folder(store, manifest.version, key)
    return GeneratedQAPlan(index_version=manifest.version, dump_id=manifest.dump_id,
                           n_passages=sum(p["rows"] for p in passages["parts"]), key=key, url=folder.url,
                           held_out_files=held_out_files, held_questions=sorted(held.questions),
                           held_answer_places=sorted(held.answer_places), manifest=published_dataset(folder),
                           reader_dtype=reader_dtype)


@task(retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_bad_input)
def generate_shard(store: Store, plan: GeneratedQAPlan, config: GeneratedQAConfig, shard: int) -> ShardPairs:
    """One passage shard's pairs, filtered against the held-out items and by the round trip."""
    start, stop = shard_rows(plan.n_passages, shard, config.shards)
    passages = read_passage_rows(store, plan.dump_id, start, stop, ["passage_id", "page_id", "title", "text"])
    replies = None
    if config.reader == "generator":
        from rag_core.train.generated_qa_reader import generator_replies

        replies = generator_replies(config.generator, dtype=plan.reader_dtype)
    found = shard_pairs(passages, shard, index_search(store, plan.index_version), plan.held(), config, replies)
    texts = dict(zip(passages.column("passage_id").to_pylist(), passages.column("text").to_pylist(), strict=True))
    context = [texts[p] for p in found.table.column("passage_id").to_pylist()]
    # The passage text rides along for the gate's offset check; publishing leaves it out.
    found.table = found.table.append_column("passage_text", pa.array(context, pa.string()))
    return found


@task(retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_bad_input)
def lead_targets_of(store: Store, plan: GeneratedQAPlan, config: GeneratedQAConfig, part: pa.Table) -> pa.Table:
    """``part`` of the merged pairs with reader-lead targets: the generator reads each question's best passage."""
    from rag_core.train.generated_qa_reader import generator_replies

    return lead_targets(part, index_search(store, plan.index_version),
                        generator_replies(config.generator, dtype=plan.reader_dtype))


@task
def merge_pairs(parts: list[ShardPairs], config: GeneratedQAConfig) -> tuple[pa.Table, Counter[str]]:
    """The shards' pairs, each question once, split by page."""
    return merge_shards(parts, config)


def pairs_frame(table: pa.Table, held: HeldOut) -> pd.DataFrame:
    """One row per pair: what the expectations look at."""
    rows = table.to_pylist()
    return pd.DataFrame({
        "id": [r["id"] for r in rows],
        "question": [(r["question"] or "").strip() or None for r in rows],
        "answer": [(r["answer"] or "").strip() or None for r in rows],
        "normalised_question": [normalize_answer(r["question"] or "") for r in rows],
        "span_in_passage": [0 <= r["answer_start"] < r["answer_end"] <= len(r["passage_text"] or "")
                            and r["passage_text"][r["answer_start"]: r["answer_end"]] == r["answer"] for r in rows],
        "held_out": [held.holds(r["question"] or "", r["answer"] or "", r["passage_id"], r["title"] or "")
                     for r in rows],
        "split": [r["split"] for r in rows],
    })


def validate_pairs(table: pa.Table, held: HeldOut, min_pairs: int) -> GateResult:
    """The generated-QA suite (module docstring) on a merged pairs table."""
    import great_expectations.expectations as gxe

    return _validate("generated-qa", pairs_frame(table, held), [
        gxe.ExpectTableRowCountToBeBetween(min_value=min_pairs),
        gxe.ExpectColumnValuesToNotBeNull(column="id"),
        gxe.ExpectColumnValuesToBeUnique(column="id"),
        gxe.ExpectColumnValuesToNotBeNull(column="question"),
        gxe.ExpectColumnValuesToNotBeNull(column="answer"),
        gxe.ExpectColumnValuesToBeUnique(column="normalised_question"),
        gxe.ExpectColumnValuesToBeInSet(column="span_in_passage", value_set=[True]),
        gxe.ExpectColumnValuesToBeInSet(column="held_out", value_set=[False]),
        gxe.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "dev"]),
        gxe.ExpectColumnDistinctValuesToContainSet(column="split", value_set=["train", "dev"]),
    ])


@task
def gate_generated_qa(store: Store, plan: GeneratedQAPlan, table: pa.Table, config: GeneratedQAConfig) -> str:
    """The gate before publishing: its markdown, or GateError (with a report) when an expectation fails."""
    result = validate_pairs(table, plan.held(), config.min_pairs)
    markdown = report_markdown(f"Generated-QA gate ({table.num_rows:,} pairs, index {plan.index_version})", [result])
    if result.success:
        return markdown
    reports = Store(plan.url, store.options).child("_reports")
    name = f"gate-{time.strftime('%Y%m%dT%H%M%S')}.md"
    reports.write_bytes(markdown.encode(), name)
    create_markdown_artifact(markdown=markdown, key=artifact_key("generated-qa-gate"), description="failed gate")
    raise GateError(f"{result.summary()}; nothing published; report: {reports.url_of(name)}")


@task
def publish_generated_qa(store: Store, plan: GeneratedQAPlan, table: pa.Table, counts: Counter[str],
                         config: GeneratedQAConfig) -> dict[str, Any]:
    """Write the dataset, manifest last; returns the manifest."""
    manifest = publish_dataset(Store(plan.url, store.options), table.drop_columns(["passage_text"]), counts,
                               index_version=plan.index_version, config=config,
                               held_out_files=plan.held_out_files)
    get_run_logger().info("generated QA for index %s: %d pairs (%s) at %s", plan.index_version, table.num_rows,
                          dict(counts), plan.url)
    return manifest
