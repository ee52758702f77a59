"""Great Expectations gates of the index stage: embeddings before indexing, the index before publishing.

Both run in the flow's process on small per-vector and per-shard frames the
workers computed; a failed gate keeps a report under ``indexes/_reports/``,
removes the unpublished version's files and stops the run: LATEST and every
published version stay as they were.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from rag_core.errors import GateError
from rag_core.index.build import RECALL_K, BuiltShard, EmbeddedShard
from rag_core.index.plan import IndexPlan
from rag_core.index.retention import delete_version
from rag_core.index.version_names import INDEXES_DIR
from rag_core.progress import StageProgress
from rag_core.storage import Store
from tasks.quality import GateResult, _validate, artifact_key, combine, report_markdown

REPORTS_DIR = "_reports"
NORMALISED_NORMS = (0.99, 1.01)  # unit vectors, computed in float32
RAW_NORMS = (1e-3, 1e4)  # DPR-style unnormalised vectors: anything but zero or blown up


def norm_range(fingerprint: dict[str, Any]) -> tuple[float, float]:
    """The L2 norms a healthy vector of this encoder has."""
    return NORMALISED_NORMS if fingerprint.get("normalize") else RAW_NORMS


def validate_embedding_shard(shard: EmbeddedShard, dim: int, norms: tuple[float, float]) -> GateResult:
    """Dimension, finiteness, norms, and exactly one vector per passage (same ids, same order)."""
    import great_expectations.expectations as gxe

    n = len(shard.norm)
    frame = pd.DataFrame({
        "dim": np.full(n, shard.dim, dtype=np.int64),
        "finite": shard.finite.astype(bool),
        "norm": shard.norm.astype(np.float64),
        "matches_passage": shard.matches_passage[:n].astype(bool),
    })
    return _validate("embeddings", frame, [
        gxe.ExpectTableRowCountToEqual(value=shard.expected),
        gxe.ExpectColumnValuesToBeInSet(column="dim", value_set=[dim]),
        gxe.ExpectColumnValuesToBeInSet(column="finite", value_set=[True]),
        gxe.ExpectColumnValuesToBeBetween(column="norm", min_value=norms[0], max_value=norms[1]),
        gxe.ExpectColumnValuesToBeInSet(column="matches_passage", value_set=[True]),
    ])


def validate_index_counts(built: list[BuiltShard], n_passages: int) -> GateResult:
    """Every shard's index holds its passages, and all shards together hold all of them."""
    import great_expectations.expectations as gxe

    frame = pd.DataFrame({"shard": [b.shard for b in built], "ntotal": [b.ntotal for b in built],
                          "expected": [b.expected for b in built],
                          "ids_match": [b.ids_match for b in built]})
    return _validate("index-counts", frame, [
        gxe.ExpectColumnPairValuesToBeEqual(column_A="ntotal", column_B="expected"),
        gxe.ExpectColumnSumToBeBetween(column="ntotal", min_value=n_passages, max_value=n_passages),
        gxe.ExpectColumnValuesToBeInSet(column="ids_match", value_set=[True]),
    ])


def validate_recall(recall: np.ndarray, target: float) -> GateResult:
    """Mean held-out recall@10 against exact search reaches the target."""
    import great_expectations.expectations as gxe

    frame = pd.DataFrame({f"recall_at_{RECALL_K}": recall.astype(np.float64)})
    return _validate("recall", frame, [
        gxe.ExpectColumnMeanToBeBetween(column=f"recall_at_{RECALL_K}", min_value=target, max_value=1.0),
    ])


def _recall(built: list[BuiltShard]) -> np.ndarray:
    parts = [b.recall for b in built if len(b.recall)]
    return np.concatenate(parts) if parts else np.ones(1)


@task
def gate_embeddings(plan: IndexPlan, shards: list[EmbeddedShard]) -> list[GateResult]:
    """The embeddings gate on every shard."""
    norms = norm_range(plan.fingerprint)
    with StageProgress("gate embeddings", len(shards), "shard", log=get_run_logger().info) as progress:
        return [validate_embedding_shard(s, plan.dim, norms) for s in progress.track(shards)]


@task
def gate_index(plan: IndexPlan, built: list[BuiltShard]) -> list[GateResult]:
    """Counts per shard and in all, and the held-out recall@10 against the configured target."""
    return [validate_index_counts(built, plan.n_passages), validate_recall(_recall(built), plan.index.recall_target)]


@task
def enforce_index_gate(store: Store, plan: IndexPlan, stage: str, results: list[GateResult]) -> dict[str, Any]:
    """Pass a summary on for the manifest, or keep a report, remove the unpublished version and stop."""
    markdown = report_markdown(f"{stage.capitalize()} gate", results)
    combined = combine(results)
    if all(r.success for r in combined):
        summary: dict[str, Any] = {r.name: f"passed ({r.checked} expectations, {r.rows:,} rows)" for r in combined}
        for r in combined:
            summary.update({f"{r.name}: {key}": _plain(value) for key, value in r.observed.items()})
        return summary
    name = f"{plan.version}-{stage}-gate.md"
    reports = store.child(INDEXES_DIR, REPORTS_DIR)
    reports.write_bytes(markdown.encode(), name)
    if store.child(INDEXES_DIR).list(plan.version):
        delete_version(store, plan.version)  # unpublished shard files: nobody can see them, nobody needs them
    create_markdown_artifact(markdown=markdown, key=artifact_key(f"{stage}-gate-{plan.version}"),
                             description=f"failed {stage} gate")
    failed = "; ".join(r.summary() for r in combined if not r.success)
    get_run_logger().error("%s gate failed at %s", stage, time.strftime("%H:%M:%S"))
    raise GateError(f"{failed}; nothing published (LATEST unchanged); report: {reports.url_of(name)}")



def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers: the summary goes into the JSON manifest."""
    return value.item() if hasattr(value, "item") else value
