"""The ``generated-qa`` flow: question–answer pairs from an index's own passages, gated and published once.

plan (index version, passage set, held-out dev/test items, dataset folder) -> already
published? reuse it -> one task per passage shard on Dask (rules, held-out filter,
round trip through the index's question encoder) -> merge (each question once, caps, split
by page) -> with ``target="reader-lead"``, the generator's words as each kept pair's target
(one task per part of the kept pairs) -> gate (GX) -> publish (parts, train/dev files, manifest last) under
``<store>/tasks/generated-qa/<index version>/<key>/``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from prefect import flow, unmapped
from pydantic import BaseModel, Field

from rag_core.train.generated_qa import GeneratedQAConfig, shard_rows
from runtime.dask_runner import dask_runner
from runtime.settings import Settings, StoreAccess, quiet_environment
from tasks.generated_qa import (
    gate_generated_qa,
    generate_shard,
    lead_targets_of,
    merge_pairs,
    plan_generated_qa,
    publish_generated_qa,
)
from tasks.shard_runs import wait_for_shards

quiet_environment()


class GeneratedQAOutcome(BaseModel):
    index_version: str
    url: str  # the dataset folder
    train: str  # the train file (examples jsonl) the generated-qa task kind loads
    dev: str
    reused: bool  # True when an earlier run had published the same dataset
    counts: dict[str, int] = Field(default_factory=dict)  # candidates, held_out, not_retrieved, ..., kept
    rules: dict[str, int] = Field(default_factory=dict)  # kept pairs per rule
    splits: dict[str, int] = Field(default_factory=dict)  # train, dev


def _outcome(url: str, manifest: dict[str, Any], reused: bool) -> GeneratedQAOutcome:
    return GeneratedQAOutcome(index_version=manifest["index_version"], url=url, train=f"{url}/train.jsonl",
                              dev=f"{url}/dev.jsonl", reused=reused, counts=manifest["counts"],
                              rules=manifest["rules"],
                              splits={s: manifest["files"][f"{s}.jsonl"]["rows"] for s in ("train", "dev")})


@flow(name="generated-qa", task_runner=dask_runner(None, None), validate_parameters=True)
def generated_qa(store: StoreAccess, index_version: str | None = None,
                 config: GeneratedQAConfig = GeneratedQAConfig(),  # noqa: B008
                 held_out_files: list[str] | None = None) -> GeneratedQAOutcome:
    """Make, gate and publish the generated-QA dataset of ``index_version`` (LATEST when None), filtered against
    ``held_out_files`` (dev and test questions); a dataset published before from the same inputs is reused."""
    target = store.store()
    held_out_files = held_out_files or []
    options = store.options(held_out_files[0]) if held_out_files else {}
    plan = plan_generated_qa(target, index_version, config, held_out_files, options)
    if plan.manifest is not None:
        return _outcome(plan.url, plan.manifest, reused=True)
    runs = generate_shard.map(unmapped(target), unmapped(plan), unmapped(config), list(range(config.shards)))
    wait_for_shards(runs)
    table, counts = merge_pairs(runs.result(), config)
    if config.target == "reader-lead":
        led = lead_targets_of.map(unmapped(target), unmapped(plan), unmapped(config), split_rows(table, config.shards))
        wait_for_shards(led)
        table = pa.concat_tables(led.result())
    gate_generated_qa(target, plan, table, config)
    return _outcome(plan.url, publish_generated_qa(target, plan, table, counts, config), reused=False)


def split_rows(table: pa.Table, parts: int) -> list[pa.Table]:
    """``table`` in ``parts`` contiguous slices (as passage shards are cut), the empty ones left out."""
    cuts = [shard_rows(table.num_rows, i, parts) for i in range(parts)]
    return [table.slice(start, stop - start) for start, stop in cuts if stop > start] or [table]


def generated_qa_on(settings: Settings, index_version: str | None, config: GeneratedQAConfig,
                    held_out_files: list[str]) -> GeneratedQAOutcome:
    """The flow on the settings' store and Dask cluster (a local one when none is configured)."""
    runner = dask_runner(settings.dask_address, settings.workers)
    return generated_qa.with_options(task_runner=runner)(store=settings.store_access(), index_version=index_version,
                                                        config=config, held_out_files=held_out_files)


def generated_qa_files(store: StoreAccess, index_version: str,
                       held_out_files: list[str] | None = None) -> tuple[str, str]:
    """``(train_url, dev_url)`` of the index's own generated-QA dataset at the defaults, made now when absent;
    ``held_out_files``: the dev and test questions a caller evaluates on, which no pair may repeat."""
    outcome = generated_qa(store=store, index_version=index_version, held_out_files=held_out_files)
    return outcome.train, outcome.dev
