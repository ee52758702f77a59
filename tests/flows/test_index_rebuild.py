"""Real runs of the index_rebuild flow: Prefect server, a 2-worker Dask cluster, FAISS, GX, real encoders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
import pytest
from mlflow import MlflowClient

from flows.index_rebuild import index_rebuild
from rag_core.errors import GateError
from rag_core.evaluate.paired import beyond_chance
from rag_core.index.embedding_files import EmbedConfig, range_record, read_ref
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.build import TRAINED
from rag_core.index.faiss_index import IndexConfig, coarse_fingerprint, deserialize_index, set_search_params
from rag_core.index.search import ShardedIndex
from rag_core.index.version_names import INDEXES_DIR
from rag_core.index.versions import latest_version, list_versions, read_index_manifest, read_manifest
from rag_core.storage import Store
from rag_core.train.generated_qa_store import DATASET_DIR, MANIFEST
from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.ingest import IngestConfig, read_passages
from runtime.dask_runner import dask_runner
from runtime.process_groups import die_with_parent
from runtime.settings import Settings, StoreAccess
from tests.conftest import SAMPLE_BZ2, S3Server
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.generatorfiles import save_tiny_llama
from tests.helpers.pages import QUESTIONS, page_rows, write_dump

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """One Dask cluster for the module's flow runs, as a team would share one (saves a start per run)."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as local:
        yield local.scheduler_address


@pytest.fixture(scope="module")
def articles(wiki: Path) -> list:
    """The real sample's first 14 articles with text (no redirects)."""
    pages = [p for p in iter_pages(DumpSource(str(SAMPLE_BZ2))) if p.ns == 0 and not p.redirect and p.text]
    return pages[:14]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_bert(tmp_path_factory.mktemp("encoders") / "tiny-bert")


def rebuild(address: str, dump: Path, index: Path, store: str | StoreAccess, encoder: Path | None, *,
            shards: int = 3, **index_config) -> str:
    encoder_config = EncoderConfig(path=str(encoder) if encoder else None)  # dtype auto: what users get
    return index_rebuild.with_options(task_runner=dask_runner(address, 0))(
        ingest_config=IngestConfig(dump=str(dump), index=str(index)),
        store=store,
        embed=EmbedConfig(encoder=encoder_config, shards=shards),
        index=IndexConfig(**index_config),
    )


def _all_vectors(store: Store, version: str) -> tuple[list[str], np.ndarray]:
    """Every stored vector a version was built from, in passage order."""
    ids, vectors = [], []
    for entry in read_index_manifest(store, version).shards:
        i, v = read_ref(store, entry.embeddings)
        ids += i
        vectors.append(v)
    return ids, np.concatenate(vectors)


def _artifact_keys() -> set[str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {a.key for a in client.read_artifacts() if a.key}


def test_rebuild_publishes_a_version_whose_search_equals_exact_search(
        articles: list, tiny: Path, home: Path, prefect_server: str, cluster: str, tmp_path: Path) -> None:
    dump, index = write_dump(tmp_path, page_rows(articles))
    store_url = str(home / "store")
    version = rebuild(cluster, dump, index, store_url, tiny)

    store = Store(store_url)
    assert latest_version(store) == version and list_versions(store) == [version]
    manifest = read_manifest(store)
    passages = read_passages(store, manifest["dump_id"])
    assert manifest["count"] == passages.num_rows > 100 and len(manifest["shards"]) == 3
    assert (manifest["dim"], manifest["metric"], manifest["factory"]) == (32, "ip", "Flat")
    assert manifest["encoder"]["name"] == "tiny-bert" and manifest["encoder"]["kind"] == "sentence"
    assert manifest["dump"]["sha256"] and all(len(s["sha256"]) == 64 for s in manifest["shards"])
    assert manifest["gates"]["recall: expect_column_mean_to_be_between(recall_at_10)"] == 1.0
    assert {"embeddings", "index-counts", "recall"} <= set(manifest["gates"])
    assert f"index-{version}".lower().replace(".", "-") in _artifact_keys()
    assert rebuild(cluster, dump, index, store_url, tiny) == version  # the same dump and settings: LATEST stands
    assert list_versions(store) == [version]

    # The merged top-k over 3 shards equals exact search over every stored vector.
    encoder = Encoder.load(EncoderConfig(path=str(tiny), dtype="float32"))
    queries = encoder.encode_questions(QUESTIONS)
    hits = ShardedIndex.load(store).search(queries, 7)
    ids, vectors = _all_vectors(store, version)
    exact = np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :7]
    assert [[h.passage_id for h in q] for q in hits] == [[ids[i] for i in row] for row in exact]
    by_id = dict(zip(passages["passage_id"].to_pylist(), passages["title"].to_pylist()))
    assert all(h.title == by_id[h.passage_id] for q in hits for h in q)


