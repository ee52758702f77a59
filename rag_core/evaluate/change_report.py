"""What a new index version changed, against the version before it: the change report a refresh publishes.

- **pages**: added, changed (another revision, or other passage text) and removed, between the two
  versions' passage sets, read one part at a time (page id -> title, revision, digest of its passages);
- **passages**: of the new version's passage set, how many were encoded and how many had their vector
  reused (the embedding ranges' own records: rag_core.index.incremental_embedding);
- **per registered model**: the dev questions whose gold passage changed (rag_core.evaluate.gold_passages)
  and every dev question whose answer changed from the version the model was bound to to the new one.

Pure data: the Prefect artifact and the MLflow run that carry it are tasks/change_reports.py's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, Field

from rag_core.index.embedding_files import finished_ranges
from rag_core.index.versions import read_index_manifest
from rag_core.parquet_bytes import parquet_to_table
from rag_core.storage import Store
from rag_core.wiki.ingest import PASSAGES_DIR, published_manifest

SHOWN = 20  # titles / questions listed in the markdown per kind; the counts and the JSON have them all
_COLUMNS = ["page_id", "revision_id", "title", "text"]


class PageChanges(BaseModel):
    """Titles of the pages added, changed and removed from one passage set to the next, by page id."""

    added: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    unchanged: int = 0


class AnswerChange(BaseModel):
    """A dev question the model answers differently on the new version (``gold_changed``: its gold passage did)."""

    id: str
    question: str
    targets: list[str]
    old_answer: str
    new_answer: str
    gold_changed: bool = False


class ModelChanges(BaseModel):
    """One registered model's side of the report."""

    name: str
    version: str
    bound_index: str
    rebound: bool
    reason: str
    changed_gold: list[str] = Field(default_factory=list)  # ids of the dev questions whose gold passage changed
    answers: list[AnswerChange] = Field(default_factory=list)  # dev questions whose answer changed


class ChangeReport(BaseModel):
    """The change report of index version ``version`` (against ``previous``, None for a first version)."""

    version: str
    previous: str | None
    dump_id: str
    previous_dump_id: str | None
    pages: PageChanges
    passages: int  # in the new version's passage set
    encoded: int  # of those, passages whose vector was computed for this set
    reused: int  # of those, passages whose vector was copied from an earlier set
    models: list[ModelChanges] = Field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """The counts, as numbers for a tracking store."""
        return {"pages_added": len(self.pages.added), "pages_changed": len(self.pages.changed),
                "pages_removed": len(self.pages.removed), "pages_unchanged": self.pages.unchanged,
                "passages": self.passages, "passages_encoded": self.encoded, "passages_reused": self.reused,
                "dev_gold_changed": sum(len(m.changed_gold) for m in self.models),
                "dev_answers_changed": sum(len(m.answers) for m in self.models)}


def page_digests(store: Store, dump_id: str) -> dict[int, tuple[str, int, str]]:
    """page id -> (title, revision id, sha1 of its passages' text in order) of the published passage set."""
    manifest = published_manifest(store, dump_id)
    if manifest is None:
        return {}
    root = store.child(PASSAGES_DIR, dump_id)
    hashes: dict[int, Any] = {}
    meta: dict[int, tuple[str, int]] = {}
    for part in manifest["parts"]:
        for row in parquet_to_table(root.read_bytes(part["path"]), _COLUMNS).to_pylist():
            page = int(row["page_id"])
            hashes.setdefault(page, hashlib.sha1()).update(row["text"].encode() + b"\0")
            meta[page] = (row["title"], int(row["revision_id"]))
    return {page: (*meta[page], h.hexdigest()) for page, h in hashes.items()}


def page_changes(old: dict[int, tuple[str, int, str]], new: dict[int, tuple[str, int, str]]) -> PageChanges:
    """Pages only in ``new`` (added), in both with another revision or text (changed), only in ``old`` (removed)."""
    out = PageChanges()
    for page in sorted(new.keys() | old.keys()):
        if page not in old:
            out.added.append(new[page][0])
        elif page not in new:
            out.removed.append(old[page][0])
        elif old[page][1:] != new[page][1:]:
            out.changed.append(new[page][0])
        else:
            out.unchanged += 1
    return out


