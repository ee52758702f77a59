"""Process-level tuning and its switch: each process really runs tuned (malloc, the exit, Dask's workers, the Prefect
database template), and with WIKIRAG_PROCESS_TUNING=off / WIKIRAG_PERF=off it runs with the libraries' defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime import process_tuning
from runtime.settings import Switches

REPO = Path(__file__).resolve().parents[2]

_FAULTS = """
import json, resource, sys
import torch
from runtime.process_tuning import keep_freed_memory, start_process
start_process()
if sys.argv[1:] == ["flag-only"]:
    print(json.dumps({"tuned": keep_freed_memory()}))
    raise SystemExit
from rag_core.index.encoders import Encoder, EncoderConfig
torch.set_num_threads(1)
encoder = Encoder.load(EncoderConfig(dtype="float32", engine="torch"))
words = "the river rises in the hills north of the old town and flows south through farmland to the sea".split()
texts = [" ".join(words[(i + j) % len(words)] for j in range(60 + 3 * i)) for i in range(32)]
titles = [f"Passage {i}" for i in range(32)]
encoder.encode_passages(titles, texts)  # the first call grows the heap to its peak
faults = []
for _ in range(5):  # the median of five repeats: one call's count swings with where the allocator's heap top lies
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    encoder.encode_passages(titles, texts)
    faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / len(texts))
