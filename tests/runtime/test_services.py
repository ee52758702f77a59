"""`wikirag services`: real engines on loopback that ask for credentials; prefect.yaml's deployments run on them."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.error import HTTPError

import pytest

from tests.helpers.disks import fill, small_disk

ROOT = Path(__file__).resolve().parents[2]
SECRET = "wikirag-services-secret-7f3a9c"  # distinctive: grepped for after the run
CREDENTIALS = {  # every secret distinctive, each grepped for in argv, records, logs and files
    "AWS_ACCESS_KEY_ID": "wikirag-services", "AWS_SECRET_ACCESS_KEY": SECRET,
    "WIKIRAG_MLFLOW_S3_KEY": "wikirag-mlflow-artifacts", "WIKIRAG_MLFLOW_S3_SECRET": "mlflow-s3-secret-5c1e08",
    "PREFECT_API_AUTH_STRING": "wikirag:prefect-secret-93d2b4", "MLFLOW_TRACKING_USERNAME": "wikirag",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-secret-e61f27",
}
SECRETS = [v for k, v in CREDENTIALS.items() if k not in ("AWS_ACCESS_KEY_ID", "WIKIRAG_MLFLOW_S3_KEY",
                                                           "MLFLOW_TRACKING_USERNAME")]


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
    return {**env, **CREDENTIALS, "WIKIRAG_HOME": str(home),
            "WIKIRAG_S3_PORT": str(base), "WIKIRAG_MLFLOW_PORT": str(base + 5), "WIKIRAG_PREFECT_PORT": str(base + 6),
            "WIKIRAG_DASK_PORT": str(base + 7), "WIKIRAG_DASK_DASHBOARD_PORT": str(base + 8),
            "WIKIRAG_DASK_WORKERS": "2", "PYTHONPATH": str(ROOT)}


def _wikirag(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.wikirag", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _status(env: dict[str, str]) -> dict[str, list[str]]:
    out = _wikirag(env, "services", "status").stdout
    return {row.split("\t")[0]: row.split("\t") for row in out.splitlines()}


def _basic(user_and_password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(user_and_password.encode()).decode()}


def _api(url: str, path: str, body: dict, auth: str | None = CREDENTIALS["PREFECT_API_AUTH_STRING"]) -> list | dict:
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(_basic(auth) if auth else {})})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.load(resp)


def _http_status(url: str, headers: dict[str, str] | None = None, body: dict | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except HTTPError as exc:
        return exc.code


def _group_pids(leader: int) -> list[int]:
    """Every process of a service's process group (its workers, nannies and children)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == leader:
                    pids.append(int(entry.name))
            except ProcessLookupError:
                continue
    return pids


