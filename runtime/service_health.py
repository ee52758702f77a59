"""How ``wikirag services`` asks each engine whether it answers: with the credentials it was started with.

A refused password is an error at once (the engine runs with another one), not a wait for a start that cannot come.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import urllib.request
import uuid
from pathlib import Path
from urllib.error import HTTPError

from rag_core.progress import human_bytes
from rag_core.storage import error_reason, server_error_status
from runtime.service_credentials import S3Identity, ServicesError, TlsFiles
from runtime.service_specs import Health


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def tcp_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def answers(health: Health, port: int) -> bool:
    """The unauthenticated probe of a service's definition, on 127.0.0.1."""
    return http_ok(f"http://127.0.0.1:{port}{health.path}") if health.path else tcp_open(port)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def basic_auth(user_and_password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(user_and_password.encode()).decode()}


def bucket_ready(endpoint: str, owners: tuple[tuple[S3Identity, str], ...]) -> bool:
    """Each bucket exists, created by the one identity allowed to use it."""
    import s3fs

    try:
        for who, bucket in owners:
            fs = s3fs.S3FileSystem(key=who.key, secret=who.secret, endpoint_url=endpoint, skip_instance_cache=True,
                                   config_kwargs={"connect_timeout": 2, "read_timeout": 5,
                                                  "retries": {"max_attempts": 1}})
            if not fs.exists(bucket):
                fs.mkdir(bucket)
        return True
    except Exception:  # not up yet: any error means "ask again"
        return False


def write_refused(endpoint: str, who: S3Identity, bucket: str, data_dir: Path) -> str | None:
    """None when S3 takes a small object into ``bucket`` (removed again); else why not, with the free space of
    ``data_dir``'s disk.

    SeaweedFS answers every write with HTTP 500 when it has no volume to write to, while its health check, its
    listings and bucket creation all answer: weed mini counts its volumes from the disk's free space as it starts,
    none with less than 1% of the disk free, and they fill up. Only a write finds out.
    """
    import s3fs

    # One try: SeaweedFS itself waits 30 s for a volume before it answers 500, and each retry would wait again.
    fs = s3fs.S3FileSystem(key=who.key, secret=who.secret, endpoint_url=endpoint, skip_instance_cache=True,
                           config_kwargs={"connect_timeout": 2, "read_timeout": 45,
                                          "retries": {"mode": "standard", "total_max_attempts": 1}})
    fs.retries = 1
    probe = f"{bucket}/.wikirag-write-probe-{uuid.uuid4().hex}"
    try:
        fs.pipe(probe, b"probe")
        fs.rm(probe)
        return None
    except Exception as exc:  # botocore's connection errors are no OSError
        reason = error_reason(exc)
        if server_error_status(exc) not in (500, 507):
            return f"refuses writes ({reason}); check its credentials and its log"
        disk = shutil.disk_usage(data_dir)
        return (f"refuses writes ({reason}); its disk ({data_dir}) has {human_bytes(disk.free)} free of "
                f"{human_bytes(disk.total)} ({100 * disk.free / disk.total:.1f}%), and SeaweedFS takes no writes with "
                "less than 1% free or its volumes full; free space there or put WIKIRAG_HOME on a larger disk")


def workers_online(api_url: str, pool: str, auth: str | None) -> bool:
    """A worker of ``pool`` is online; a refused auth string is an error at once (the server runs with another)."""
    headers = {"Content-Type": "application/json", **(basic_auth(auth) if auth else {})}
    request = urllib.request.Request(f"{api_url}/work_pools/{pool}/workers/filter", data=b"{}",
                                     headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=2) as resp:
            return any(w.get("status") == "ONLINE" for w in json.load(resp))
    except HTTPError as exc:
        if exc.code == 401:
            raise ServicesError(f"the Prefect server at {api_url} refuses PREFECT_API_AUTH_STRING: it runs with "
                                "another; export that one, or `wikirag services down` and up again") from None
        return False
    except (OSError, ValueError):
        return False


def mlflow_accepts(url: str, user: str, password: str, users_db: Path) -> bool:
    """An authenticated read answers; a refused password is an error at once (the admin user exists already)."""
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/experiments/search?max_results=1",
                                     headers=basic_auth(f"{user}:{password}"))
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status == 200
    except HTTPError as exc:
        if exc.code in (401, 403):
            raise ServicesError(f"MLflow at {url} refuses MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD: its "
                                f"users ({users_db}) were created with another password; export that one, or stop "
                                "the services and delete that file to create the admin user anew") from None
        return False
    except OSError:
        return False


def dask_workers_up(address: str, expected: int, tls: TlsFiles) -> bool:
    try:
        from distributed import Client

        with Client(address, timeout=3, security=tls.security()) as client:
            return len(client.scheduler_info(n_workers=-1)["workers"]) >= expected
    except Exception:  # scheduler not reachable yet
        return False
