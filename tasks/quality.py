"""Great Expectations gates between stages, and the reports they leave behind.

A gate is a GX suite run against a pandas frame.  Its result is reduced to a
small :class:`GateResult` (what failed, how many rows, a few examples) that
travels between Dask workers and renders as markdown for the Prefect
artifact and the report kept beside the output.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from rag_core.errors import GateError
from rag_core.progress import StageProgress
from rag_core.storage import Store
from rag_core.wiki.ingest import IngestConfig, read_staged_table, write_report
from rag_core.wiki.passages import PageCounts
from tasks.retry_policy import retry_unless_bad_input

# Markup that should never survive cleaning; a few passages may keep some.
RESIDUE_PATTERN = r"\{\{|\}\}|\[\[|\]\]|<ref|\{\||\|\}|&amp;|&nbsp;|<!--|__[A-Z]+__"


@dataclass
class Failure:
    expectation: str
    column: str
    unexpected: int
    total: int
    examples: list[str] = field(default_factory=list)
    observed: Any = None  # aggregate expectations (a mean, a row count) report the value they saw


@dataclass
class GateResult:
    name: str
    success: bool
    checked: int  # expectations evaluated
    rows: int
    failures: list[Failure] = field(default_factory=list)
    observed: dict[str, Any] = field(default_factory=dict)  # "expectation(column)" -> aggregate value seen

    def markdown(self) -> str:
        head = f"### Gate `{self.name}`: {'passed' if self.success else 'FAILED'} ({self.checked} expectations, {self.rows:,} rows)"
        seen = "".join(f"\n- {key}: observed {_md_cell(value)}" for key, value in self.observed.items())
        if self.success:
            return head + "\n" + seen + ("\n" if seen else "")
        lines = [head, "", "| expectation | column | failing rows | examples |", "|---|---|---|---|"]
        for f in self.failures:
            examples = "; ".join(_md_cell(e) for e in f.examples[:3]) or "-"
            lines.append(f"| {f.expectation} | {f.column} | {f.unexpected:,} of {f.total:,} | {examples} |")
        return "\n".join(lines) + "\n" + seen + ("\n" if seen else "")

    def summary(self) -> str:
        parts = [f"{f.expectation}({f.column}): " + (f"observed {f.observed}" if f.observed is not None
                                                       else f"{f.unexpected:,} rows") for f in self.failures]
        return f"gate {self.name} failed: " + ", ".join(parts)


def _md_cell(value: Any) -> str:
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return f"`{text[:80]}`"


@functools.cache
def _context() -> Any:
    import great_expectations as gx  # heavy (seconds): only where a gate runs
    from great_expectations.data_context.types.base import ProgressBarsConfig

    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)
    ctx = gx.get_context(mode="ephemeral")
    # Per-metric bars from every worker would bury the run's own progress.
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return ctx


_DEFINITIONS: dict[str, Any] = {}


def _definition(name: str, expectations: list[Any]) -> Any:
    """One GX validation definition per gate and settings, built once per process.

    Building one per call would pile up data sources and suites in the context
    (and the frames they saw) for every part of a large dump.
    """
    import great_expectations as gx

    key = f"{name}-" + "-".join(sorted(repr(e.configuration.kwargs) for e in expectations))
    uid = f"{name}-{len(_DEFINITIONS)}"
    if key not in _DEFINITIONS:
        ctx = _context()
        batch = ctx.data_sources.add_pandas(uid).add_dataframe_asset(uid).add_batch_definition_whole_dataframe(uid)
        suite = ctx.suites.add(gx.ExpectationSuite(name=uid))
        for expectation in expectations:
            suite.add_expectation(expectation)
        _DEFINITIONS[key] = ctx.validation_definitions.add(gx.ValidationDefinition(name=uid, data=batch, suite=suite))
    return _DEFINITIONS[key]


def _validate(name: str, frame: pd.DataFrame, expectations: list[Any]) -> GateResult:
    definition = _definition(name, expectations)
    outcome = definition.run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
    failures, observed = [], {}
    for res in outcome.results:
        config = res.expectation_config
        kwargs = config.kwargs
        detail = res.result or {}
        column = kwargs.get("column") or (f"{kwargs['column_A']} = {kwargs['column_B']}" if "column_A" in kwargs
                                          else "table")
        if "observed_value" in detail:
            observed[f"{config.type}({column})"] = detail["observed_value"]
        if res.success:
            continue
        failures.append(
            Failure(
                expectation=config.type,
                column=str(column),
                unexpected=int(detail.get("unexpected_count") or 0),
                total=int(detail.get("element_count") or len(frame)),
                examples=[str(v) for v in (detail.get("partial_unexpected_list") or [])[:5]],
                observed=detail.get("observed_value"),
            )
        )
    return GateResult(name, bool(outcome.success), len(outcome.results), len(frame), failures, observed)


def passage_expectations(words_per_passage: int, max_residue_rate: float) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToNotBeNull(column="passage_id"),
        gxe.ExpectColumnValuesToBeUnique(column="passage_id"),
        gxe.ExpectColumnValuesToNotBeNull(column="title"),
        gxe.ExpectColumnValuesToNotBeNull(column="text"),
        gxe.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1),
        gxe.ExpectColumnValuesToBeBetween(column="n_words", min_value=1, max_value=words_per_passage),
        gxe.ExpectColumnValuesToNotMatchRegex(column="text", regex=RESIDUE_PATTERN, mostly=1.0 - max_residue_rate),
    ]


def validate_passages(passages: pa.Table | pd.DataFrame, words_per_passage: int, max_residue_rate: float) -> GateResult:
    """The passages gate on one table (a part, or the whole set)."""
    frame = passages.to_pandas() if isinstance(passages, pa.Table) else passages
    return _validate("passages", frame, passage_expectations(words_per_passage, max_residue_rate))


def validate_counts(counts: PageCounts, distinct_pages: int, n_passages: int) -> GateResult:
    """Articles found must agree with pages read, and with the passages written."""
    import great_expectations.expectations as gxe

    c = counts
    frame = pd.DataFrame(
        [
            {
                "pages": c.pages,
                "redirects_other_articles": c.redirects + c.other_namespace + c.articles,
                "articles": c.articles,
                "chunked_disambiguation_empty": c.chunked + c.disambiguation + c.empty,
                "chunked": c.chunked,
                "pages_in_passages": distinct_pages,
                "passages": c.passages,
                "passage_rows": n_passages,
            }
        ]
    )
    return _validate(
        "page-counts",
        frame,
        [
            gxe.ExpectColumnPairValuesToBeEqual(column_A="pages", column_B="redirects_other_articles"),
            gxe.ExpectColumnPairValuesToBeEqual(column_A="articles", column_B="chunked_disambiguation_empty"),
            gxe.ExpectColumnPairValuesToBeEqual(column_A="chunked", column_B="pages_in_passages"),
            gxe.ExpectColumnPairValuesToBeEqual(column_A="passages", column_B="passage_rows"),
        ],
    )


def validate_unique_pages(first_chunk_page_ids: np.ndarray) -> GateResult:
    """Each article in exactly one part: the page ids of all first windows are unique."""
    import great_expectations.expectations as gxe

    frame = pd.DataFrame({"page_id": first_chunk_page_ids})
    return _validate("pages-across-parts", frame, [gxe.ExpectColumnValuesToBeUnique(column="page_id")])


@task
def warm_gates() -> None:
    """Import Great Expectations in the background while the shards are parsed (it takes seconds)."""
    threading.Thread(target=_context, name="gx-warm-up", daemon=True).start()


@task(retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_bad_input)
def gate_passages(store: Store, dump_id: str, layout: str, records: list[dict[str, Any]], config: IngestConfig) -> list[GateResult]:
    """The passages and page-count gates on every staged part, then ids across parts.

    Runs in one process (the flow's): importing GX in every Dask worker would
    cost each of them seconds, while validating a part takes a fraction of one.
    """
    results: list[GateResult] = []
    first_chunks = []  # one page id per article and part: ids are unique globally iff these are
    with StageProgress("gate passages", len(records), "part", log=get_run_logger().info) as progress:
        for record in progress.track(records):
            table = read_staged_table(store, dump_id, layout, record["part"])
            distinct = len(set(table.column("page_id").to_pylist()))
            results.append(validate_passages(table, config.words_per_passage, config.max_residue_rate))
            results.append(validate_counts(PageCounts(**record["counts"]), distinct, table.num_rows))
            first_chunks.append(table.filter(pc.equal(table["chunk"], 0)).column("page_id").to_numpy())
    # passage ids are "{page_id}-{revision}-{chunk}", unique within each part (checked above); an article
    # split across parts would show its page id twice here. This keeps memory at 8 bytes an article.
    results.append(validate_unique_pages(np.concatenate(first_chunks) if first_chunks else np.array([], np.int64)))
    return results


def combine(results: list[GateResult]) -> list[GateResult]:
    """One result per gate name, failing rows and examples summed over parts."""
    merged: dict[str, GateResult] = {}
    for r in results:
        m = merged.setdefault(r.name, GateResult(r.name, True, r.checked, 0))
        m.rows += r.rows
        if sum(x.name == r.name for x in results) == 1:
            m.observed.update(r.observed)  # aggregates of one part only: summing them over parts means nothing
        m.success = m.success and r.success
        for f in r.failures:
            same = next((x for x in m.failures if (x.expectation, x.column) == (f.expectation, f.column)), None)
            if same is None:
                m.failures.append(Failure(f.expectation, f.column, f.unexpected, f.total, list(f.examples), f.observed))
            else:
                same.unexpected += f.unexpected
                same.total += f.total
                same.examples.extend(f.examples[: max(0, 5 - len(same.examples))])
    return list(merged.values())


def report_markdown(title: str, results: list[GateResult]) -> str:
    """Markdown for the Prefect artifact and the report file."""
    combined = combine(results)
    verdict = "passed" if all(r.success for r in combined) else "FAILED"
    body = "\n".join(r.markdown() for r in combined)
    return f"## {title}: {verdict}\n\n{body}"


def artifact_key(text: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:100]


@task
def enforce_gates(store: Store, dump_id: str, flat: list[GateResult]) -> str:
    """Pass the gate results' markdown on, or keep a report and stop the run."""
    markdown = report_markdown("Passages gate", flat)
    if all(r.success for r in flat):
        return markdown
    stamp = time.strftime("%Y%m%dT%H%M%S")
    url = write_report(store, dump_id, f"gate-{stamp}.md", markdown)
    create_markdown_artifact(markdown=markdown, key=artifact_key(f"gate-{dump_id}"), description="failed gate")
    failed = "; ".join(r.summary() for r in combine(flat) if not r.success)
    raise GateError(f"{failed}; nothing published; report: {url}")
