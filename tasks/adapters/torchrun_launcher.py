"""The torchrun entry point of the fine-tuning recipe, and the function that launches it.

    torchrun --standalone --nproc-per-node 2 -m tasks.adapters.torchrun_launcher --config CONFIG.json \\
        [--store URL] [--dask-address ADDRESS] [--tracking-uri URI (--run-id ID | --experiment NAME)] [--result FILE]

Each process reads the config (a :class:`rag_core.train.train_config.TrainConfig` as JSON), its rank
from torchrun's environment, and the store and its credentials from the environment through
:class:`runtime.settings.Settings` (WIKIRAG_STORE, AWS_*): the edge that reads it. Rank 0 logs
into MLflow: into the existing run ``--run-id`` (its creator owns it and ends it), or, given only
``--experiment``, into a new run it ends itself; other ranks log nothing. Rank 0 writes
``--result`` (the :class:`~rag_core.train.train_config.TrainResult` as JSON) when the run is done.

Retrieval: with ``--dask-address`` every rank retrieves through that Dask cluster, whose workers
hold the index version's shards and stored vectors once for the whole job
(:class:`tasks.adapters.dask_retriever.DaskRetriever`, loaded by all ranks under one share name: Dask
runs each shard's load once); a rank then holds no index, only its micro-batch's passages.
Without it each rank loads the version itself (``IndexRetriever.load``): right for small indexes,
W copies of a large one on a machine of W ranks (docs/architecture.md, "What a training rank holds").

:func:`launch_training` starts that command in its own process group from Python (the
``finetune`` flow's task) and returns the result, or raises :class:`TrainingJobError` with the
log's tail.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rag_core.errors import WikiragError
from runtime.process_groups import die_with_parent, stop_process_group  # the edge: as runtime.settings below
from tasks.adapters.torchrun_ranks import RankWatch, killed_rank

log = logging.getLogger("wikirag.train")
ROOT = Path(__file__).resolve().parents[2]  # the checkout that holds tasks/ and rag_core/
TAIL_LINES = 40
# A job still running after this is stuck (a hung collective, a rank waiting on a dead store), not slow: the
# paper's fine-tunes take hours. It is stopped; its checkpoints stay on the store, so a rerun resumes.
JOB_TIMEOUT_S = 24 * 3600.0


class TrainingJobError(WikiragError):
    """A torchrun training job that failed; the message carries its log's tail."""


# ----------------------------------------------------------------------------- inside torchrun


def _git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)
        if out.returncode == 0:
            return out.stdout.strip()
    return None


@contextlib.contextmanager
def _tracking(args: argparse.Namespace, rank: int) -> Iterator[Any]:
    """Rank 0's MLflow logger (ending a run it created itself), else None."""
    if rank != 0 or not args.tracking_uri:
        yield None
        return
    from mlflow import MlflowClient

    from tasks.adapters.mlflow_tracking import MlflowRunLogger, check_reachable, tracked_run

    if args.run_id:
        check_reachable(args.tracking_uri)
        yield MlflowRunLogger(MlflowClient(tracking_uri=args.tracking_uri), args.run_id)
        return
    if not args.experiment:
        raise TrainingJobError("--tracking-uri needs --run-id (an existing run) or --experiment (a new run)")
    with tracked_run(args.tracking_uri, args.experiment, run_name="finetune") as logger:
        yield logger


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tasks.adapters.torchrun_launcher",
                                     description="the fine-tuning recipe "
                                     "(run it under torchrun; one process without)")
    parser.add_argument("--config", required=True, help="a file holding a TrainConfig as JSON "
                        "(rag_core.train.train_config)")
    parser.add_argument("--store", help="store URL (default: WIKIRAG_STORE, else <WIKIRAG_HOME>/store)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI; rank 0 logs there")
    parser.add_argument("--run-id", help="an existing MLflow run to log into (the caller ends it)")
    parser.add_argument("--experiment", help="without --run-id: the experiment of a new run")
    parser.add_argument("--result", help="where rank 0 writes the TrainResult JSON")
    parser.add_argument("--dask-address", help="Dask scheduler whose workers hold the index once for every rank "
                        "(default: each rank loads the index itself)")
    return parser.parse_args(argv)


