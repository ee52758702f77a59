"""Guarantee: while a new version is built and published on S3, ``wikirag search`` against LATEST always succeeds
and answers from one whole version, the old or the new.

The store is the real S3 server (SeaweedFS) with credentials from the
environment. A published version is there; ``wikirag index-rebuild`` builds
and publishes another from a dump in its own process, while this process runs
``wikirag search --json`` against LATEST over and over. Each answer must be,
in full, the answer of one of the two versions (each asked by name after).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.wikirag import main
from rag_core.index.encoders import Encoder, EncoderConfig
from rag_core.index.versions import latest_version
from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource, iter_pages
from runtime.process_groups import die_with_parent
from tests.conftest import SAMPLE_BZ2, S3Server
from tests.helpers.encoderfiles import save_tiny_bert
from tests.helpers.pages import QUESTIONS, page_rows, write_dump
from tests.helpers.passagefiles import publish_small_index, sample_passages

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
REPO = Path(__file__).resolve().parents[2]
PAUSE_S = 1.0  # between searches: a reader asking every second, leaving the 2 cores to the rebuild


def _search(capsys: pytest.CaptureFixture, *version: str) -> str:
    """``wikirag search --json`` of the questions (LATEST, or ``--version``): its stdout, after a zero exit."""
    code = main(["search", *QUESTIONS, "-k", "5", "--json", *(("--version", *version) if version else ())])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(out.splitlines()) == len(QUESTIONS), out
    return out


def test_searches_during_a_rebuild_on_s3_answer_from_one_whole_version(
        wiki: Path, s3_server: S3Server, prefect_server: str, home: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    url = f"s3://{s3_server.bucket}/readers-during-rebuild"
    for key, value in {**s3_server.env(), "WIKIRAG_STORE": url}.items():
        monkeypatch.setenv(key, value)
    tiny = save_tiny_bert(tmp_path / "tiny")
    encoder = Encoder.load(EncoderConfig(path=str(tiny), dtype="float32"))
    old = publish_small_index(Store(url, s3_server.options()), "d1", sample_passages().slice(0, 60), encoder, 2)
    old_answer = _search(capsys)

    articles = [p for p in iter_pages(DumpSource(str(SAMPLE_BZ2)))  # short ones: a quick rebuild
                if p.ns == 0 and not p.redirect and p.text and 3000 <= len(p.text) <= 20000][:8]
    dump, index = write_dump(tmp_path, page_rows(articles))
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "WIKIRAG_WORKERS": "2", "PYTHONPATH": str(REPO)}
    log = (tmp_path / "rebuild.log").open("w")  # a file, not a pipe: nobody reads it while the loop runs
    rebuild = subprocess.Popen([sys.executable, "-m", "cli.wikirag", "index-rebuild", str(dump), "--index", str(index),
                                "--shards", "2", "--encoder", str(tiny), "--encoder-dtype", "float32"],
                               env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True,
                               preexec_fn=die_with_parent)
    answers = []
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 400
        while rebuild.poll() is None and time.monotonic() < deadline:
            answers.append(_search(capsys))  # any failure here is the guarantee's failure
            time.sleep(PAUSE_S)
        answers.append(_search(capsys))
        out, _ = rebuild.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        if rebuild.poll() is None:
            rebuild.kill()
            rebuild.wait()
        log.close()
    assert rebuild.returncode == 0, (tmp_path / "rebuild.log").read_text()[-3000:]
    new = out.strip()
    assert latest_version(Store(url, s3_server.options())) == new != old

    new_answer = _search(capsys, new)
    assert _search(capsys, old) == old_answer != new_answer  # the two versions answer differently
    whole = [a == old_answer or a == new_answer for a in answers]
    print(f"{len(answers)} searches during the {took:.0f} s rebuild: {answers.count(old_answer)} from the old version, "
          f"{answers.count(new_answer)} from the new")
    assert all(whole), [a for a in answers if a not in (old_answer, new_answer)][:1]
    assert answers[0] == old_answer and answers[-1] == new_answer and len(answers) >= 5