print(json.dumps({"tuned": keep_freed_memory(), "faults": sorted(faults)[2]}))
"""


def _run(code: str, env: dict[str, str], *args: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "WIKIRAG_PERF", "WIKIRAG_PROCESS"))}
    out = subprocess.run([sys.executable, "-c", code, *args], env={**base, **env, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


def _encode_faults(env: dict[str, str] | None = None, *args: str) -> dict:
    return json.loads(_run(_FAULTS, env or {}, *args))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_tuned_process_reuses_freed_memory_instead_of_faulting_pages_in_again() -> None:
    """Encoding the same 32 passages again (median of 5 repeats): page faults per passage with glibc's adaptive
    thresholds (process tuning off) against those of a process started tuned. Load on the machine moves both
    counts, so the bound is a ratio with room for it; a process whose tuning did not take faults as often as the
    adaptive one (ratio ~1)."""
    adaptive, tuned = _encode_faults({"WIKIRAG_PROCESS_TUNING": "off"}), _encode_faults()
    assert not adaptive["tuned"] and tuned["tuned"]
    assert adaptive["faults"] > 300, adaptive
    assert tuned["faults"] < 0.25 * adaptive["faults"], (tuned, adaptive)
    # Dask's nanny default is not a user's choice and is overridden; any other malloc variable wins.
    assert _encode_faults({"MALLOC_TRIM_THRESHOLD_": "65536"}, "flag-only")["tuned"]
    assert not _encode_faults({"MALLOC_TOP_PAD_": "131072"}, "flag-only")["tuned"]


_RANK_HEAP = """
import json, sys
import psutil, torch
from runtime import process_tuning
process_tuning.start_process(training_rank=sys.argv[1] == "rank")
rss = lambda: psutil.Process().memory_info().rss
before = rss()
# activations of rows whose length changes with every passage: 0.3-2.3 MB each, 0.4 GB live at the peak
blocks = [torch.ones(80_000 + 1_000 * (i * 37 % 500)) for i in range(300)]
peak = rss()
del blocks
print(json.dumps({"rank": process_tuning.hand_back_freed_memory.cache_info().currsize == 1
                           and process_tuning.hand_back_freed_memory(),
                  "grown": peak - before, "kept": rss() - before}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_training_rank_hands_freed_activations_back_where_other_processes_keep_them() -> None:
    """The same 300 tensors of 0.3-2.3 MB made and freed: a process started as a training rank gives their memory
    back to the OS; a command's process keeps it as heap for reuse, as tuned (and as glibc's own thresholds)."""
    rank, command = (json.loads(_run(_RANK_HEAP, {}, kind)) for kind in ("rank", "command"))
    assert rank["rank"] and not command["rank"]
    assert rank["grown"] > 300e6 and command["grown"] > 300e6, (rank, command)
    assert rank["kept"] < 0.1 * rank["grown"], rank
    assert command["kept"] > 0.8 * command["grown"], command
    # a user's malloc variable wins over the rank's tuning too
    assert not json.loads(_run(_RANK_HEAP, {"MALLOC_MMAP_THRESHOLD_": "33554432"}, "rank"))["rank"]


_SWITCHES = """
import json, sys
from runtime.process_tuning import end_command, start_process
from rag_core.perf.precision import choose_precision
from rag_core.perf import int8_engine
switches = start_process()
precision = choose_precision("auto", "cpu")
engine = int8_engine.auto_engine("auto", precision.dtype, "cpu")
print(json.dumps({"perf": switches.perf, "tuning": switches.process_tuning, "dtype": precision.dtype,
                  "reason": precision.reason, "engine": engine}))
sys.stdout.flush()
end_command(int(sys.argv[1]))
"""


def test_the_switches_reach_a_fresh_process_from_its_environment(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    off = json.loads(_run(_SWITCHES, {"WIKIRAG_PERF": "off", "WIKIRAG_PROCESS_TUNING": "off",
                                      "XDG_CACHE_HOME": str(cache)}, "0"))
    assert (off["perf"], off["tuning"]) == (False, False)
    assert (off["dtype"], off["engine"]) == ("float32", "torch")
    assert off["reason"] == "performance machinery off (WIKIRAG_PERF=off)"
    assert not (cache / "wikirag" / "probes.json").exists()  # no probe was timed, none kept
    on = json.loads(_run(_SWITCHES, {"XDG_CACHE_HOME": str(cache)}, "0"))
    assert (on["perf"], on["tuning"]) == (True, True)
    assert on["reason"] != off["reason"]
    # A machine whose verdict needs a probe keeps it; one whose flags already say float32 and int8 had no say.
    assert (cache / "wikirag" / "probes.json").exists() or on["engine"] == "torch"


_EXIT = """
import gc, sys
from runtime.process_tuning import end_command, start_process
start_process()
import atexit
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, flush=True))
end_command(int(sys.argv[1]), skip_teardown=sys.argv[2] == "skip")
"""


@pytest.mark.parametrize(("tuning", "frozen"), [("on", "True"), ("off", "False")])
def test_a_command_ends_with_its_code_its_objects_frozen_only_when_tuned(tuning: str, frozen: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WIKIRAG_PROCESS")}
    run = subprocess.run([sys.executable, "-c", _EXIT, "3", "teardown"], capture_output=True, text=True,
                         env={**env, "WIKIRAG_PROCESS_TUNING": tuning, "PYTHONPATH": str(REPO)}, timeout=120)
    assert (run.returncode, run.stdout.strip()) == (3, f"frozen {frozen}")  # atexit handlers still run
    # A read-only command's failure skips the teardown (and its atexit handlers) whatever the switch says.
    skipped = subprocess.run([sys.executable, "-c", _EXIT, "2", "skip"], capture_output=True, text=True,
                             env={**env, "WIKIRAG_PROCESS_TUNING": tuning, "PYTHONPATH": str(REPO)}, timeout=120)
    assert (skipped.returncode, skipped.stdout.strip()) == (2, "")


@pytest.fixture
def switched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Set this process's switches for one test (and a cache of its own); restored after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def switch(**values: bool) -> None:
        monkeypatch.setattr(process_tuning, "_started", Switches(**values))

    yield switch
    from rag_core import perf

    perf.set_enabled(True)


def test_the_prefect_template_is_copied_and_kept_only_when_tuned(switched, tmp_path: Path) -> None:
    template = process_tuning.prefect_template_path()
    assert template.parent == tmp_path / "cache" / "wikirag"
    first = tmp_path / "first"
    first.mkdir()
    (first / "prefect.db").write_bytes(b"")  # what a server that booted on a fresh database leaves
    switched(process_tuning=False)
    process_tuning.keep_prefect_template(first)
    assert not template.exists()
    switched(process_tuning=True)
    process_tuning.keep_prefect_template(first)
    assert template.is_file()
    switched(process_tuning=False)
    assert not process_tuning.seed_prefect_database(tmp_path / "second")
    assert not (tmp_path / "second" / "prefect.db").exists()
    switched(process_tuning=True)
    (tmp_path / "second").mkdir()
    assert process_tuning.seed_prefect_database(tmp_path / "second")
    assert (tmp_path / "second" / "prefect.db").read_bytes() == template.read_bytes()


def test_dask_workers_keep_dasks_own_malloc_setting_only_when_tuning_is_off(switched) -> None:
    environ = {"MALLOC_TRIM_THRESHOLD_": process_tuning.DASK_TRIM_DEFAULT, "A": "1"}
    switched(process_tuning=True)
    assert process_tuning.worker_environment(environ) == {"A": "1", **process_tuning.NANNY_ENVIRONMENT}
    switched(process_tuning=False)
    assert process_tuning.worker_environment(environ) == environ


_WORKER_STATE = """
import json, os
from distributed import Client

def state():
    from rag_core import perf
    from runtime import process_tuning
    started = process_tuning._started  # set by the preload's dask_setup, not by this function
    return {"pid": os.getpid(), "started": started and started.model_dump(), "perf": perf.enabled(),
            "malloc_tuned": process_tuning.keep_freed_memory.cache_info().currsize == 1
                            and process_tuning.keep_freed_memory(),
            "trim": os.environ.get("MALLOC_TRIM_THRESHOLD_")}

with Client(os.environ["WIKIRAG_DASK_ADDRESS"], timeout=30) as client:
    client.wait_for_workers(1, timeout=90)
    print(json.dumps(list(client.run(state).values())))
"""


def _free_ports(count: int) -> list[int]:
    """Free ports on 127.0.0.1 in 15000-15999: below the ephemeral range, apart from the other tests' blocks."""
    import socket

    found = []
    for port in range(15_000 + os.getpid() % 100 * 9, 16_000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise RuntimeError("no free ports in 15000-15999")


def _service_worker_state(home: Path, switches: dict[str, str]) -> list[dict]:
    """Start the Dask scheduler and one worker as ``wikirag services`` and infra/dask-cluster.sh do (their
    definition, runtime/service_specs.py) with ``switches`` in the environment; what each worker process reports."""
    from runtime.process_groups import stop_process_group
    from runtime.service_health import answers
    from runtime.service_specs import SPECS

    port, dashboard = _free_ports(2)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "WIKIRAG_", "DASK_"))}
    env = {**base, **switches, "WIKIRAG_HOME": str(home), "WIKIRAG_DASK_PORT": str(port),
           "WIKIRAG_DASK_DASHBOARD_PORT": str(dashboard), "WIKIRAG_DASK_WORKERS": "1", "PYTHONPATH": str(REPO)}
    home.mkdir(parents=True)
    started = []
    try:
        for name in ("dask", "dask-workers"):
            with (home / f"{name}.log").open("wb") as log:
                started.append(subprocess.Popen([sys.executable, "-m", "runtime.services", "run", name], env=env,
                                                cwd=home, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True))
            deadline = time.monotonic() + 60
            while name == "dask" and not answers(SPECS["dask"].health, port):
                assert started[-1].poll() is None and time.monotonic() < deadline, (home / "dask.log").read_text()
                time.sleep(0.3)
        exports = subprocess.run([sys.executable, "-m", "runtime.services", "env"], env=env, capture_output=True,
                                 text=True, check=True, timeout=60).stdout
        client_env = {**env, **dict(line.removeprefix("export ").split("=", 1) for line in exports.splitlines())}
        out = subprocess.run([sys.executable, "-c", _WORKER_STATE], env=client_env, cwd=home, capture_output=True,
                             text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-2000:] + (home / "dask-workers.log").read_text()[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for proc in reversed(started):
            stop_process_group(proc.pid)


def test_workers_of_the_services_start_as_every_wikirag_process_and_honour_the_switches(tmp_path: Path) -> None:
    """`dask worker` of runtime/service_specs.py preloads runtime.process_tuning: its dask_setup runs start_process
    in each worker process, reading the switches from the worker's own environment."""
    (tuned,) = _service_worker_state(tmp_path / "on", {})
    assert tuned["started"] == {"perf": True, "process_tuning": True}, tuned
    assert tuned["perf"] and tuned["malloc_tuned"] and tuned["trim"] is None, tuned
    (plain,) = _service_worker_state(tmp_path / "off", {"WIKIRAG_PROCESS_TUNING": "off", "WIKIRAG_PERF": "off"})
    assert plain["started"] == {"perf": False, "process_tuning": False}, plain
    # glibc's and Dask's own defaults: no mallopt, and the nanny's MALLOC_TRIM_THRESHOLD_ left in place
    assert not plain["perf"] and not plain["malloc_tuned"], plain
    assert plain["trim"] == process_tuning.DASK_TRIM_DEFAULT, plain


def test_training_ranks_bound_onednns_kernel_cache_unless_the_environment_or_the_switch_says_otherwise(
        switched) -> None:
    switched(process_tuning=True)
    env = process_tuning.rank_environment({"PATH": "/bin", "MALLOC_TRIM_THRESHOLD_": process_tuning.DASK_TRIM_DEFAULT})
    assert env == {"PATH": "/bin", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": process_tuning.RANK_ONEDNN_CACHE}
    assert process_tuning.rank_environment({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}) == {
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"}  # a user's choice wins
    switched(process_tuning=False)
    untouched = {"PATH": "/bin", "MALLOC_TRIM_THRESHOLD_": process_tuning.DASK_TRIM_DEFAULT}
    assert process_tuning.rank_environment(untouched) == untouched