def test_a_sharded_ivf_version_is_trained_once_and_its_shards_load_as_one_index(
        articles: list, tiny: Path, home: Path, prefect_server: str, cluster: str, tmp_path: Path) -> None:
    dump, index = write_dump(tmp_path, page_rows(articles))
    store_url = str(home / "store")
    # auto's family for a sharded version; the random 32-d encoder's 4-bit codes are coarse, so the recall gate
    # passes only if the re-rank depth was tuned for them
    version = rebuild(cluster, dump, index, store_url, tiny, factory="IVF4,PQ16x4fs,RFlat", tune_queries=50)

    store = Store(store_url)
    manifest = read_index_manifest(store, version)
    trained = deserialize_index(store.read_bytes(INDEXES_DIR, version, TRAINED))  # the flow trained it, once
    assert trained.ntotal == 0 and len(manifest.shards) == 3
    assert {e.meta["coarse_sha256"] for e in manifest.shards} == {coarse_fingerprint(trained)}
    depth = faiss.downcast_index(trained).k_factor  # tuned once for the version, kept by every shard
    assert depth > 4 and {e.meta["search"]["k_factor_rf"] for e in manifest.shards} == {depth}
    assert manifest.gates["recall: expect_column_mean_to_be_between(recall_at_10)"] >= 0.95
    loaded = ShardedIndex.load(store, version)
    assert loaded.merged and loaded.num_shards == 3

    ids, vectors = _all_vectors(store, version)
    whole = trained  # one index over every stored vector, filled from the same trained index
    whole.add(vectors)
    set_search_params(whole, nprobe=2)
    loaded.set_search_params(nprobe=2)
    queries = Encoder.load(EncoderConfig(path=str(tiny), dtype="float32")).encode_questions(QUESTIONS)
    _, want = whole.search(queries, 5)
    hits = loaded.search(queries, 5)
    assert [[h.passage_id for h in q] for q in hits] == [[ids[i] for i in row if i >= 0] for row in want]


