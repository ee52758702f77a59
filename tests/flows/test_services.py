"""`wikirag services`: real engines on loopback, the deployments of prefect.yaml run on them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET = "wikirag-services-secret-7f3a9c"  # distinctive: grepped for after the run


def _free_block(size: int, grpc_offset: int = 10_000) -> int:
    """A base port whose ``size`` successors (and their gRPC twins) are free on 127.0.0.1.

    All of them below the kernel's ephemeral range (32768 up): a port from that range, free when checked, can go
    to any process's outgoing connection or bind(0) before the server binds it (seen: SeaweedFS's S3 port taken
    while its master, volume and filer started). tests/conftest.py's S3 fixture keeps to 16000-20999 (gRPC
    26000-30999); this block to 12000-14999 (gRPC 22000-24999).
    """
    for base in range(12_000 + os.getpid() % 100 * 20, 15_000 - size, size):
        socks = []
        try:
            for port in [p + o for p in range(base, base + size) for o in (0, grpc_offset)]:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of ports")


def _env(home: Path) -> dict[str, str]:
    base = _free_block(10)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WIKIRAG_", "PREFECT_", "MLFLOW_"))}
    return {**env, "WIKIRAG_HOME": str(home), "AWS_ACCESS_KEY_ID": "wikirag-services", "AWS_SECRET_ACCESS_KEY": SECRET,
            "WIKIRAG_S3_PORT": str(base), "WIKIRAG_MLFLOW_PORT": str(base + 5), "WIKIRAG_PREFECT_PORT": str(base + 6),
            "WIKIRAG_DASK_PORT": str(base + 7), "WIKIRAG_DASK_DASHBOARD_PORT": str(base + 8),
            "WIKIRAG_DASK_WORKERS": "2", "PYTHONPATH": str(ROOT)}


def _wikirag(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _status(env: dict[str, str]) -> dict[str, list[str]]:
    out = _wikirag(env, "services", "status").stdout
    return {row.split("\t")[0]: row.split("\t") for row in out.splitlines()}


def _api(url: str, path: str, body: dict) -> list | dict:
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.load(resp)


@pytest.mark.slow
def test_services_run_the_deployments_on_real_engines(wiki: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = _env(home)
    rows: dict[str, list[str]] = {}
    try:
        started = _wikirag(env, "services", "up")
        assert started.returncode == 0, started.stderr
        exports = dict(line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines())
        rows = _status(env)
        assert [r[1] for r in rows.values()] == ["up"] * 6, rows
        again = _wikirag(env, "services", "up")  # idempotent: nothing restarted
        assert again.returncode == 0 and again.stderr.count("already up") == 6, again.stderr
        assert _status(env) == rows

        client_env = {**env, **exports}
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        deploy = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"], env=client_env,
                                cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert deploy.returncode == 0, deploy.stdout[-2000:] + deploy.stderr[-2000:]
        api = exports["PREFECT_API_URL"]
        deployments = {d["name"]: d for d in _api(api, "/deployments/filter", {})}
        assert {"index-rebuild-enwiki", "ingest-enwiki"} <= set(deployments)
        assert {d["version"] for d in deployments.values()} == {commit}  # the code each deployment runs

        params = {"dump": str(wiki / "enwiki-sample-pages-articles-multistream.xml.bz2"),
                  "index": str(wiki / "enwiki-sample-pages-articles-multistream-index.txt.bz2")}
        run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "ingest-deployment/ingest-enwiki",
                              "--param", f"config={json.dumps(params)}", "--watch", "--watch-timeout", "400"],
                             env=client_env, cwd=ROOT, capture_output=True, text=True, timeout=450)
        assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:]
        from distributed import Client

        with Client(exports["WIKIRAG_DASK_ADDRESS"], timeout=30) as client:  # the workers the ingest ran on
            # a lambda travels by value, so os.environ is the worker's own (a bound os.environ.get would carry ours)
            trims = client.run(lambda: __import__("os").environ.get("MALLOC_TRIM_THRESHOLD_"))
        assert len(trims) == int(env["WIKIRAG_DASK_WORKERS"]) and set(trims.values()) == {None}, trims

        import s3fs

        fs = s3fs.S3FileSystem(key=env["AWS_ACCESS_KEY_ID"], secret=SECRET, endpoint_url=exports["AWS_ENDPOINT_URL"])
        published = [p for p in fs.ls("wikirag/store/passages") if not p.rsplit("/", 1)[-1].startswith("_")]
        assert len(published) == 1 and fs.exists(f"{published[0]}/manifest.json")
        manifest = json.loads(fs.cat(f"{published[0]}/manifest.json"))
        assert manifest["counts"]["passages"] > 4000

        # the finetune deployment on the worker: a small index on S3, the MLflow server's registry (2 DDP processes:
        # tests/flows/test_finetune.py)
        from rag_core.index.encoders import Encoder, EncoderConfig
        from rag_core.storage import Store
        from tests.encoderfiles import save_tiny_bert
        from tests.generatorfiles import save_tiny_llama
        from tests.passagefiles import publish_small_index, sample_passages

        store = Store("s3://wikirag/store", {"key": env["AWS_ACCESS_KEY_ID"], "secret": SECRET,
                                             "endpoint_url": exports["AWS_ENDPOINT_URL"]})
        encoder = Encoder.load(EncoderConfig(path=str(save_tiny_bert(tmp_path / "bert")), dtype="float32"))
        version = publish_small_index(store, "tiny", sample_passages().slice(0, 200), encoder, shards=2)
        request = {"task": "cloze", "eval_examples": 4, "recipe": {
            "generator": str(save_tiny_llama(tmp_path / "llama")), "max_steps": 2, "batch_size": 4, "n_docs": 2}}
        tuned = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "finetune-deployment/finetune",
                                "--param", f"requests={json.dumps([request])}", "--param", "nproc=1",
                                "--watch", "--watch-timeout", "400"],
                               env=client_env, cwd=ROOT, capture_output=True, text=True, timeout=450)
        assert tuned.returncode == 0 and "Completed" in tuned.stdout, tuned.stdout[-3000:]
        consumer = ("import json, mlflow; m = mlflow.pyfunc.load_model('models:/wikirag-cloze@champion'); "
                    "print(json.dumps(m.predict(['Who was Achilles?'])))")
        loaded = subprocess.run([sys.executable, "-c", consumer], env=client_env, cwd=tmp_path, capture_output=True,
                                text=True, timeout=300)  # a fresh process, from the MLflow server and S3
        assert loaded.returncode == 0, loaded.stderr[-3000:]
        answer = json.loads(loaded.stdout.strip().splitlines()[-1])[0]
        assert answer["question"] == "Who was Achilles?" and len(answer["provenance"]) == 2
        champion = json.loads(subprocess.run(
            [sys.executable, "-c", "import json; from mlflow import MlflowClient; v = MlflowClient()"
             ".get_model_version_by_alias('wikirag-cloze', 'champion'); print(json.dumps(dict(v.tags)))"],
            env=client_env, capture_output=True, text=True, timeout=120).stdout)
        assert champion["index_version"] == version and champion["store"] == "s3://wikirag/store"

        # checked last: the server's scheduler wakes every 60 s, so the deployment runs above overlap that wait
        query = {"deployments": {"id": {"any_": [deployments["index-rebuild-enwiki"]["id"]]}},
                 "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}
        deadline = time.monotonic() + 150  # on a busy machine the scheduler's pass comes later
        while not (scheduled := _api(api, "/flow_runs/filter", query)) and time.monotonic() < deadline:
            time.sleep(3)
        assert scheduled, "the scheduled index rebuild shows no upcoming runs"

        assert SECRET not in started.stdout + started.stderr + run.stdout + run.stderr + tuned.stdout + tuned.stderr
        leaks = [str(p) for p in home.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
        assert not leaks, f"the secret was written to {leaks}"
    finally:
        stopped = _wikirag(env, "services", "down")
    assert stopped.returncode == 0, stopped.stderr
    for name, row in rows.items():
        assert not Path(f"/proc/{row[2]}").exists(), f"{name} (pid {row[2]}) still runs"
    assert {r[1] for r in _status(env).values()} == {"not started"}


def test_a_port_in_use_or_missing_credentials_is_one_clear_line(tmp_path: Path) -> None:
    env = _env(tmp_path / "home")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", int(env["WIKIRAG_S3_PORT"])))
        busy.listen()
        result = _wikirag(env, "services", "up", timeout=60)
    assert result.returncode == 2
    assert f"port {env['WIKIRAG_S3_PORT']} on 127.0.0.1 is in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert {r[1] for r in _status(env).values()} == {"not started"}  # nothing was left half-up

    no_creds = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    result = _wikirag(no_creds, "services", "up", timeout=60)
    assert result.returncode == 2 and "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in result.stderr
