"""``wikirag models rollback NAME`` and ``wikirag refresh`` as a user runs them, against a real MLflow store and a
store of real index versions (tests/helpers/refreshfiles.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from runtime.process_groups import die_with_parent
from tasks.adapters.mlflow_registry import CHAMPION, model_name
from tests.helpers.refreshfiles import TwoVersions, register_trained, two_versions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def versions(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> TwoVersions:
    return two_versions(tmp_path_factory.mktemp("refresh-cli"))


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.wikirag", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600, preexec_fn=die_with_parent)


def _env(tmp_path: Path, uri: str, versions: TwoVersions, **more: str) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_URI": uri, "WIKIRAG_HOME": str(tmp_path / "home"),
            "WIKIRAG_STORE": versions.store.url, "PYTHONPATH": str(ROOT), **more}


def test_models_rollback_moves_the_champion_back_and_refuses_in_one_line(versions: TwoVersions,
                                                                         tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    name, env = model_name("cloze"), _env(tmp_path, uri, versions)
    register_trained(uri, versions, versions.old, 0.1)
    register_trained(uri, versions, versions.new, 0.2)  # promoted over v1

    done = _cli(env, "models", "rollback", name)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == (f"{name}: champion moved back from v2 to v1 (index {versions.old}, still pinned)")
    assert str(MlflowClient(tracking_uri=uri).get_model_version_by_alias(name, CHAMPION).version) == "1"

    again = _cli(env, "models", "rollback", name)  # v1 replaced no champion, and none is below it
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.strip().splitlines()[-1] == (f"wikirag: error: {name}: v1 is its first version; there is "
                                                     "nothing to roll back to")
    assert "Traceback" not in again.stderr
    assert str(MlflowClient(tracking_uri=uri).get_model_version_by_alias(name, CHAMPION).version) == "1"


@pytest.mark.slow
def test_refresh_from_the_command_line_leaves_a_champion_already_on_latest_as_it_is(
        versions: TwoVersions, tmp_path: Path, prefect_server: str) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    name = model_name("cloze")
    register_trained(uri, versions, versions.new, 0.1)  # bound to LATEST already
    proc = _cli(_env(tmp_path, uri, versions, PREFECT_API_URL=prefect_server), "refresh", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [decision] = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert (decision["name"], decision["version"], decision["rebound"]) == (name, "1", False)
    assert decision["reason"] == f"already bound to {versions.new}" and decision["run_id"] is None
    assert len(MlflowClient(tracking_uri=uri).search_model_versions(f"name='{name}'")) == 1

    unknown = _cli(_env(tmp_path, uri, versions, PREFECT_API_URL=prefect_server), "refresh", "--model",
                   "wikirag-nope")
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines()[-1].startswith("wikirag: error: wikirag-nope: no champion in MLflow")
