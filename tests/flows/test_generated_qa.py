"""The generated-QA stage end to end: `wikirag generated-qa` on a real index of real sample passages (real MiniLM,
FAISS), a real Prefect flow run on a real local Dask cluster, the real GX gate; published once, then reused."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from cli.wikirag import main
from rag_core.errors import GateError
from rag_core.evaluate.normalize import normalize_answer
from rag_core.parquet_bytes import parquet_to_table
from rag_core.storage import Store
from rag_core.train.generated_qa import GeneratedQAConfig
from rag_core.train.generated_qa_store import DATASET_DIR, MANIFEST
from rag_core.train.loaders import load_task
from rag_core.wiki.ingest import read_passages
from tests.rag_core.train.generatedqafiles import publish_minilm_index


@pytest.fixture(scope="module")
def index(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("gqa-flow") / "store"
    return root, publish_minilm_index(Store(str(root)), "gqa")


def _cli(store: Path, version: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    code = main(["generated-qa", "--store", str(store), "--index", version, "--shards", "2", *extra])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0, out
    return json.loads(out[-1])


def _written(store: Path) -> dict[str, tuple[int, float]]:
    return Store(str(store)).files(*DATASET_DIR)


def test_the_stage_publishes_once_reuses_it_and_leaks_no_dev_question(
        index, home: Path, prefect_server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store, version = index
    monkeypatch.setenv("WIKIRAG_WORKERS", "2")
    first = _cli(store, version, capsys)
    folder = Store(first["url"])
    manifest = folder.read_json(MANIFEST)
    assert not first["reused"] and first["index_version"] == version == manifest["index_version"]
    assert first["url"].startswith(str(store / "tasks" / "generated-qa" / version))
    counts = first["counts"]
    assert counts["candidates"] == (counts["held_out"] + counts["not_retrieved"] + counts["answer_not_in_top1"]
                                    + counts["kept"] + counts["duplicate"] + counts["when_capped"]
                                    + counts["subject_capped"])
    assert counts["kept"] > 20 and counts["not_retrieved"] + counts["answer_not_in_top1"] > 0

    # What was published: parts with offsets that check out against the passages, and train/dev files of the
    # generated-qa task kind whose sizes the manifest records.
    texts = dict(zip(*(read_passages(Store(str(store)), "gqa").column(c).to_pylist() for c in ("passage_id", "text")),
                     strict=True))
    parts = pa.concat_tables([parquet_to_table(folder.read_bytes(name)) for name in manifest["files"]
                              if name.startswith("part-")])
    assert parts.num_rows == counts["kept"]
    for row in parts.to_pylist():
        assert texts[row["passage_id"]][row["answer_start"]:row["answer_end"]] == row["answer"]
    train, dev = load_task("generated-qa", first["train"]), load_task("generated-qa", first["dev"])
    assert len(train) + len(dev) == counts["kept"] and {len(train), len(dev)} == set(first["splits"].values())
    assert all(e.provenance[0].passage_id in texts for e in train + dev)

    # A rerun finds the manifest: nothing is made or written again.
    before = _written(store)
    again = _cli(store, version, capsys)
    assert again["reused"] and again["url"] == first["url"] and again["counts"] == counts
    assert _written(store) == before

    # A dev file holding a question of the dataset: a new dataset (other held-out items), without that question.
    asked = train[0].input
    dev_file = tmp_path / "dev.jsonl"
    dev_file.write_text(json.dumps({"question": asked.lower(), "answers": ["x"]}) + "\n")
    third = _cli(store, version, capsys, "--dev", str(dev_file))
    assert not third["reused"] and third["url"] != first["url"] and third["counts"]["held_out"] >= 1
    inputs = {e.input for e in load_task("generated-qa", third["train"]) + load_task("generated-qa", third["dev"])}
    assert asked not in inputs and len(inputs) == counts["kept"] - third["counts"]["held_out"]


def test_reader_lead_targets_are_published_from_the_generators_words(
        index, home: Path, prefect_server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, real_generator: Path) -> None:
    """`--target reader-lead` runs the real default generator (SmolLM2-135M-Instruct) in each shard task: the
    published examples train toward its lead targets, each ending at its pair's answer, while the parts keep the
    span."""
    store, version = index
    monkeypatch.setenv("WIKIRAG_WORKERS", "2")
    assert main(["generated-qa", "--store", str(store), "--index", version, "--target", "reader-lead"]) == 2
    assert "give its folder with --generator DIR" in capsys.readouterr().err  # one line, nothing made
    led = _cli(store, version, capsys, "--target", "reader-lead", "--generator", str(real_generator),
               "--subject-share", "0")
    folder = Store(led["url"])
    manifest = folder.read_json(MANIFEST)
    assert manifest["config"]["target"] == "reader-lead" and manifest["config"]["generator"] == str(real_generator)
    assert not led["counts"].get("reader_disagrees") and led["counts"]["subject_capped"] > 0  # targets, no check
    parts = pa.concat_tables([parquet_to_table(folder.read_bytes(name)) for name in manifest["files"]
                              if name.startswith("part-")])
    rows = {r["id"]: r for r in parts.to_pylist()}
    examples = load_task("generated-qa", led["train"]) + load_task("generated-qa", led["dev"])
    assert len(examples) == len(rows) == led["counts"]["kept"]
    for e in examples:
        target, answer = e.targets[0], rows[e.id]["answer"]
        assert target == rows[e.id]["target"] and target.removesuffix(".").endswith(answer)
        assert e.targets[-1] == answer  # what EM and recall score against
    assert any(e.targets[0] != rows[e.id]["answer"] for e in examples)  # the generator's lead-ins


def test_the_gate_fails_on_a_bad_dataset_and_nothing_is_published(
        index, home: Path, prefect_server: str) -> None:
    from flows.generated_qa import generated_qa
    from runtime.dask_runner import dask_runner

    store, version = index
    config = GeneratedQAConfig(shards=2, min_pairs=100_000, top_k=3)  # more pairs than 120 passages can give
    with pytest.raises(GateError, match=r"gate generated-qa failed: expect_table_row_count_to_be_between\(table\).*"
                                        r"nothing published; report: ") as failed:
        generated_qa.with_options(task_runner=dask_runner(None, 2))(store=str(store), index_version=version,
                                                                     config=config)
    report = Path(str(failed.value).rsplit("report: ", 1)[1])
    folder = report.parent.parent  # <dataset folder>/_reports/gate-*.md
    assert folder.parent == Path(store, *DATASET_DIR, version) and "expect_table_row_count" in report.read_text()
    assert [p.relative_to(folder) for p in folder.rglob("*") if p.is_file()] == [report.relative_to(folder)]


def test_the_gate_refuses_offsets_outside_the_passage_and_a_leaked_question(index) -> None:
    from rag_core.train.generated_qa import HeldOut, merge_shards, shard_pairs
    from rag_core.train.generated_qa_store import index_search
    from tasks.generated_qa import validate_pairs

    store, version = index
    passages = read_passages(Store(str(store)), "gqa")
    config = GeneratedQAConfig()
    part = shard_pairs(passages, 0, index_search(Store(str(store)), version), HeldOut(), config)
    texts = dict(zip(passages.column("passage_id").to_pylist(), passages.column("text").to_pylist(), strict=True))
    part.table = part.table.append_column(
        "passage_text", pa.array([texts[p] for p in part.table.column("passage_id").to_pylist()], pa.string()))
    table, _ = merge_shards([part], config)
    assert validate_pairs(table, HeldOut(), 1).success
    rows = table.to_pylist()
    rows[0]["answer_start"] += 1  # the span no longer reads the answer
    bad = pa.Table.from_pylist(rows, schema=table.schema)
    leak = HeldOut(questions=frozenset({normalize_answer(rows[1]["question"])}))
    result = validate_pairs(bad, leak, 1)
    failed = {(f.expectation, f.column, f.unexpected) for f in result.failures}
    assert not result.success
    assert failed == {("expect_column_values_to_be_in_set", "span_in_passage", 1),
                      ("expect_column_values_to_be_in_set", "held_out", 1)}