def test_the_command_loads_its_encoder_before_the_flow_and_the_plan_uses_that_one(
        articles: list, tiny: Path, home: Path, prefect_server: str, cluster: str, tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    from cli.wikirag import main
    from rag_core.index.plan import load_encoder

    dump, index = write_dump(tmp_path, page_rows(articles[:4]))
    load_encoder.cache_clear()
    assert main(["index-rebuild", str(dump), "--index", str(index), "--shards", "1", "--encoder", str(tiny),
                 "--dask-address", cluster]) == 0
    version = capsys.readouterr().out.strip().splitlines()[-1]
    assert latest_version(Store(str(home / "store"))) == version
    # One load, before the flow (while a server of the command's own would boot); the plan found it loaded.
    info = load_encoder.cache_info()
    assert (info.misses, info.hits) == (1, 1), info


def test_incremental_rebuild_reuses_unchanged_passages_while_readers_keep_working(
        articles: list, tiny: Path, home: Path, prefect_server: str, cluster: str, tmp_path: Path) -> None:
    store_url = str(home / "store")
    first = rebuild(cluster, *write_dump(tmp_path, page_rows(articles[:12]), "old"), store_url, tiny)
    store = Store(store_url)
    old = read_manifest(store, first)

    # One article edited (a sentence appended: only its last window changes), one removed, two added.
    pages = page_rows(articles[:12])
    pid, title, text, rev = pages[0]
    pages[0] = (pid, title, text + "\n\nA sentence added by a later edit.", rev + 1)
    removed_title = pages.pop(5)[1]
    pages += page_rows(articles[12:14])

    seen: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:  # a consumer loading LATEST over and over during the rebuild
        while not stop.is_set():
            try:
                seen.append(ShardedIndex.load(Store(store_url)).version)
            except BaseException as exc:  # noqa: BLE001 - any failure here is the test's failure
                errors.append(exc)
            time.sleep(0.05)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        second = rebuild(cluster, *write_dump(tmp_path, pages, "new"), store_url, tiny)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[:1]
    assert set(seen) <= {first, second} and seen[0] == first and first in seen

    new = read_manifest(store, second)
    records = [range_record(store, new["fingerprint_id"], new["dump_id"], e["embeddings"]["start"],
                            e["embeddings"]["stop"]) for e in new["shards"]]
    reused, encoded = sum(r["reused"] for r in records), sum(r["encoded"] for r in records)
    assert sum(r["reused_from"][old["dump_id"]] for r in records) == reused
    new_passages = read_passages(store, new["dump_id"])
    old_passages = read_passages(store, old["dump_id"])
    old_texts = set(zip(old_passages["title"].to_pylist(), old_passages["text"].to_pylist()))
    unchanged = sum(pair in old_texts for pair in zip(new_passages["title"].to_pylist(),
                                                     new_passages["text"].to_pylist()))
    assert reused == unchanged and encoded == new_passages.num_rows - unchanged and 0 < encoded < reused
    titles = {h.title for q in ShardedIndex.load(store).search(np.eye(32, dtype=np.float32), 50) for h in q}
    assert removed_title not in titles  # removed passages leave the index
    assert new["count"] == new_passages.num_rows
    assert ShardedIndex.load(store, first).ntotal == old["count"]  # the older version stays loadable


def test_every_gate_failure_publishes_nothing(articles: list, tiny: Path, home: Path, prefect_server: str,
                                              cluster: str, tmp_path: Path) -> None:
    store_url = str(home / "store")
    dump, index = write_dump(tmp_path, page_rows(articles[:6]))
    good = rebuild(cluster, dump, index, store_url, tiny)
    store = Store(store_url)

    broken = save_tiny_bert(tmp_path / "broken-bert", broken=True)
    with pytest.raises(GateError, match=r"gate embeddings failed: expect_column_values_to_be_in_set\(finite\)"
                                        r".*nothing published \(LATEST unchanged\); report: ") as err:
        rebuild(cluster, dump, index, store_url, broken)
    report = Path(str(err.value).rsplit("report: ", 1)[1])
    assert "| expect_column_values_to_be_in_set | finite |" in report.read_text()

    with pytest.raises(GateError, match=r"gate recall failed: expect_column_mean_to_be_between\(recall_at_10\): "
                                        r"observed 0\.\d+"):
        rebuild(cluster, dump, index, store_url, tiny, factory="PQ2x4", recall_target=0.95)

    assert latest_version(store) == good and list_versions(store) == [good]
    leftovers = [p.name for p in (home / "store" / "indexes").iterdir() if p.name not in (good, "LATEST", "_reports")]
    assert leftovers == []  # the failed runs' shard files were removed
    assert len(list((home / "store" / "indexes" / "_reports").iterdir())) == 2


def _cli(*args: str, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.wikirag", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, preexec_fn=die_with_parent)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    return proc.stderr.strip().splitlines()[-1]


def test_search_cli_local_and_s3_with_its_bad_inputs(articles: list, tiny: Path, home: Path, prefect_server: str,
                                                     cluster: str, s3_server: S3Server, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    s3_url = f"s3://{s3_server.bucket}/search-cli"
    version = rebuild(cluster, *write_dump(tmp_path, page_rows(articles[:8])), Settings().store_access(s3_url), tiny)
    env = {**os.environ, "PREFECT_API_URL": prefect_server}

    questions = tmp_path / "questions.txt"
    questions.write_text("\n".join(QUESTIONS[1:]) + "\n\n")
    proc = _cli("search", QUESTIONS[0], "--questions", str(questions), "--store", s3_url, "-k", "3", "--json",
                env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["question"] for line in lines] == QUESTIONS  # input order
    assert all(len(line["results"]) == 3 for line in lines)
    assert set(lines[0]["results"][0]) == {"passage_id", "title", "text", "score"}
    scores = [r["score"] for r in lines[0]["results"]]
    assert scores == sorted(scores, reverse=True)

    wrong = {**env, "AWS_SECRET_ACCESS_KEY": "wrong-secret"}
    last = _one_line_error(_cli("search", "anything", "--store", s3_url, env=wrong))
    assert s3_url in last and "AWS_SECRET_ACCESS_KEY" in last and "wrong-secret" not in last
    missing = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    last = _one_line_error(_cli("search", "anything", "--store", s3_url, env=missing))
    assert s3_url in last and "AWS_ACCESS_KEY_ID" in last

    last = _one_line_error(_cli("search", "anything", "--store", s3_url, "--version", "20200101T000000.000Z-00", env=env))
    assert f"index version 20200101T000000.000Z-00 not found; available: {version}" in last

    other = save_tiny_bert(tmp_path / "other-bert", seed=1)
    last = _one_line_error(_cli("search", "anything", "--store", s3_url, "--encoder", str(other), env=env))
    assert "does not match the encoder 'tiny-bert' the index was built with: weights_sha256" in last

    # A local copy of the store with one shard's bytes changed after publishing.
    local = tmp_path / "local-store"
    Store(s3_url, s3_server.options()).fs.get(f"{s3_url}/", str(local), recursive=True)
    shard = local / "indexes" / version / "shard-00001.faiss"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    last = _one_line_error(_cli("search", "anything", "--store", str(local), env=env))
    assert "shard-00001.faiss: corrupt shard: sha256" in last and "republish the version" in last

    last = _one_line_error(_cli("search", "anything", "--store", str(tmp_path / "empty"), env=env))
    assert "no index has been published here" in last


@pytest.mark.timeout(1500)  # the whole main job twice, with fine-tuning, on 2 shared cores
def test_main_job_builds_an_index_of_real_articles_and_answers(articles: list, wiki: Path, home: Path,
                                                                prefect_server: str, tmp_path: Path) -> None:
    """The README's main job on the sample's first 14 articles (719 of its 4,391 passages: the whole sample is the
    README command's, checked in a fresh clone at each stop); the sample's own fetch is tested in
    tests/runtime/test_sample_dump.py."""
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "WIKIRAG_WORKERS": "2"}
    dump, _ = write_dump(tmp_path, page_rows(articles))
    llama = save_tiny_llama(tmp_path / "llama")  # the real default generator's fetch is tested in test_models
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _cli("run", "--dump", str(dump), "--generator", str(llama), "--max-steps", "2", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hardware: CPU " in proc.stderr and "torch capability " in proc.stderr  # the machine, then the dtype
    assert "model dtype float32 on cpu: " in proc.stderr or "model dtype bfloat16 on cpu: " in proc.stderr
    summary = proc.stdout
    # Fine-tuned on QA generated from the new index's passages (its own gate on generated dev questions) ...
    # (champion only if it beat its own zero-shot start there by more than chance, as every `wikirag finetune` is
    # gated)
    row = summary.split("| generated-qa | em | ", 1)[1].split("\n", 1)[0].split(" | ")
    zero_shot_dev, fine_tuned_dev = float(row[0]), float(row[1])
    gained_dev, lost_dev = (int(n) for n in row[2].split(" / "))
    beat = fine_tuned_dev > zero_shot_dev and beyond_chance(gained_dev, lost_dev)
    assert row[3:6] == ["wikirag-generated-qa v1", "champion" if beat else "challenger", "2"]
    dev_examples = int(row[6].removesuffix(" |"))  # how many dev questions decided it: checked against MLflow below
    # ... then gated on the real held-out questions that these 14 articles answer: wikirag-qa is champion only if
    # it beats its zero-shot start there, and the summary says which with the numbers.
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    qa = client.get_model_version("wikirag-qa", "1")
    gate = json.loads(qa.tags["qa_gate"])
    metrics = client.get_run(qa.run_id).data.metrics
    n = gate["test_questions"]
    assert n > 0 and gate["sources"]["written"] > 0 and metrics["test_fine_tuned_examples"] == n
    assert "Real human-written questions answerable from this index: written " in summary
    for row in ("zero-shot RAG (the start)", "fine-tuned RAG", "closed-book (generator alone)"):
        assert f"| {row} | " in summary and summary.split(f"| {row} | ", 1)[1].split("\n", 1)[0].endswith(f" | {n} |")
    zero_shot, fine_tuned = metrics["test_zero_shot_em"], metrics["test_fine_tuned_em"]
    assert (fine_tuned, zero_shot) == (gate["scores"]["fine-tuned"]["em"], gate["scores"]["zero-shot"]["em"])
    assert gate["gained"] - gate["lost"] == round((fine_tuned - zero_shot) * n)  # the changed answers explain the means
    assert metrics["test_fine_tuned_gained"] == gate["gained"] and "Question by question, " in summary
    numbers = f"(test EM {fine_tuned:.3f} vs its zero-shot start's {zero_shot:.3f} on {n} held-out questions)"
    promoted = fine_tuned > zero_shot and beyond_chance(gate["gained"], gate["lost"])  # the gate's rule
    if promoted:
        assert client.get_model_version_by_alias("wikirag-qa", "champion").version == "1"
        assert "wikirag-qa v1 is champion: the fine-tune beat its zero-shot start" in summary
        assert "## Questions answered by the champion, wikirag-qa v1" in summary
    else:
        assert "champion" not in client.get_registered_model("wikirag-qa").aliases
        assert (f"The fine-tune did not beat its zero-shot start {numbers}, so wikirag-qa v1 is not promoted" in summary
                if fine_tuned <= zero_shot else
                f"The fine-tune scored above its zero-shot start {numbers}, but its lead is within chance (below), "
                "so wikirag-qa v1 is not promoted" in summary)
        assert "## Questions answered by the zero-shot model" in summary
    teacher = summary.split("**Who was the teacher of Alexander the Great?**", 1)[1].splitlines()
    assert teacher[1].startswith("  - Aristotle (")  # the answering model's most probable passage is Aristotle's
    if not promoted:  # the zero-shot model answers as `wikirag ask` does with the same generator and index
        asked = _cli("ask", "--generator", str(llama), "--n-docs", "2", "--json", "Who was the teacher of Alexander "
                     "the Great?", env=env)
        assert asked.returncode == 0, asked.stderr[-3000:]
        assert teacher[0].endswith(f"→ {json.loads(asked.stdout)['answer']!r}")
    plots = sorted(p.name for p in (home / "reports").iterdir())
    assert plots == ["metrics_per_task.png", "real_questions.png", "retrieval_recall.png", "training_loss.png"]
    assert f"- plot: `{home / 'reports' / 'real_questions.png'}`" in summary
    store = Store(str(home / "store"))
    manifest = read_manifest(store)
    count = read_passages(store, manifest["dump_id"]).num_rows
    assert manifest["count"] == count > 500 and manifest["encoder"]["name"] == "all-MiniLM-L6-v2"
    # its generated QA (ShortRun's data fields): no pairs answered by their page's subject, targets in the generator's
    # own words
    [qa_data] = [Store(str(folder)).read_json(MANIFEST) for folder in
                 (home / "store").joinpath(*DATASET_DIR, manifest["version"]).iterdir()]
    assert (qa_data["config"]["target"], qa_data["config"]["generator"]) == ("reader-lead", str(llama))
    assert qa_data["config"]["subject_share"] == 0.0 and "subject_capped" in qa_data["counts"]
    trained = client.get_model_version("wikirag-generated-qa", "1")
    recipe_run = client.get_run(trained.run_id).data  # ShortRun's weight mix: the registered weights are a midpoint
    assert recipe_run.params["weight_mix"] == "0.5" and "mixed_dev_loss" in recipe_run.metrics
    scored = Path(client.download_artifacts(trained.run_id, "dev/predictions.jsonl", str(tmp_path)))
    assert len(scored.read_text().splitlines()) == dev_examples > 0
    # the changed answers explain the dev means, and the run records them
    assert gained_dev - lost_dev == round((fine_tuned_dev - zero_shot_dev) * dev_examples)
    assert (recipe_run.metrics["dev_answers_gained"], recipe_run.metrics["dev_answers_lost"]) == (gained_dev, lost_dev)
    assert trained.tags["index_version"] == qa.tags["index_version"] == manifest["version"]
    assert {a.path for a in client.list_artifacts(trained.run_id, "plots")} >= {
        "plots/real_questions.png", "plots/metrics_per_task.png", "plots/retrieval_recall.png",
        "plots/training_loss.png", "plots/loss_curve.png"}

    again = _cli("run", "--dump", str(dump), "--generator", str(llama), "--max-steps", "2", env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing wikirag-generated-qa v1" in again.stderr  # same dump, recipe and index: nothing retrained
    [alias] = client.get_model_version("wikirag-generated-qa", "1").aliases  # champion or challenger, kept
    assert f"reusing wikirag-generated-qa v1, {alias} now" in again.stderr, again.stderr[-3000:]
    assert (f"| {gained_dev} / {lost_dev} | wikirag-generated-qa v1 | {alias} | 2 | {dev_examples} |"
            in again.stdout), again.stdout[-3000:]
    assert "gated before on the same" in again.stderr  # nor evaluated or registered again
    assert len(client.search_model_versions("name='wikirag-qa'")) == 1
    assert read_manifest(store)["version"] == manifest["version"]

    # The RAG model on the real sample's index: a few training steps, every decoding mode, save, and a reload
    # onto a second index version (HNSW, built from the same embeddings: only the FAISS shards are new).
    import torch

    from rag_core.model.rag_model import RagConfig, RagModel
    from rag_core.model.retriever import IndexRetriever

    torch.manual_seed(0)
    questions, answers = ["Who tutored Alexander the Great?", "What is the capital of Alabama?"], ["Aristotle", "Montgomery"]
    first = IndexRetriever.load(store)
    model = RagModel.create(RagConfig(kind="token", n_docs=3), first)
    assert model.retrieve(questions[:1]).titles[0][0] == "Aristotle"  # the packaged encoder, before training
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    losses = []
    for _ in range(6):
        loss = model(model.retrieve(questions), answers).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and all(np.isfinite(losses))
    token_greedy = model.generate(questions, max_length=8)
    assert len(token_greedy) == 2 and len(model.generate(questions, num_beams=2, max_length=8)) == 2
    saved = model.save_pretrained(tmp_path / "rag-token")

    sequence = RagModel.create(RagConfig(kind="sequence", n_docs=3), first)
    thorough = sequence.generate(questions, num_beams=2, max_length=8, mode="thorough")
    assert len(thorough) == 2 and len(sequence.generate(questions, num_beams=2, max_length=8, mode="fast")) == 2

    # Another shard count as well: the ranges change, and the stored vectors are copied, not encoded again.
    shards = 3 if len(manifest["shards"]) != 3 else 5
    files = {p: store.read_bytes(p) for p in read_index_manifest(store, first.version).files()}
    proc = _cli("index-rebuild", str(dump), "--factory", "HNSW32", "--shards", str(shards),
                env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    second = IndexRetriever.load(store, proc.stdout.strip())
    assert second.version != first.version and second.manifest["factory"] == "HNSW32"
    assert len(second.manifest["shards"]) == shards and second.manifest["count"] == count
    records = [store.read_json("embeddings", p) for p in store.files("embeddings") if p.endswith(".json")]
    assert sum(r["encoded"] for r in records) == count  # each passage encoded once over both runs
    copied = [r for r in records if r["reused"]]
    assert len(copied) == shards and sum(r["reused"] for r in copied) == count and not any(r["encoded"] for r in copied)
    assert {p: store.read_bytes(p) for p in files} == files  # nothing the first version reads was rewritten
    reloaded = RagModel.from_pretrained(saved, second)
    assert (reloaded.trained_index_version, reloaded.index_version) == (first.version, second.version)
    assert reloaded.generate(questions, max_length=8) == token_greedy  # same knowledge, same answers
