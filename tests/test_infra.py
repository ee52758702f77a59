"""infra/: the compose file, the Kubernetes manifests, the Dask values and the Dockerfile agree.

No container runtime or cluster here, so this checks what would otherwise fail only on
deployment: images, ports, service addresses, secret names, and that no credential sits in a file.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from flows.local_cluster import NANNY_ENVIRONMENT
from flows.services import ServicePorts
from flows.settings import QUIET_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
SECRETS = {"wikirag-s3": {"access-key-id", "secret-access-key"}, "wikirag-postgres": {"password"}}
SENSITIVE = re.compile(r"SECRET|PASSWORD|ACCESS_KEY|TOKEN|BACKEND_STORE_URI")
ADDRESS_VARS = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "WIKIRAG_DASK_ADDRESS", "AWS_ENDPOINT_URL",
                "MLFLOW_S3_ENDPOINT_URL")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _compose() -> dict:
    return yaml.safe_load((INFRA / "compose.yaml").read_text())


def _k8s_docs() -> list[dict]:
    docs = []
    for path in sorted((INFRA / "k8s").glob("*.yaml")):
        if path.name in ("kustomization.yaml", "dask-values.yaml"):
            continue
        docs += [dict(d, _file=path.name) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    template = spec.get("template", {}) or spec.get("jobTemplate", {}).get("spec", {}).get("template", {})
    return template.get("spec", {}).get("containers", [])


def _k8s_env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _dask_values() -> dict:
    return yaml.safe_load((INFRA / "k8s" / "dask-values.yaml").read_text())


def test_kustomization_lists_existing_manifests_in_one_namespace() -> None:
    kustomization = yaml.safe_load((INFRA / "k8s" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (INFRA / "k8s" / resource).is_file(), resource
    assert {d["metadata"].get("namespace", d["metadata"]["name"]) for d in _k8s_docs()} == {
        kustomization["namespace"]}


def test_images_are_pinned_and_the_same_everywhere() -> None:
    compose = {s.get("image") for s in _compose()["services"].values()}
    k8s = {c["image"] for d in _k8s_docs() for c in _containers(d)}
    dask = _dask_values()
    helm = {f"{dask[role]['image']['repository']}:{dask[role]['image']['tag']}" for role in ("scheduler", "worker")}
    for image in compose | k8s | helm:
        name, _, tag = image.partition(":")
        assert tag and tag != "latest", f"{image}: pin a tag"
        if name == "wikirag":  # built by infra/Dockerfile from this checkout
            assert tag.split("-")[0] == VERSION, f"{image}: wikirag's version is {VERSION}"
    third_party = lambda images: {i for i in images if not i.startswith("wikirag:")}  # noqa: E731
    assert third_party(compose) == third_party(k8s) == {"postgres:16.6"}


def test_ports_match_the_defaults_of_wikirag_services() -> None:
    defaults = ServicePorts()
    expected = {"s3": defaults.s3_port, "mlflow": defaults.mlflow_port, "prefect-server": defaults.prefect_port,
                "dask-scheduler": defaults.dask_port, "postgres": 5432}
    compose = _compose()["services"]
    for name, port in expected.items():
        if name == "postgres":
            continue
        published = {p.rsplit(":", 1)[-1] for p in compose[name].get("ports", [])}
        assert str(port) in published, f"compose {name}: publishes {published}, wikirag services uses {port}"
        assert all(p.startswith("127.0.0.1:") for p in compose[name]["ports"]), "compose publishes on loopback only"
    services = {d["metadata"]["name"]: [p["port"] for p in d["spec"]["ports"]] for d in _k8s_docs()
                if d["kind"] == "Service"}
    dask = _dask_values()
    services[f"{dask['fullnameOverride']}-scheduler"] = [dask["scheduler"]["servicePort"]]
    for name, port in expected.items():
        assert port in services.get(name, []), f"k8s Service {name}: ports {services.get(name)}, expected {port}"

    # Every address a container is given names a Service (or compose service) and a port it serves.
    compose_ports = {n: {int(p.rsplit(":", 1)[-1]) for p in s.get("ports", [])} for n, s in compose.items()}
    compose_ports["postgres"] = {5432}
    for name, service in compose.items():
        for var, value in (service.get("environment") or {}).items():
            if var in ADDRESS_VARS:
                url = urlparse(value)
                assert url.port in compose_ports.get(url.hostname, set()), f"compose {name}: {var}={value}"
    for doc in _k8s_docs():
        for container in _containers(doc):
            for var, entry in _k8s_env(container).items():
                if var in ADDRESS_VARS:
                    url = urlparse(entry["value"])
                    assert url.port in services.get(url.hostname, []), f"{doc['_file']}: {var}={entry['value']}"


def test_credentials_come_from_secrets_never_from_files() -> None:
    for doc in _k8s_docs():
        for container in _containers(doc):
            for var, entry in _k8s_env(container).items():
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in SECRETS.get(ref["name"], set()), f"{doc['_file']}: unknown secret {ref}"
                elif SENSITIVE.search(var):
                    # a literal may only combine secrets that Kubernetes expands: $(POSTGRES_PASSWORD)
                    assert "$(" in entry.get("value", ""), f"{doc['_file']}: {var} is a literal"
    for name, service in _compose()["services"].items():
        for var, value in (service.get("environment") or {}).items():
            if SENSITIVE.search(var):
                assert "${" in str(value) and ":?" in str(value), f"compose {name}: {var} must come from the shell"
    operations = (ROOT / "docs" / "operations.md").read_text()
    for secret, keys in SECRETS.items():
        assert f"create secret generic {secret}" in operations, f"docs/operations.md: how to create {secret}"
        for key in keys:
            assert f"--from-literal={key}=" in operations, f"docs/operations.md: {secret} needs the key {key}"


def test_dockerfile_pins_torch_and_switches_telemetry_off() -> None:
    dockerfile = (INFRA / "Dockerfile").read_text()
    assert "torch==2.13.0" in dockerfile
    for var, value in QUIET_ENVIRONMENT.items():
        if var.startswith(("DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS", "MLFLOW_DISABLE", "GX_", "HF_HUB_DISABLE_T")):
            assert f"{var}={value}" in dockerfile, f"infra/Dockerfile: set {var}={value}"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    base = re.search(r"FROM python:(\d+\.\d+)", dockerfile)
    assert base and requires == f">={base.group(1)}", (requires, base)


def test_dask_workers_started_by_hand_or_in_the_image_keep_glibcs_malloc() -> None:
    # The same value as the local cluster's and the services' workers (flows/local_cluster.py)
    for var, value in NANNY_ENVIRONMENT.items():
        assert f'{var}="{value}"' in (INFRA / "Dockerfile").read_text(), f"infra/Dockerfile: set {var}"
        assert f'export {var}="{value}"' in (INFRA / "env.sh").read_text(), f"infra/env.sh: export {var}"


@pytest.mark.parametrize("script", sorted(p.name for p in INFRA.glob("*.sh")))
def test_scripts_bind_loopback(script: str) -> None:
    text = (INFRA / script).read_text()
    assert "0.0.0.0" not in text
    assert "env.sh" in text or script == "env.sh"
