"""Guarantee: an S3 secret given through the environment is written nowhere and printed nowhere.

A real rebuild and a search against the real S3 server (SeaweedFS), their
flow runs on the session's Prefect server (which has also served every other
S3 test before this one); then every file of the workspace, of that server's
home (its database and logs), every object of the store and everything the
commands printed is searched for the secret.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import s3fs

from rag_core.wiki.dumps import DumpSource, iter_pages
from runtime.process_groups import die_with_parent
from tests.conftest import SAMPLE_BZ2, S3Server
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.pages import page_rows, write_dump

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_the_secret_is_in_no_file_no_object_and_no_output(s3_server: S3Server, home: Path, tmp_path: Path,
                                                          prefect_server: str, prefect_home: Path) -> None:
    secret = s3_server.secret
    assert len(secret) > 24  # distinctive: no accidental match
    articles = [p for p in iter_pages(DumpSource(str(SAMPLE_BZ2))) if p.ns == 0 and not p.redirect and p.text][:6]
    dump, index = write_dump(tmp_path, page_rows(articles))
    store = f"s3://{s3_server.bucket}/secrets-test"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_API"))},
           **s3_server.env(), "WIKIRAG_HOME": str(home), "WIKIRAG_STORE": store, "WIKIRAG_WORKERS": "2",
           "PYTHONPATH": str(REPO), "PREFECT_API_URL": prefect_server}
    tiny = save_tiny_bert(tmp_path / "tiny")
    outputs = []
    for args in (["-v", "index-rebuild", str(dump), "--index", str(index), "--shards", "2", "--encoder", str(tiny)],
                 ["-v", "search", "Who was Achilles?", "--json"], ["indexes", "show"],
                 ["search", "anything", "--store", f"s3://{s3_server.bucket}/no-such-prefix"]):
        proc = subprocess.run([sys.executable, "-m", "cli.wikirag", *args], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=600, check=False, preexec_fn=die_with_parent)
        outputs.append(proc)
    assert [p.returncode for p in outputs] == [0, 0, 0, 2], outputs[0].stderr[-3000:]

    printed = [f"{p.args[3:5]}: {stream}" for p in outputs for stream in ("stdout", "stderr")
               if secret in getattr(p, stream)]
    written = [str(f) for folder in (home, prefect_home) for f in folder.rglob("*")
               if f.is_file() and secret.encode() in f.read_bytes()]
    fs = s3fs.S3FileSystem(**s3_server.options(), skip_instance_cache=True)
    objects = fs.find(f"{s3_server.bucket}/secrets-test")
    assert any(o.endswith("/LATEST") for o in objects) and len(objects) > 10
    stored = [o for o in objects if secret.encode() in fs.cat_file(o)]
    assert (printed, written, stored) == ([], [], [])
    assert any(prefect_home.rglob("*.db"))  # the server's database was searched too
