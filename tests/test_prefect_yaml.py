"""prefect.yaml checked offline: entrypoints load, crons parse, parameters validate."""

from __future__ import annotations

from pathlib import Path

import yaml
from prefect.client.schemas.schedules import CronSchedule
from prefect.flows import load_flow_from_entrypoint

ROOT = Path(__file__).resolve().parents[1]


def test_every_deployment_loads_and_validates() -> None:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployments = spec["deployments"]
    assert {d["entrypoint"] for d in deployments} >= {"flows/ingest.py:deployed_ingest",
                                                      "flows/index_rebuild.py:deployed_index_rebuild"}
    scheduled = [d["name"] for d in deployments if d.get("schedules")]
    assert scheduled == ["index-rebuild-enwiki"]  # one scheduled ingest: the rebuild's
    for deployment in deployments:
        path, _, name = deployment["entrypoint"].partition(":")
        flow = load_flow_from_entrypoint(f"{ROOT / path}:{name}")
        flow.validate_parameters(deployment.get("parameters", {}))
        assert deployment["work_pool"]["name"] == "wikirag-process"
        for schedule in deployment.get("schedules", []):
            CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])


def test_rag_core_never_imports_the_frameworks() -> None:
    import subprocess
    import sys

    # Every module of the library, so a new one cannot slip a framework import in.
    code = ("import importlib, pkgutil, sys, rag_core; "
            "names = [m.name for m in pkgutil.walk_packages(rag_core.__path__, 'rag_core.')]; "
            "[importlib.import_module(n) for n in names]; "
            "bad = [m for m in ('prefect', 'dask', 'distributed', 'mlflow', 'great_expectations') if m in sys.modules]; "
            "print(len(names), bad); sys.exit(1 if bad or len(names) < 15 else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