def share_name(environ: Mapping[str, str]) -> str:
    """One name for all ranks of this torchrun job, and no other live job: its run id and rendezvous address."""
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:  # one process without torchrun
        return f"pid{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return f"{run_id}-{environ.get('MASTER_ADDR', '')}:{environ.get('MASTER_PORT', '')}"


@contextlib.contextmanager
def _dask_retrievers(address: str | None, share: str) -> Iterator[Any]:
    """``open_retriever`` for the recipe: the version held by the Dask cluster at ``address`` (None: in process)."""
    if not address:
        yield None
        return
    from distributed import Client

    from tasks.adapters.dask_retriever import DaskRetriever

    opened: list[Any] = []
    try:
        client = Client(address, set_as_default=False)
    except OSError as exc:  # distributed's connection timeout is an OSError
        raise TrainingJobError(f"--dask-address {address}: no Dask scheduler answers there ({exc}); start one "
                               "or leave the option out to load the index in each process") from exc
    with client:

        def open_retriever(store: Any, version: str | None) -> Any:
            opened.append(DaskRetriever.load(client, store, version, share=share))
            return opened[-1]

        try:
            yield open_retriever
        finally:
            for retriever in opened:
                retriever.close()


def main(argv: Sequence[str] | None = None) -> int:
    from runtime.process_tuning import start_process
    from runtime.settings import Settings, quiet_environment

    quiet_environment()
    args = parse_args(argv)
    from rag_core.train.recipe import run
    from rag_core.train.train_config import Distributed, TrainConfig

    distributed = Distributed.from_environ(os.environ)
    # the launcher stamps each line with its time; faiss's loader would log five lines per process
    logging.basicConfig(level=logging.INFO, format=f"rank {distributed.rank} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    try:
        config = TrainConfig.model_validate_json(Path(args.config).read_text())
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"wikirag: error: {args.config}: not a readable TrainConfig ({exc}); fix the file", file=sys.stderr)
        return 2
    try:
        settings = Settings()
        # before the model loads: precision switch and malloc
        start_process(settings, training_rank=config.rank_memory == "lean")
        store = settings.open_store(args.store)
        with _tracking(args, distributed.rank) as logger, \
                _dask_retrievers(args.dask_address, share_name(os.environ)) as open_retriever:
            commit = _git_commit()
            if logger is not None and commit:
                logger.set_tags({"wikirag.git_commit": commit})
            result = run(config, store, logger=logger, distributed=distributed, open_retriever=open_retriever,
                         data_options=settings.s3_options())
        if distributed.rank == 0 and args.result:
            Path(args.result).write_text(result.model_dump_json(indent=2))
    except WikiragError as exc:
        print(f"wikirag: error: {exc}", file=sys.stderr)
        return 2
    return 0


# ----------------------------------------------------------------------------- the launcher


