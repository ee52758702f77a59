"""The local Dask cluster: a bounded close (frozen workers cannot keep a stopping command waiting), glibc's own
malloc tuning, Dask's background sampling turned down, and workers that skip walking their objects at exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runtime.local_cluster import BoundedLocalCluster
from runtime.process_tuning import DASK_TRIM_DEFAULT, without_dask_trim
from tests.helpers.processes import descendants, still_running


def test_close_gives_up_on_frozen_workers_and_kills_them() -> None:
    cluster = BoundedLocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, close_timeout=1.0)
    pids = cluster.worker_pids()
    assert len(pids) == 2 and set(pids) <= set(descendants(os.getpid()))
    seen = {pid: started for pid, started in descendants(os.getpid()).items() if pid in pids}
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # alive, holding their connections, answering nothing
    started = time.monotonic()
    cluster.close()
    took = time.monotonic() - started
    time.sleep(0.5)
    assert took < 3, took  # the nanny alone kills a frozen worker after 4 s; distributed's close waits without limit
    assert still_running(seen) == []



def _worker_environment() -> tuple[int, str | None, str | None]:
    import os  # the worker's: this function travels by value (cloudpickle), its imports run there

    return os.getpid(), os.environ.get("MALLOC_TRIM_THRESHOLD_"), os.environ.get("OMP_NUM_THREADS")


def test_workers_keep_glibcs_adaptive_malloc_and_dasks_other_defaults(monkeypatch) -> None:
    from distributed import Client

    # As an earlier plain Dask cluster of this process leaves it (its nanny exports its variables and keeps them)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", DASK_TRIM_DEFAULT)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # tests/conftest.py's share of the cores: Dask must set it

    with BoundedLocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                             dashboard_address=None) as cluster, Client(cluster) as client:
        ((pid, trim, omp),) = client.run(_worker_environment).values()
        assert pid in cluster.worker_pids() and pid != os.getpid()
    # Dask's own default (65536) pins glibc's mmap threshold: every encoder batch re-faults its buffers
    assert (trim, omp) == (None, "1")
    assert "MALLOC_TRIM_THRESHOLD_" not in os.environ  # nor what this process starts later (the training job)
    # a value the user chose is theirs
    assert without_dask_trim({"MALLOC_TRIM_THRESHOLD_": "131072", "A": "1"}) == {"MALLOC_TRIM_THRESHOLD_": "131072",
                                                                              "A": "1"}


async def _heartbeat_to_a_closed_port(dask_worker) -> str:
    """Run the worker's own heartbeat against an address nobody listens on: distributed's lost-heartbeat path."""
    import dask
    from distributed.core import rpc

    scheduler, dask_worker.scheduler = dask_worker.scheduler, rpc("tcp://127.0.0.1:1")
    try:
        with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
            await dask_worker.heartbeat()
    finally:
        dask_worker.scheduler = scheduler
    return "done"


LOST_HEARTBEAT_SCRIPT = """
from distributed import Client
from runtime.local_cluster import BoundedLocalCluster
from tests.runtime.test_local_cluster import _heartbeat_to_a_closed_port

with BoundedLocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=None) as cluster, Client(cluster) as client:
    print(list(client.run(_heartbeat_to_a_closed_port).values()))
"""


def test_a_lost_heartbeat_is_one_warning_line_not_a_traceback() -> None:
    """What a command's cluster printed when it closed seconds after starting (a corrupt dump failing at once)."""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", LOST_HEARTBEAT_SCRIPT], cwd=repo, capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "PYTHONPATH": str(repo)})
    assert proc.returncode == 0 and proc.stdout.strip() == "['done']", proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "Failed to communicate with scheduler" in line]
    # the worker's own periodic heartbeat may meet the dead address too: one line each
    assert lines and all(" - WARNING - " in line and "OSError" in line for line in lines), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


def _spin(seconds: float) -> int:
    import time  # the worker's

    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        n += 1
    return n


def _worker_sampling(dask_worker) -> dict:
    import dask

    keys = ("distributed.worker.profile.enabled", "distributed.admin.tick.interval",
            "distributed.admin.system-monitor.interval")
    return {key: dask.config.get(key) for key in keys}


SAMPLING_SCRIPT = """
import json
from distributed import Client
from runtime.local_cluster import BoundedLocalCluster
from tests.runtime.test_local_cluster import _spin, _worker_sampling

with BoundedLocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=None) as cluster, Client(cluster) as client:
    client.submit(_spin, 1.0).result()
    (settings,) = client.run(_worker_sampling).values()
    print(json.dumps({"settings": settings, "profiled": client.profile()["count"]}))
"""


def _sampling(**env: str) -> dict:
    repo = Path(__file__).resolve().parents[2]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    proc = subprocess.run([sys.executable, "-c", SAMPLING_SCRIPT], cwd=repo, capture_output=True, text=True,
                          timeout=120, check=False, env={**environ, "PYTHONPATH": str(repo), **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_workers_do_not_profile_in_the_background_unless_the_user_asks() -> None:
    quiet = _sampling()
    assert quiet["settings"] == {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                                 "distributed.admin.system-monitor.interval": "5s"}
    assert quiet["profiled"] == 0  # a second of busy task, not one stack sample taken
    # a value of the user's own wins, the others stay quiet
    asked = _sampling(DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED="True", DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL="20ms")
    assert asked["settings"] == {"distributed.worker.profile.enabled": True, "distributed.admin.tick.interval": "20ms",
                                 "distributed.admin.system-monitor.interval": "5s"}
    assert asked["profiled"] > 10  # Dask samples every 10 ms


def _report_freeze_at_exit(path: str) -> None:
    import atexit
    import gc
    from pathlib import Path

    atexit.register(lambda: Path(path).write_text(str(gc.get_freeze_count())))


def test_a_closing_worker_freezes_its_objects_before_the_interpreters_teardown(tmp_path: Path) -> None:
    """Its teardown's garbage collection would walk every object torch and the model made: time the close waits."""
    from distributed import Client

    report = tmp_path / "frozen"
    with BoundedLocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                             dashboard_address=None) as cluster, Client(cluster) as client:
        client.run(_report_freeze_at_exit, str(report))
        assert not report.exists()
    deadline = time.monotonic() + 30
    while not report.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert int(report.read_text()) > 10_000