def embedding_counts(store: Store, fingerprint_id: str, dump_id: str) -> tuple[int, int]:
    """(encoded, reused) over the finished embedding ranges of passage set ``dump_id`` under the encoder."""
    records = finished_ranges(store, fingerprint_id, dump_id)
    return sum(int(r.get("encoded", 0)) for r in records), sum(int(r.get("reused", 0)) for r in records)


def version_changes(store: Store, version: str, previous: str | None) -> ChangeReport:
    """The version-level part of the report: pages and passages of ``version`` against ``previous``."""
    manifest = read_index_manifest(store, version)
    before = read_index_manifest(store, previous) if previous else None
    new = page_digests(store, manifest.dump_id)
    old = page_digests(store, before.dump_id) if before else {}
    encoded, reused = embedding_counts(store, manifest.fingerprint_id, manifest.dump_id)
    return ChangeReport(version=version, previous=previous, dump_id=manifest.dump_id,
                        previous_dump_id=before.dump_id if before else None, pages=page_changes(old, new),
                        passages=int(manifest.count), encoded=encoded, reused=reused)


def answer_changes(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], questions: dict[str, str],
                   targets: dict[str, Sequence[str]], gold_changed: Iterable[str] = ()) -> list[AnswerChange]:
    """The questions whose ``prediction`` differs between two prediction lists (rows with ``id``, ``prediction``)."""
    before = {r["id"]: r["prediction"] for r in old}
    changed = set(gold_changed)
    return [AnswerChange(id=r["id"], question=questions.get(r["id"], ""), targets=list(targets.get(r["id"], ())),
                         old_answer=before[r["id"]], new_answer=r["prediction"], gold_changed=r["id"] in changed)
            for r in new if r["id"] in before and before[r["id"]] != r["prediction"]]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:120]


def _listed(titles: list[str]) -> str:
    more = f" and {len(titles) - SHOWN} more" if len(titles) > SHOWN else ""
    return ", ".join(_cell(t) for t in titles[:SHOWN]) + more if titles else "none"


def to_markdown(report: ChangeReport) -> str:
    """The report as the Prefect artifact shows it."""
    pages = report.pages
    lines = [f"# Changes in index version `{report.version}`",
             f"Against `{report.previous}` (passages `{report.previous_dump_id}` -> `{report.dump_id}`)."
             if report.previous else f"First version (passages `{report.dump_id}`): every page is new.", "",
             "| pages added | changed | removed | unchanged | passages | encoded | reused |",
             "|---:|---:|---:|---:|---:|---:|---:|",
             f"| {len(pages.added)} | {len(pages.changed)} | {len(pages.removed)} | {pages.unchanged} | "
             f"{report.passages} | {report.encoded} | {report.reused} |", "",
             f"Added: {_listed(pages.added)}.", f"Changed: {_listed(pages.changed)}.",
             f"Removed: {_listed(pages.removed)}."]
    for model in report.models:
        lines += ["", f"## {model.name} v{model.version} (bound to `{model.bound_index}`)",
                  f"{'Re-bound' if model.rebound else 'Kept'}: {model.reason.replace('|', '/')}.",
                  f"Dev questions whose gold passage changed: {len(model.changed_gold)}; answers that changed: "
                  f"{len(model.answers)}."]
        if model.answers:
            lines += ["", "| question | gold | old answer | new answer | gold changed |", "|---|---|---|---|---|"]
            lines += [f"| {_cell(a.question)} | {_cell(' / '.join(a.targets))} | {_cell(a.old_answer)} | "
                      f"{_cell(a.new_answer)} | {'yes' if a.gold_changed else ''} |" for a in model.answers[:SHOWN]]
    return "\n".join(lines) + "\n"


def previous_version(versions: Sequence[str], version: str) -> str | None:
    """The version published just before ``version`` among ``versions`` (oldest first), or None."""
    earlier = [v for v in versions if v < version]
    return earlier[-1] if earlier else None
