"""Guarantee: inputs and waits are bounded: a questions file is read as it is answered, a bz2 bomb is refused
at the page cap, a Dask wait and the training job end at their limits with one line, and only transport errors
are retried.

Each runs the real component: the ``wikirag`` program on a FIFO, ``wikirag ingest`` on a real Prefect server and
Dask cluster, a real Dask cluster, a real torchrun job, real Prefect flow runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from runtime.process_groups import die_with_parent
from tasks.adapters.index_queries import QUESTIONS_PER_BATCH
from tests.flows.conftest import PublishedIndex
from tests.rag_core.train.conftest import tiny  # noqa: F401 -- the recipe tests' small index, cloze files, BART

REPO = Path(__file__).resolve().parents[2]


def _read_lines(stream, n: int, deadline: float) -> list[str]:
    """``n`` lines from a pipe, or as many as came before ``deadline`` (monotonic)."""
    lines: list[str] = []
    buffer = b""
    fd = stream.fileno()
    while len(lines) < n and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buffer += chunk
        *done, buffer = buffer.split(b"\n")
        lines += [line.decode() for line in done]
    return lines


def test_a_questions_file_is_answered_while_it_is_still_being_written(published_index: PublishedIndex,
                                                                      tmp_path: Path, home: Path) -> None:
    """A FIFO whose writer keeps it open: the first batch is printed before the file ends (read whole, it never
    would be), and the order and count of the answers are those of the questions."""
    fifo = tmp_path / "questions"
    os.mkfifo(fifo)
    questions = [f"Who was Achilles number {i}?" for i in range(QUESTIONS_PER_BATCH + 3)]
    proc = subprocess.Popen([sys.executable, "-m", "cli.wikirag", "search", "--questions", str(fifo), "--json",
                             "-k", "2", "--store", str(published_index.store)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=die_with_parent)
    try:
        with open(fifo, "w", encoding="utf-8") as writer:  # blocks until the program opens its end
            writer.write("".join(q + "\n" for q in questions[:QUESTIONS_PER_BATCH]))
            writer.flush()
            first = _read_lines(proc.stdout, QUESTIONS_PER_BATCH, time.monotonic() + 240)
            assert len(first) == QUESTIONS_PER_BATCH, (len(first), proc.poll())
            assert proc.poll() is None  # still reading: the rest of the file has not been written
            writer.write("".join(q + "\n" for q in questions[QUESTIONS_PER_BATCH:]))
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    answers = [json.loads(line) for line in first + rest.decode().splitlines()]
    assert [a["question"] for a in answers] == questions
    assert all(len(a["results"]) == 2 for a in answers)


# -- retries: transport errors only ------------------------------------------------------------------------------
ATTEMPTS: list[str] = []


def _fails_with(kind: str) -> None:
    ATTEMPTS.append(kind)
    if kind == "programming error":
        {}["a key that was never set"]  # noqa: B018 -- the KeyError a bug raises
    with socket.socket() as s:  # a port nobody listens on: the kernel refuses the connection
        s.connect(("127.0.0.1", _closed_port()))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("kind", "error", "attempts"), [("programming error", KeyError, 1),
                                                         ("refused connection", ConnectionRefusedError, 3)])
def test_an_io_task_retries_a_transport_error_and_never_a_programming_error(prefect_server: str, kind: str,
                                                                             error: type, attempts: int) -> None:
    from prefect import flow

    from tasks.retry_policy import io_task

    failing = io_task(_fails_with)

    @flow(name="io-task-retries")
    def run_it(kind: str) -> None:
        failing(kind)

    ATTEMPTS.clear()
    with pytest.raises(error):
        run_it(kind)
    assert ATTEMPTS == [kind] * attempts  # io_task: 2 retries


def test_a_malformed_task_file_fails_once_not_once_per_retry(prefect_server: str, tmp_path: Path) -> None:
    """The tasks that read input retry transport errors only: a file with the wrong keys fails the same way each
    time, so it is read once, and its one error line is not repeated for each retry."""
    from prefect import flow
    from prefect.client.orchestration import get_client

    from rag_core.train.examples import TaskDataError
    from tasks.evaluation import load_examples

    bad = tmp_path / "nq-train.jsonl"
    bad.write_text('{"query": "who wrote hamlet", "answer": ["Shakespeare"]}\n')

    @flow(name="bad-task-file")
    def run_it() -> tuple[bool, str, object]:
        state = load_examples("nq", str(bad), return_state=True)
        try:
            state.result()
        except TaskDataError as exc:
            return state.is_failed(), str(exc), state.state_details.task_run_id
        return state.is_failed(), "", state.state_details.task_run_id

    failed, message, task_run = run_it()
    assert failed and message.startswith(f"{bad}, line 1: missing field 'question'"), message
    with get_client(sync_client=True) as client:
        assert client.read_task_run(task_run).run_count == 1


# -- decompressed page size ------------------------------------------------------------------------------------
def test_ingest_refuses_a_bz2_bomb_past_the_default_page_cap_in_one_line(prefect_server: str, home: Path,
                                                                        tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """3 KB of dump whose third page claims 272 MiB: `wikirag ingest` stops at MAX_PAGE_BYTES, exit 2, one line
    naming the dump, the stream's byte and the cap, and nothing is published."""
    from cli.wikirag import main
    from rag_core.wiki.dumps import MAX_PAGE_BYTES
    from tests.helpers.dump_bombs import BLOCK, write_bomb_dump

    monkeypatch.setenv("PREFECT_API_URL", prefect_server)
    monkeypatch.setenv("PREFECT_HOME", str(home / "prefect"))
    dump, index, offset = write_bomb_dump(tmp_path, blocks=MAX_PAGE_BYTES // BLOCK + 1)
    store = tmp_path / "store"
    code = main(["ingest", str(dump), "--index", str(index), "--store", str(store), "--workers", "1"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err[-3000:]
    [line] = [line for line in err.splitlines() if line.startswith("wikirag: error:")]
    assert line == (f"wikirag: error: {dump.name}: the bz2 stream at byte {offset:,} decompresses to more than the "
                    f"cap of {MAX_PAGE_BYTES:,} bytes (max_page_bytes); the dump is corrupt or hostile, or raise the "
                    "cap for pages that large")
    assert err.rstrip().endswith(line)
    published = [p for p in store.rglob("*") if p.is_file() and "_staging" not in p.parts and "_reports" not in p.parts
                 and p.relative_to(store).parts[::2] != ("leases", ".lock")]  # a local lease's lock file, no record
    assert published == []


# -- Dask waits ------------------------------------------------------------------------------------------------
def test_a_dask_wait_past_its_limit_is_one_line_naming_the_stage(published_index: PublishedIndex) -> None:
    """The only worker thread sleeps: a wait on it, and an index load queued behind it, end at their limits."""
    from distributed import Client, LocalCluster

    from rag_core.storage import Store
    from tasks.adapters.dask_retriever import DaskShardedIndex, DaskWaitTimeoutError, wait_within

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,  # in-process: no ports
                      dashboard_address=None) as cluster, Client(cluster) as client:
        asleep = client.submit(time.sleep, 6, pure=False)
        started = time.monotonic()
        with pytest.raises(DaskWaitTimeoutError) as waited:
            wait_within([asleep], "parsing shard 3", 0.5, raise_with="the stage's timeout")
        assert str(waited.value) == ("parsing shard 3: 1 of 1 Dask tasks not done after 0.5 s; check that the "
                                     "cluster's workers are alive and not overloaded (its dashboard), or raise the "
                                     "stage's timeout")
        with pytest.raises(DaskWaitTimeoutError) as loading:
            DaskShardedIndex.load(client, Store(str(published_index.store)), load_timeout_s=1)
        assert time.monotonic() - started < 5  # both ended before the sleep did
        assert str(loading.value).startswith(f"loading index version {published_index.version} onto the Dask "
                                             "workers: 2 of 2 Dask tasks not done after 1 s;")
        assert str(loading.value).endswith("or raise DaskShardedIndex.load(load_timeout_s=...)")
        assert not asleep.done()


# -- the training job ------------------------------------------------------------------------------------------
def _job_processes(marker: str) -> list[int]:
    """Live processes (torchrun and its ranks) whose environment carries ``marker``."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("WIKIRAG_TEST_JOB") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
    return found


@pytest.mark.usefixtures("one_torch_thread")
def test_a_training_job_past_its_limit_is_stopped_whole_and_reported_in_one_line(tiny: SimpleNamespace) -> None:
    """A real 2-rank torchrun job asked for a million steps, with a limit of 8 s: torchrun and both ranks are
    stopped, and the one line gives the limit and how to raise it."""
    from tasks.adapters.torchrun_launcher import TrainingJobError, launch_training
    from tests.helpers.training import make_config

    marker = uuid.uuid4().hex
    env = {**os.environ, "WIKIRAG_TEST_JOB": marker, "OMP_NUM_THREADS": "1"}
    config = make_config(tiny, "runs/past-its-limit", max_steps=1_000_000)
    outcome: dict[str, BaseException] = {}

    def launch() -> None:
        try:
            launch_training(config, 2, store_url=tiny.store.url, env=env, timeout=8)
        except BaseException as exc:  # noqa: BLE001 -- handed to the test's thread
            outcome["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=launch)
    thread.start()
    most = 0
    while thread.is_alive():
        most = max(most, len(_job_processes(marker)))
        time.sleep(0.2)
    thread.join()
    took = time.monotonic() - started
    assert most >= 3  # torchrun and both ranks were running when the limit came
    error = outcome["error"]
    assert isinstance(error, TrainingJobError), error
    assert str(error) == ("training job for runs/past-its-limit ran past its limit of 8 s and was stopped (torchrun "
                          "and its ranks); its checkpoints are kept and a rerun resumes from the last; raise the "
                          "limit with launch_training(timeout=...) "
                          "(default tasks.adapters.torchrun_launcher.JOB_TIMEOUT_S)")
    assert _job_processes(marker) == []
    assert took < 60
