"""The recipe under real torchrun (gloo, 2 processes): same parameters as one process, exact resume after SIGKILL,
ranks retrieving through one Dask-held index, and the launcher that the finetune flow uses, logging into a real
MLflow store."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from distributed import LocalCluster
from mlflow import MlflowClient
from safetensors.torch import load_file

from rag_core.train.checkpoints import complete_steps
from rag_core.train.recipe import run
from tasks.adapters.mlflow_tracking import open_run
from tasks.adapters.torchrun_launcher import TrainingJobError, launch_training
from tests.helpers.training import gradients, make_config, max_difference, parameters

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def _torchrun(tiny: SimpleNamespace, configs: list, nproc: int = 2) -> subprocess.Popen:
    spec = tiny.root / f"spec-{time.monotonic_ns()}.json"
    spec.write_text(json.dumps({"store": tiny.store.url, "runs": [c.model_dump(mode="json") for c in configs]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc-per-node={nproc}", "-m", "tests.rag_core.train.recipe_runner", str(spec)],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def test_two_processes_reach_the_parameters_of_one_and_resume_exactly_after_sigkill(tiny: SimpleNamespace) -> None:
    same = {"batch_size": 8, "max_steps": 40, "checkpoint_every": 2, "schedule": "constant"}
    one_step = {**same, "max_steps": 1}
    _finish(_torchrun(tiny, [make_config(tiny, "runs/ddp-1", **one_step), make_config(tiny, "runs/ddp", **same)]))
    run(make_config(tiny, "runs/single-1", **one_step), tiny.store)
    assert max_difference(gradients(tiny, "runs/ddp-1"), gradients(tiny, "runs/single-1")) < 1e-6
    # Adam's step is g / (|g| + eps): float rounding in gradients near eps moves a weight by up to ~1e-5 x lr
    assert max_difference(parameters(tiny, "runs/ddp-1", 1), parameters(tiny, "runs/single-1", 1)) < 1e-2 * 1e-3
    ddp = parameters(tiny, "runs/ddp", 40)
    assert max_difference(ddp, parameters(tiny, "runs/ddp", 38)) > 1e-4  # the steps moved the weights

    slow = make_config(tiny, "runs/killed", **same)
    proc = _torchrun(tiny, [slow])
    checkpoints = tiny.store.child("runs/killed/checkpoints")
    deadline = time.monotonic() + 300
    while not complete_steps(checkpoints) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    job = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    for pid in job:  # torchrun and its workers (torchrun starts each in a session of its own): a lost machine
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    done = complete_steps(checkpoints)
    assert done and done[-1] < 40, f"the job was not stopped mid-run (checkpoints {done})"

    _finish(_torchrun(tiny, [slow]))
    result = json.loads(tiny.store.child("runs/killed").read_bytes("result.json"))
    assert result["resumed_from"] == done[-1] and result["final_step"] == 40 and result["world_size"] == 2
    assert max_difference(parameters(tiny, "runs/killed", 40), ddp) == 0.0  # bit for bit


def test_launch_training_logs_rank_0_into_an_mlflow_run_and_explains_a_failure(tiny: SimpleNamespace,
                                                                                tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = open_run(uri, "wikirag-cloze", "finetune")
    config = make_config(tiny, "runs/launched", batch_size=4, max_steps=3)
    result = launch_training(config, 2, uri, run_id, store_url=tiny.store.url)
    assert result.world_size == 2 and result.final_step == 3 and len(result.losses) == 3

    client = MlflowClient(tracking_uri=uri)
    logged = client.get_run(run_id)
    assert logged.info.status == "RUNNING"  # its creator (the flow) ends it
    assert logged.data.params["world_size"] == "2" and logged.data.params["task"] == "cloze"
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2, 3]  # rank 0 only: once per step
    assert {a.path for a in client.list_artifacts(run_id, "plots")} == {"plots/loss_curve.png"}

    with pytest.raises(TrainingJobError, match="batch_size 3 is not a multiple of 2 processes"):
        launch_training(make_config(tiny, "runs/bad", batch_size=3), 2, store_url=tiny.store.url)


def test_two_processes_train_through_one_dask_held_index(tiny: SimpleNamespace) -> None:
    """tasks.adapters.torchrun_launcher --dask-address: both ranks retrieve from the shards and vectors one Dask worker holds."""
    one_step = {"batch_size": 8, "max_steps": 1, "schedule": "constant"}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster:
        result = launch_training(make_config(tiny, "runs/dask-ddp", **one_step), 2, store_url=tiny.store.url,
                                 dask_address=cluster.scheduler_address)
        # the scheduler runs in this process: its log of task transitions says what ran on the worker
        tasks = [str(key) for key, _, finish, *_ in cluster.scheduler.transition_log if finish == "memory"]
    loads = sorted(k for k in tasks if k.startswith("wikirag-shard-"))
    assert len(loads) == 2 and all(k.endswith("-vectors") for k in loads)  # 2 shards loaded once, not per rank
    assert sum("search_loaded_shard" in k for k in tasks) >= 2 * 2 * 2  # every rank's micro-batches, per shard
    assert result.world_size == 2 and result.index_version == tiny.version

    single = run(make_config(tiny, "runs/dask-single", **one_step), tiny.store)  # one process, in-process retriever
    assert abs(result.losses[0] - single.losses[0]) < 1e-6, (result.losses, single.losses)
    assert max_difference(gradients(tiny, "runs/dask-ddp"), gradients(tiny, "runs/dask-single")) < 1e-6
    assert max_difference(parameters(tiny, "runs/dask-ddp", 1), parameters(tiny, "runs/dask-single", 1)) < 1e-2 * 1e-3
    start = load_file(Path(tiny.bart) / "model.safetensors")
    trained = parameters(tiny, "runs/dask-ddp", 1)
    assert max(float((trained[f"generator.{k}"] - v).abs().max()) for k, v in start.items()
               if f"generator.{k}" in trained) > 1e-4  # the step moved the weights: the comparison above can fail


def test_a_rank_killed_mid_run_is_reported_in_one_line_with_its_signal_and_peak_memory(tiny: SimpleNamespace) -> None:
    """A real 2-rank job; the test SIGKILLs rank 1 once its first checkpoint is written (memory is not short here,
    so it is reported as that signal; the kernel's OOM wording is tested in tests/tasks/adapters/test_torchrun_launcher.py)."""
    config = make_config(tiny, "runs/rank-killed", batch_size=4, max_steps=10_000, checkpoint_every=1)
    checkpoints = tiny.store.child("runs/rank-killed/checkpoints")
    killed: list[int] = []

    def kill_rank_1() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not complete_steps(checkpoints):
            time.sleep(0.05)
        time.sleep(1.0)  # at least one sample of the launcher's watch after the rank's first step
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.environ().get("RANK") == "1" and "tasks.adapters.torchrun_launcher" in " ".join(child.cmdline()):
                    child.send_signal(signal.SIGKILL)
                    killed.append(child.pid)

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    with pytest.raises(TrainingJobError) as failed:
        launch_training(config, 2, store_url=tiny.store.url, timeout=600)
    killer.join(timeout=10)
    assert killed, "rank 1 was never seen running"
    message = str(failed.value)
    assert "\n" not in message
    assert re.fullmatch(r"training job for runs/rank-killed failed: rank 1 was killed by signal 9 \(SIGKILL; peak RSS "
                        r"\d+\.\d GB of \d+\.\d GB, memory was not short\)", message), message