@contextlib.contextmanager
def _sigterm_stops(pid: int):
    """While the job runs, the caller's SIGTERM stops its process group first (main thread only: Python's rule)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # PR_SET_PDEATHSIG still stops torchrun if this process dies
        return

    def stop(signum: int, frame: Any) -> None:
        stop_process_group(pid, timeout=30.0)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def torchrun_command(config_file: Path, nproc: int, *, result_file: Path, store_url: str | None = None,
                     tracking_uri: str | None = None, run_id: str | None = None,
                     experiment: str | None = None, dask_address: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "tasks.adapters.torchrun_launcher", "--config", str(config_file), "--result", str(result_file)]
    for flag, value in (("--store", store_url), ("--tracking-uri", tracking_uri), ("--run-id", run_id),
                        ("--experiment", experiment), ("--dask-address", dask_address)):
        if value:
            cmd += [flag, value]
    return cmd


def launch_training(config: Any, nproc: int = 1, tracking_uri: str | None = None, run_id: str | None = None, *,
                    experiment: str | None = None, store_url: str | None = None, dask_address: str | None = None,
                    env: Mapping[str, str] | None = None, timeout: float = JOB_TIMEOUT_S) -> Any:
    """Run ``torchrun --standalone --nproc-per-node NPROC -m tasks.adapters.torchrun_launcher`` on ``config``
    and return its result.

    ``config``: a TrainConfig; ``env``: the job's whole environment (default: a copy of this process's),
    which must hold what Settings reads (WIKIRAG_STORE, AWS_*) unless ``store_url`` says where the
    store is; ``tracking_uri`` + ``run_id``: rank 0 logs into that existing run; ``dask_address``: every rank
    retrieves through the index held once by that Dask cluster (module docstring). The job runs in its own
    process group, stopped when this process gets SIGTERM or dies, or when it runs past ``timeout`` seconds
    (wall clock; :class:`TrainingJobError` then says so in one line); its output is logged here line by
    line (logger ``wikirag.train``). Returns the :class:`~rag_core.train.train_config.TrainResult`; a failed job
    raises :class:`TrainingJobError` with the log's last lines.
    """
    from runtime.process_tuning import rank_environment, without_dask_trim
    from rag_core.train.train_config import TrainResult

    if nproc < 1:
        raise TrainingJobError(f"nproc must be at least 1, got {nproc}")
    # no Dask malloc trim; lean ranks: oneDNN's cache bounded too
    env = (rank_environment if config.rank_memory == "lean" else without_dask_trim)(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)  # this checkout's code
    with tempfile.TemporaryDirectory(prefix="wikirag-train-") as tmp:
        config_file, result_file = Path(tmp) / "config.json", Path(tmp) / "result.json"
        config_file.write_text(config.model_dump_json(indent=2))
        cmd = torchrun_command(config_file, nproc, result_file=result_file, store_url=store_url,
                               tracking_uri=tracking_uri, run_id=run_id, experiment=experiment,
                               dask_address=dask_address)
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        errors: list[str] = []  # the workers' one-line errors: torchrun's own report can push them out of the tail
        proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True, preexec_fn=die_with_parent)
        log.info("training job started (pid %d, its own process group): %d process(es), output %s", proc.pid,
                 nproc, config.output)
        reports: list[str] = []  # torchrun's failure report: which rank died, by which signal
        reader = threading.Thread(target=_relay, args=(proc.stdout, tail, errors, reports), daemon=True)
        reader.start()
        try:
            with _sigterm_stops(proc.pid), RankWatch(proc.pid) as ranks:
                code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_process_group(proc.pid, timeout=30.0)  # torchrun stops its ranks on SIGTERM
            raise TrainingJobError(
                f"training job for {config.output} ran past its limit of {timeout:g} s and was stopped (torchrun "
                "and its ranks); its checkpoints are kept and a rerun resumes from the last; raise the limit with "
                "launch_training(timeout=...) (default tasks.adapters.torchrun_launcher.JOB_TIMEOUT_S)"
            ) from None
        except BaseException:
            stop_process_group(proc.pid, timeout=30.0)
            raise
        finally:
            reader.join(timeout=10)
        if ranks.peaks:
            log.info("peak RSS per rank: %s", ranks.peak_line())
        if code != 0 and (killed := killed_rank(reports)) is not None:
            raise TrainingJobError(f"training job for {config.output} failed: {ranks.kill_line(killed)}")
        if code != 0 or not result_file.exists():
            lines = "\n".join(tail)
            reason = errors[-1].split("wikirag: error:", 1)[1].strip() if errors else f"exit status {code}"
            raise TrainingJobError(f"training job for {config.output} failed: {reason}\n"
                                   f"--- last {len(tail)} lines of its log ---\n{lines}")
        return TrainResult.model_validate(json.loads(result_file.read_text()))


def _relay(stream: Any, tail: collections.deque, errors: list[str], reports: list[str]) -> None:
    for line in stream:
        line = line.rstrip("\n")
        tail.append(line)
        if "wikirag: error:" in line:
            errors.append(line)
        if reports or "Root Cause" in line:  # torchrun's report of the first failed rank: to the end
            reports.append(line)
        log.info("%s", line)


if __name__ == "__main__":
    sys.exit(main())