def _running_with(text: str) -> list[str]:
    """The command lines of running processes that contain ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
        except OSError:
            continue
        if entry.name.isdigit() and text in line:
            found.append(line)
    return found


def _python(env: dict[str, str], code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # run in the workspace: a client that missed the server would leave its files there, not in the checkout
    return subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)},
                          cwd=env["WIKIRAG_HOME"], capture_output=True, text=True, timeout=timeout)


@dataclass
class Services:
    home: Path
    env: dict[str, str]  # the environment `up` ran with: the credentials included
    exports: dict[str, str]  # what `up` printed for clients
    rows: dict[str, list[str]]
    started: subprocess.CompletedProcess

    @property
    def client_env(self) -> dict[str, str]:
        return {**self.env, **self.exports}


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Services:
    """``wikirag services up`` once for the module; ``down`` after its last test, every process checked gone."""
    home = tmp_path_factory.mktemp("services") / "home"
    env = _env(home)
    rows: dict[str, list[str]] = {}
    try:
        started = _wikirag(env, "services", "up")
        assert started.returncode == 0, started.stderr
        exports = dict(line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines())
        rows = _status(env)
        assert [r[1] for r in rows.values()] == ["up"] * 6, rows
        yield Services(home, env, exports, rows, started)
    finally:
        stopped = _wikirag(env, "services", "down")
    assert stopped.returncode == 0, stopped.stderr
    for name, row in rows.items():
        assert not Path(f"/proc/{row[2]}").exists(), f"{name} (pid {row[2]}) still runs"
    assert {r[1] for r in _status(env).values()} == {"not started"}




def test_up_is_idempotent_and_every_engine_refuses_a_request_without_credentials(services: Services) -> None:
    env, exports = services.env, services.exports
    again = _wikirag(env, "services", "up")  # idempotent: nothing restarted
    assert again.returncode == 0 and again.stderr.count("already up") == 6, again.stderr
    assert _status(env) == services.rows

    # each engine runs the command line of its definition (runtime/service_specs.py), as compose and k8s do
    from runtime.service_specs import SPECS, Placement, ServicePorts

    ports = ServicePorts(**{f: int(env[f"WIKIRAG_{f.upper()}"]) for f in ServicePorts.model_fields})
    for name, row in services.rows.items():
        argv = json.loads((services.home / "services" / f"{name}.json").read_text())["argv"]
        defined = SPECS[name].argv(Placement.local(services.home, ports))
        assert argv[:len(defined)] == defined and len(argv) - len(defined) == (name == "s3"), (name, argv, defined)
        assert Path(f"/proc/{row[2]}/cmdline").read_bytes().decode().split("\0")[:-1] == argv, name

    # Prefect: only the health probe is open; every API call needs the auth string
    api = exports["PREFECT_API_URL"]
    assert _http_status(f"{api}/health") == 200
    assert _http_status(f"{api}/work_pools/filter", body={}) == 401
    assert _http_status(f"{api}/work_pools/filter", _basic("wikirag:guessed"), body={}) == 401
    pools = _python(services.client_env, "import asyncio; from prefect.client.orchestration import get_client\n"
                    "async def main():\n    async with get_client() as c:\n"
                    "        print([p.name for p in await c.read_work_pools()])\n"
                    "asyncio.run(main())")
    assert pools.returncode == 0 and "wikirag-process" in pools.stdout, pools.stderr[-2000:]

    # MLflow: REST without or with a wrong password is 401; its own client, with the variables, logs an artifact
    search = f"{exports['MLFLOW_TRACKING_URI']}/api/2.0/mlflow/experiments/search?max_results=1"
    assert _http_status(search) == 401
    assert _http_status(search, _basic("wikirag:guessed-password")) == 401
    logged = _python(services.client_env, "import mlflow\nmlflow.set_experiment('auth-check')\n"
                     "with mlflow.start_run() as run: mlflow.log_text('artifact', 'check.txt')\n"
                     "print(run.info.artifact_uri)")
    assert logged.returncode == 0, logged.stderr[-2000:]
    no_password = {k: v for k, v in services.client_env.items()
                   if k not in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    refused = _python(no_password, "import mlflow; mlflow.MlflowClient().search_experiments()")
    assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr[-2000:]

    # S3: the MLflow server wrote with its own identity; the store's identity cannot touch that bucket, nor back
    import s3fs

    def s3(key: str, secret: str) -> s3fs.S3FileSystem:
        return s3fs.S3FileSystem(key=key, secret=secret, endpoint_url=exports["AWS_ENDPOINT_URL"],
                                 skip_instance_cache=True, config_kwargs={"retries": {"max_attempts": 1}})

    artifacts = s3(env["WIKIRAG_MLFLOW_S3_KEY"], env["WIKIRAG_MLFLOW_S3_SECRET"])
    written = [p for p in artifacts.find("wikirag-mlflow/artifacts") if p.endswith("/check.txt")]
    assert len(written) == 1 and artifacts.cat(written[0]) == b"artifact"
    store = s3(env["AWS_ACCESS_KEY_ID"], SECRET)
    store.pipe("wikirag/store/probe", b"store")
    for attempt in (lambda: store.pipe("wikirag-mlflow/artifacts/planted.py", b"import os"),
                    lambda: store.cat(written[0]), lambda: store.rm_file(written[0]),
                    lambda: artifacts.cat("wikirag/store/probe"), lambda: artifacts.pipe("wikirag/store/x", b"x")):
        with pytest.raises(PermissionError):
            attempt()
    assert artifacts.cat(written[0]) == b"artifact" and not artifacts.exists("wikirag-mlflow/artifacts/planted.py")

    # Dask: TLS with the client certificate that `services env` points at (picked up from DASK_* variables)
    address = exports["WIKIRAG_DASK_ADDRESS"]
    assert address.startswith("tls://127.0.0.1:")
    computed = _python(services.client_env, "import json, os; from distributed import Client\n"
                       "with Client(os.environ['WIKIRAG_DASK_ADDRESS'], timeout=30) as c:\n"
                       "    print(json.dumps([c.submit(lambda: 1 + 1).result(), list(c.scheduler_info()['workers'])]))")
    assert computed.returncode == 0, computed.stderr[-2000:]
    two, workers = json.loads(computed.stdout.strip().splitlines()[-1])
    assert two == 2 and len(workers) == 2 and all(w.startswith("tls://127.0.0.1:") for w in workers), workers
    tls_dir = services.home / "services" / "tls"
    for code in (  # plain TCP; TLS without a client certificate; a certificate of another CA
            f"Client('{address.replace('tls://', 'tcp://')}', timeout=5, security=Security(require_encryption=False))",
            f"Client('{address}', timeout=5, security=Security(tls_ca_file='{tls_dir / 'ca.pem'}'))",
            f"Client('{address}', timeout=5, security=Security.temporary())"):
        attempt = _python(env, f"from distributed import Client, Security\nc = {code}\n"
                          "print(c.submit(lambda: 1 + 1).result())", timeout=60)
        assert attempt.returncode != 0 and attempt.stdout.strip() != "2", (code, attempt.stdout, attempt.stderr[-1000:])
    for key in tls_dir.glob("*-key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key

    # another password than the running engines' is one line naming the variable; nothing is restarted
    for var, value in (("MLFLOW_TRACKING_PASSWORD", "another-password-000"), ("PREFECT_API_AUTH_STRING", "wikirag:x")):
        other = _wikirag({**env, var: value}, "services", "up", timeout=120)
        assert other.returncode == 2 and var in other.stderr and "Traceback" not in other.stderr, other.stderr
        assert value not in other.stderr
    assert _status(env) == services.rows

    # no secret in any process's argv, nor in any record, log or other file of the workspace, nor printed
    for name, row in services.rows.items():
        for pid in _group_pids(int(row[2])):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert not [s for s in SECRETS if s.encode() in argv], f"{name}: a secret in pid {pid}'s argv"
    printed = services.started.stdout + services.started.stderr + again.stdout + again.stderr
    assert not [s for s in SECRETS if s in printed]
    leaks = [str(p) for p in services.home.rglob("*") if p.is_file() and any(s.encode() in p.read_bytes()
                                                                               for s in SECRETS)]
    assert not leaks, f"a secret was written to {leaks}"


@pytest.mark.slow
def test_services_run_the_deployments_on_real_engines(services: Services, wiki: Path, tmp_path: Path) -> None:
    env, exports, home, started = services.env, services.exports, services.home, services.started
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
                          "--param", "dump_site=null", "--param", f"config={json.dumps(params)}", "--watch", "--watch-timeout", "400"],
                         env=client_env, cwd=ROOT, capture_output=True, text=True, timeout=450)
    assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:]
    from distributed import Client

    from runtime.services import tls_files

    with Client(exports["WIKIRAG_DASK_ADDRESS"], timeout=30, security=tls_files(home).security()) as client:
        # the workers the ingest ran on; a lambda travels by value, so os.environ is the worker's own (a bound
        # os.environ.get would carry ours)
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
    from tests.helpers.encoderfiles import save_tiny_bert
    from tests.helpers.generatorfiles import save_tiny_llama
    from tests.helpers.passagefiles import publish_small_index, sample_passages

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
    # version 1 by number: 4 dev examples never make a champion (below)
    consumer = ("import json, mlflow; m = mlflow.pyfunc.load_model('models:/wikirag-cloze/1'); "
                "print(json.dumps(m.predict(['Who was Achilles?'])))")
    loaded = subprocess.run([sys.executable, "-c", consumer], env=client_env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)  # a fresh process, from the MLflow server and S3
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    answer = json.loads(loaded.stdout.strip().splitlines()[-1])[0]
    assert answer["question"] == "Who was Achilles?" and len(answer["provenance"]) == 2
    read = subprocess.run(
        [sys.executable, "-c", "import json; from mlflow import MlflowClient; c = MlflowClient(); "
         "v = c.get_model_version('wikirag-cloze', '1'); m = c.get_run(v.run_id).data.metrics; "
         "print(json.dumps({'tags': dict(v.tags), 'aliases': list(v.aliases), 'metrics': m}))"],
        env=client_env, capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr[-3000:]
    registered = json.loads(read.stdout.strip().splitlines()[-1])
    assert registered["tags"]["index_version"] == version and registered["tags"]["store"] == "s3://wikirag/store"
    # 4 dev examples: any lead on them is within chance, so the gate never promotes (the worker ran its rule)
    assert {"dev_answers_gained", "dev_answers_lost"} <= set(registered["metrics"])
    assert registered["aliases"] == ["challenger"], registered

    # checked last: the server's scheduler wakes every 60 s, so the deployment runs above overlap that wait
    query = {"deployments": {"id": {"any_": [deployments["index-rebuild-enwiki"]["id"]]}},
             "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}
    deadline = time.monotonic() + 150  # on a busy machine the scheduler's pass comes later
    while not (scheduled := _api(api, "/flow_runs/filter", query)) and time.monotonic() < deadline:
        time.sleep(3)
    assert scheduled, "the scheduled index rebuild shows no upcoming runs"

    printed = started.stdout + started.stderr + run.stdout + run.stderr + tuned.stdout + tuned.stderr
    assert not [s for s in SECRETS if s in printed]
    leaks = [str(p) for p in home.rglob("*") if p.is_file() and any(s.encode() in p.read_bytes() for s in SECRETS)]
    assert not leaks, f"a secret was written to {leaks}"


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
    assert result.returncode == 2
    assert "the services need credentials: export AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY " in result.stderr
    for name in ("PREFECT_API_AUTH_STRING", "MLFLOW_TRACKING_PASSWORD", "WIKIRAG_MLFLOW_S3_SECRET"):
        partial = {k: v for k, v in env.items() if k != name}
        result = _wikirag(partial, "services", "up", timeout=60)
        assert result.returncode == 2 and f"export {name} " in result.stderr and "Traceback" not in result.stderr
    assert {r[1] for r in _status(env).values()} == {"not started"}


def test_an_s3_disk_without_room_for_a_volume_is_one_clear_line_and_nothing_stays_up(tmp_path: Path) -> None:
    """SeaweedFS answers its health check, listings and bucket creation on a disk with no room for a volume, and
    every write with HTTP 500: `services up` writes once to find out, and says so with the disk's free space
    instead of handing out a store that fails each write after its retries."""
    with small_disk(tmp_path / "disk", "200m") as disk:
        fill(disk, leave=1000 * 1000)  # 1 MB free: 0.5% of the disk
        env = _env(disk / "home")
        result = _wikirag(env, "services", "up", "s3", timeout=120)
        last = result.stderr.strip().splitlines()[-1]
        print(last)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert last.startswith("wikirag: error: s3: SeaweedFS at http://127.0.0.1:"), last
        assert "is up but refuses writes (" in last, last
        assert re.search(r"its disk \(.*/home/services/s3\) has \d+\.\d KB free of 209\.7 MB \(0\.\d%\)", last), last
        assert "free space there or put WIKIRAG_HOME on a larger disk, then `wikirag services down` and up " \
               "again" in last, last
        assert {r[1] for r in _status(env).values()} == {"not started"}  # the server it started is stopped again
        assert _running_with(str(disk)) == [], "a process still runs on the small disk"


# -- infra/*.sh: one engine each, in the foreground, as its definition says ------------------------------------
def _run_script(script: str, env: dict[str, str], ready, timeout: float = 120) -> tuple[subprocess.Popen, Path]:
    """Start ``infra/<script>`` in a session of its own; wait until ``ready()``; the log of what it printed."""
    log_path = Path(env["WIKIRAG_HOME"]) / f"{script}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as out:
        proc = subprocess.Popen(["bash", str(ROOT / "infra" / script)], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"{script} exited with {proc.returncode}: {log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{script} not ready in {timeout:.0f} s: {log_path.read_text()[-3000:]}"
        time.sleep(0.5)
    return proc, log_path


def _runs(group: int, argv: list[str]) -> bool:
    """One process of ``group`` runs ``argv`` (SeaweedFS: and the flag of its identities' file); the program may be
    named by another link to the same file (the scripts' python3 for this test's python)."""
    found = []
    for pid in _group_pids(group):
        running = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        if running and running[-1].startswith("-s3.config=/dev/fd/"):
            running = running[:-1]
        if running[1:] == argv[1:] and os.path.realpath(running[0]) == os.path.realpath(argv[0]):
            found.append(pid)
    return len(found) == 1


def test_the_scripts_start_each_engine_as_its_definition_with_its_lock(tmp_path: Path) -> None:
    from runtime.process_groups import stop_process_group
    from runtime.service_health import answers
    from runtime.service_specs import SPECS, Placement, ServicePorts

    env = {**_env(tmp_path / "home"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    ports = ServicePorts(**{f: int(env[f"WIKIRAG_{f.upper()}"]) for f in ServicePorts.model_fields})
    at = Placement.local(tmp_path / "home", ports)
    started = []
    try:
        # SeaweedFS: the store's identity works, an unknown key is refused; the identities are in no argv
        proc, _ = _run_script("seaweedfs.sh", env, lambda: answers(SPECS["s3"].health, ports.s3_port))
        started.append(proc)
        assert _runs(proc.pid, SPECS["s3"].argv(at)), SPECS["s3"].argv(at)
        import s3fs

        def s3(key: str, secret: str) -> s3fs.S3FileSystem:
            return s3fs.S3FileSystem(key=key, secret=secret, endpoint_url=at.url("s3"), skip_instance_cache=True,
                                     config_kwargs={"retries": {"max_attempts": 1}})

        deadline = time.monotonic() + 60  # the S3 port answers before the filer behind it
        while True:
            try:
                s3(env["AWS_ACCESS_KEY_ID"], SECRET).mkdir("wikirag")
                break
            except Exception:
                assert time.monotonic() < deadline, "SeaweedFS of seaweedfs.sh never accepted the store's identity"
                time.sleep(1)
        s3(env["WIKIRAG_MLFLOW_S3_KEY"], env["WIKIRAG_MLFLOW_S3_SECRET"]).mkdir("wikirag-mlflow")
        for who in (("someone", "guessed-secret"), (env["AWS_ACCESS_KEY_ID"], SECRET)):
            with pytest.raises(PermissionError):  # an unknown key; the store's identity in MLflow's bucket
                s3(*who).ls("wikirag-mlflow")
        for pid in _group_pids(proc.pid):  # the identities live in a file in memory only
            seen = Path(f"/proc/{pid}/environ").read_bytes() + Path(f"/proc/{pid}/cmdline").read_bytes()
            assert not [s for s in SECRETS if s.encode() in seen], f"a secret in pid {pid}'s environment or argv"

        # Prefect: only the health probe is open
        proc, _ = _run_script("prefect-server.sh", env, lambda: answers(SPECS["prefect"].health, ports.prefect_port))
        started.append(proc)
        assert _runs(proc.pid, SPECS["prefect"].argv(at)), SPECS["prefect"].argv(at)
        assert _http_status(f"{at.url('prefect')}/work_pools/filter", body={}) == 401
        assert _http_status(f"{at.url('prefect')}/work_pools/filter", _basic(CREDENTIALS["PREFECT_API_AUTH_STRING"]),
                            body={}) == 200

        # Dask: scheduler and workers over TLS; a client with what the script printed computes
        proc, log_path = _run_script("dask-cluster.sh", env,
                                     lambda: "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY" in
                                     (Path(env["WIKIRAG_HOME"]) / "dask-cluster.sh.log").read_text())
        started.append(proc)
        exports = dict(line.removeprefix("export ").split("=", 1) for line in log_path.read_text().splitlines()
                       if line.startswith("export "))
        assert exports["WIKIRAG_DASK_ADDRESS"] == at.url("dask")
        computed = _python({**env, **exports}, "import os; from distributed import Client\n"
                           "with Client(os.environ['WIKIRAG_DASK_ADDRESS'], timeout=30) as c:\n"
                           "    c.wait_for_workers(2, timeout=60); print(c.submit(lambda: 1 + 1).result())")
        assert computed.returncode == 0 and computed.stdout.strip().endswith("2"), computed.stderr[-2000:]
        for name in ("dask", "dask-workers"):
            assert _runs(proc.pid, SPECS[name].argv(at)), SPECS[name].argv(at)
        plain = _python(env, f"from distributed import Client, Security\n"
                        f"c = Client('{at.url('dask').replace('tls://', 'tcp://')}', timeout=5, "
                        "security=Security(require_encryption=False))", timeout=60)
        assert plain.returncode != 0
    finally:
        for proc in reversed(started):
            stop_process_group(proc.pid)
    for proc in started:
        assert not _group_pids(proc.pid), f"{proc.args} left processes behind"
