"""infra/: the compose file, the Kubernetes manifests, the scripts and the Dockerfile agree, and lock every engine.

No container runtime or cluster here, so this checks what would otherwise fail only on
deployment: images, ports, service addresses, secret names, that no credential sits in a file,
that every engine asks for credentials, and (Kubernetes) that every pod runs unprivileged with
limits and reaches only what a NetworkPolicy allows.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from runtime.process_tuning import NANNY_ENVIRONMENT
from runtime.service_specs import COMPOSE, KUBERNETES, SPECS, ServiceSpec, listening_ports
from runtime.settings import QUIET_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
SECRETS = {"wikirag-s3": {"access-key-id", "secret-access-key"},  # the store's identity: bucket wikirag
           "wikirag-mlflow-s3": {"access-key-id", "secret-access-key"},  # MLflow's artifacts: bucket wikirag-mlflow
           "wikirag-postgres": {"password"}, "wikirag-prefect": {"auth-string"},
           "wikirag-mlflow": {"username", "password", "flask-secret-key"}}
K8S_SECRET_OF = {  # where Kubernetes keeps each credential that `wikirag services up` reads from its environment
    "AWS_ACCESS_KEY_ID": ("wikirag-s3", "access-key-id"), "AWS_SECRET_ACCESS_KEY": ("wikirag-s3", "secret-access-key"),
    "WIKIRAG_MLFLOW_S3_KEY": ("wikirag-mlflow-s3", "access-key-id"),
    "WIKIRAG_MLFLOW_S3_SECRET": ("wikirag-mlflow-s3", "secret-access-key"),
    "PREFECT_API_AUTH_STRING": ("wikirag-prefect", "auth-string"),
    "MLFLOW_TRACKING_USERNAME": ("wikirag-mlflow", "username"),
    "MLFLOW_TRACKING_PASSWORD": ("wikirag-mlflow", "password")}
TLS_SECRET = "wikirag-dask-tls"  # files from `python -m runtime.services tls DIR`, mounted as a volume
SENSITIVE = re.compile(r"SECRET|PASSWORD|ACCESS_KEY|TOKEN|BACKEND_STORE_URI|AUTH_STRING|S3_KEY")
ADDRESS_VARS = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "WIKIRAG_DASK_ADDRESS", "AWS_ENDPOINT_URL",
                "MLFLOW_S3_ENDPOINT_URL")
FLOW_VARS = (*ADDRESS_VARS, "MLFLOW_BACKEND_STORE_URI")  # every address a pod connects to
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _compose() -> dict:
    return yaml.safe_load((INFRA / "compose.yaml").read_text())


def _k8s_docs() -> list[dict]:
    docs = []
    for path in sorted((INFRA / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [dict(d, _file=path.name) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _template(doc: dict) -> dict:
    spec = doc.get("spec", {})
    return spec.get("template", {}) or spec.get("jobTemplate", {}).get("spec", {}).get("template", {})


def _containers(doc: dict) -> list[dict]:
    pod = _template(doc).get("spec", {})
    return pod.get("initContainers", []) + pod.get("containers", [])


def _workloads() -> dict[str, dict]:
    """Each pod template by its ``app`` label (the name NetworkPolicies select it by)."""
    found = {}
    for doc in _k8s_docs():
        if _containers(doc):
            app = _template(doc).get("metadata", {}).get("labels", {}).get("app")
            assert app, f"{doc['_file']}: {doc['kind']} {doc['metadata']['name']}: label its pods with app"
            found[app] = doc
    return found


def _k8s_env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def _secret(entry: dict) -> tuple[str, str] | None:
    ref = entry.get("valueFrom", {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref else None


def test_kustomization_lists_existing_manifests_in_one_namespace() -> None:
    kustomization = yaml.safe_load((INFRA / "k8s" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (INFRA / "k8s" / resource).is_file(), resource
    assert {d["metadata"].get("namespace", d["metadata"]["name"]) for d in _k8s_docs()} == {
        kustomization["namespace"]}


def test_images_are_pinned_and_the_same_everywhere() -> None:
    compose = {s.get("image") for s in _compose()["services"].values()}
    k8s = {c["image"] for d in _k8s_docs() for c in _containers(d)}
    for image in compose | k8s:
        name, _, tag = image.partition(":")
        assert tag and tag != "latest", f"{image}: pin a tag"
        if name == "wikirag":  # built by infra/Dockerfile from this checkout
            assert tag.split("-")[0] == VERSION, f"{image}: wikirag's version is {VERSION}"
    third_party = lambda images: {i for i in images if not i.startswith("wikirag:")}  # noqa: E731
    assert third_party(compose) == third_party(k8s) == {"postgres:16.6"}


# -- each engine as runtime/service_specs.py defines it: command line, ports, health check, credentials ----------
def _published(spec: ServiceSpec) -> list[int]:
    return [getattr(COMPOSE.ports, field) for field in spec.ports]


def _depends_on(compose: dict, name: str) -> set[str]:
    """Every compose service ``name`` waits for, directly or through another."""
    direct = compose[name].get("depends_on", {})
    found = set(direct)
    for other in direct:
        found |= _depends_on(compose, other)
    return found


def _compose_drift(compose: dict) -> list[str]:
    """How the compose file's engines differ from their definitions (empty when they agree)."""
    drift = []
    for spec in SPECS.values():
        where, service = f"compose {spec.deployed_as}", compose[spec.deployed_as]
        env = service.get("environment") or {}
        if service["command"] != spec.container_command(COMPOSE):
            drift.append(f"{where}: command {service['command']}, defined {spec.container_command(COMPOSE)}")
        published = sorted(service.get("ports", []))
        if published != sorted(f"127.0.0.1:{p}:{p}" for p in _published(spec)):
            drift.append(f"{where}: publishes {published}, defined {_published(spec)} on loopback")
        probe = ["CMD", "python", "-m", "runtime.services", "health", spec.name] if spec.health else None
        if service.get("healthcheck", {}).get("test") != probe:
            drift.append(f"{where}: healthcheck {service.get('healthcheck')}, defined {probe}")
        for var, source in {**spec.credentials, **{n: n for n in spec.passes_on}}.items():
            if env.get(var) != f"${{{source}:?export {source}}}":
                drift.append(f"{where}: {var}={env.get(var)}, defined from the shell's {source}")
        drift += [f"{where}: {var}={env.get(var)}, defined {value}" for var, value in spec.environment.items()
                  if env.get(var) != value]
        if spec.needs and SPECS[spec.needs].deployed_as not in _depends_on(compose, spec.deployed_as):
            drift.append(f"{where}: starts before {SPECS[spec.needs].deployed_as}, which it needs")
    return drift


def test_compose_starts_each_engine_as_defined() -> None:
    assert _compose_drift(_compose()["services"]) == []


def test_the_compose_check_sees_a_drift() -> None:
    for name, key, value, seen in (
            ("prefect-server", "command", ["prefect", "server", "start", "--port", "4201"], "command"),
            ("dask-scheduler", "ports", ["127.0.0.1:8786:8786"], "publishes"),
            ("mlflow", "healthcheck", {"test": ["CMD", "true"]}, "healthcheck"),
            ("prefect-worker", "depends_on", {"dask-scheduler": {}}, "starts before")):
        compose = _compose()["services"]
        compose[name][key] = value
        assert [line for line in _compose_drift(compose) if line.startswith(f"compose {name}: {seen}")], name


def _kubernetes_drift(docs: list[dict]) -> list[str]:
    drift = []
    services = {d["metadata"]["name"]: sorted(p["port"] for p in d["spec"]["ports"]) for d in docs
                if d["kind"] == "Service"}
    workloads = {_template(d)["metadata"]["labels"]["app"]: d for d in docs if _containers(d)}
    for spec in SPECS.values():
        where = f"k8s {spec.deployed_as}"
        container = _containers(workloads[spec.deployed_as])[0]
        env = _k8s_env(container)
        if container["command"] != spec.container_command(KUBERNETES):
            drift.append(f"{where}: command {container['command']}, defined {spec.container_command(KUBERNETES)}")
        if spec.ports and services.get(spec.deployed_as) != sorted(_published(spec)):
            drift.append(f"{where}: Service ports {services.get(spec.deployed_as)}, defined {_published(spec)}")
        probe = container.get("readinessProbe", {})
        if spec.health:
            port = getattr(KUBERNETES.ports, spec.health.port)
            wanted = ({"httpGet": {"path": spec.health.path, "port": port}} if spec.health.path
                      else {"tcpSocket": {"port": port}})
            if {k: v for k, v in probe.items() if k in ("httpGet", "tcpSocket")} != wanted:
                drift.append(f"{where}: readinessProbe {probe}, defined {wanted}")
        for var, source in {**spec.credentials, **{n: n for n in spec.passes_on}}.items():
            if _secret(env.get(var, {})) != K8S_SECRET_OF[source]:
                drift.append(f"{where}: {var} from {_secret(env.get(var, {}))}, defined {K8S_SECRET_OF[source]}")
        drift += [f"{where}: {var}={env.get(var)}, defined {value}" for var, value in spec.environment.items()
                  if env.get(var, {}).get("value") != value]
    return drift


def test_kubernetes_starts_each_engine_as_defined() -> None:
    assert _kubernetes_drift(_k8s_docs()) == []


def test_the_kubernetes_check_sees_a_drift() -> None:
    docs = _k8s_docs()
    scheduler = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "dask-scheduler")
    _containers(scheduler)[0]["command"].remove("--host")
    mlflow = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow")
    _containers(mlflow)[0]["readinessProbe"]["httpGet"]["path"] = "/"
    drift = _kubernetes_drift(docs)
    assert [d for d in drift if d.startswith("k8s dask-scheduler: command")], drift
    assert [d for d in drift if d.startswith("k8s mlflow: readinessProbe")], drift


def test_status_probes_the_port_of_each_health_check() -> None:
    # `wikirag services status` probes a service's first recorded port (runtime/services.py, _probe)
    for spec in SPECS.values():
        if spec.health:
            assert spec.ports[0] == spec.health.port, spec.name
            assert listening_ports(spec.name, COMPOSE.ports)[0] == getattr(COMPOSE.ports, spec.health.port)


def test_scripts_start_the_defined_services() -> None:
    started = {}
    for path in INFRA.glob("*.sh"):
        for name in re.findall(r"python3 -m runtime\.services run (\S+)", path.read_text()):
            started[name] = path.name
    assert set(started) <= set(SPECS), started
    assert set(started) == set(SPECS) - {"mlflow"}, started  # MLflow by hand: `wikirag services up` or compose
    for path in INFRA.glob("*.sh"):  # no engine started by a command line of its own
        assert not re.search(r"^\s*(exec\s+)?(weed|mlflow|dask|prefect (server|worker))\b", path.read_text(), re.M), \
            path.name


def test_addresses_name_a_service_that_serves_them() -> None:
    compose = _compose()["services"]
    services = {d["metadata"]["name"]: [p["port"] for p in d["spec"]["ports"]] for d in _k8s_docs()
                if d["kind"] == "Service"}
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
    assert f"create secret generic {TLS_SECRET} --from-file=" in operations, f"docs/operations.md: {TLS_SECRET}"
    for doc in _k8s_docs():
        for volume in _template(doc).get("spec", {}).get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] == TLS_SECRET, f"{doc['_file']}: secret volume {volume}"
        if doc["kind"] == "ConfigMap":
            assert not SENSITIVE.search(json.dumps(doc["data"]).upper().replace("-", "_")), doc["_file"]


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
    # The same value as the local cluster's and the services' workers (runtime/local_cluster.py)
    for var, value in NANNY_ENVIRONMENT.items():
        assert f'{var}="{value}"' in (INFRA / "Dockerfile").read_text(), f"infra/Dockerfile: set {var}"
        assert f'export {var}="{value}"' in (INFRA / "env.sh").read_text(), f"infra/env.sh: export {var}"


@pytest.mark.parametrize("script", sorted(p.name for p in INFRA.glob("*.sh")))
def test_scripts_bind_loopback(script: str) -> None:
    text = (INFRA / script).read_text()
    assert "0.0.0.0" not in text
    assert "env.sh" in text or script == "env.sh"


# -- every pod unprivileged, bounded, and on the network only where a policy lets it --------------------------
def test_every_pod_runs_as_a_user_without_privilege_escalation_and_with_limits() -> None:
    assert _workloads(), "no workloads found"
    for app, doc in _workloads().items():
        pod = _template(doc)["spec"]
        assert pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{app}: runAsNonRoot"
        for container in _containers(doc):
            where = f"{doc['_file']}: {app}/{container['name']}"
            assert container.get("securityContext", {}).get("allowPrivilegeEscalation") is False, where
            assert "ALL" in container["securityContext"].get("capabilities", {}).get("drop", []), where
            limits = container.get("resources", {}).get("limits", {})
            assert {"cpu", "memory"} <= set(limits), f"{where}: limits {limits}"


def _policies() -> list[dict]:
    return [d for d in _k8s_docs() if d["kind"] == "NetworkPolicy"]


def _policy_of(app: str) -> dict:
    mine = [p for p in _policies() if p["spec"]["podSelector"].get("matchLabels", {}).get("app") == app]
    assert len(mine) == 1, f"{app}: {len(mine)} NetworkPolicies select it, expected one"
    return mine[0]["spec"]


def _allows(rules: list[dict], peers_key: str, app: str, port: int) -> bool:
    for rule in rules:
        apps = {p.get("podSelector", {}).get("matchLabels", {}).get("app") for p in rule.get(peers_key, [])}
        ports = {p["port"] for p in rule.get("ports", [])}
        if app in apps and (not ports or port in ports):
            return True
    return False


def test_network_policies_deny_by_default_and_allow_each_address_a_pod_is_given_both_ways() -> None:
    deny = [p["spec"] for p in _policies() if p["spec"]["podSelector"] == {}
            and set(p["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}]
    assert deny and not deny[0].get("ingress") and not deny[0].get("egress"), "a default deny for every pod"
    services = {d["metadata"]["name"]: d["spec"]["selector"]["app"] for d in _k8s_docs() if d["kind"] == "Service"}
    workloads = _workloads()
    checked = 0
    for app, doc in workloads.items():
        policy = _policy_of(app)  # every component has its own
        assert set(policy["policyTypes"]) == {"Ingress", "Egress"}, app
        for container in _containers(doc):
            targets = [entry["value"] for var, entry in _k8s_env(container).items() if var in FLOW_VARS]
            targets += [arg for arg in container.get("command", []) if arg.startswith(("tls://", "tcp://"))]
            for value in targets:
                url = urlparse(value)
                target = services[url.hostname]
                assert _allows(policy.get("egress", []), "to", target, url.port), f"{app} may not reach {value}"
                assert _allows(_policy_of(target).get("ingress", []), "from", app, url.port), \
                    f"{target} does not accept {app} on {url.port}"
                checked += 1
    assert checked >= 11, checked  # the worker, MLflow, the bucket job, the Dask workers, training
    # nothing is open to every pod: each ingress rule names its peers
    for policy in _policies():
        for rule in policy["spec"].get("ingress", []):
            assert rule.get("from"), f"{policy['metadata']['name']}: an ingress rule without peers"


def test_prefects_database_and_mlflows_users_live_on_persistent_volumes() -> None:
    claims = {d["metadata"]["name"] for d in _k8s_docs() if d["kind"] == "PersistentVolumeClaim"}
    workloads = _workloads()
    for app, var in (("prefect-server", "PREFECT_HOME"), ("mlflow", None)):
        pod = _template(workloads[app])["spec"]
        container = pod["containers"][0]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        persistent = {m["mountPath"] for m in container.get("volumeMounts", [])
                      if volumes.get(m["name"], {}).get("persistentVolumeClaim", {}).get("claimName") in claims}
        wanted = _k8s_env(container)[var]["value"] if var else "/var/lib/wikirag/mlflow-auth"
        assert wanted in persistent, f"{app}: {wanted} is not on a PersistentVolumeClaim ({persistent})"
        assert workloads[app]["spec"].get("strategy", {}).get("type") == "Recreate", f"{app}: one pod per volume"


# -- every engine asks for credentials, in Kubernetes and compose alike ----------------------------------
def test_kubernetes_engines_ask_for_credentials() -> None:
    workloads = _workloads()
    users_of: dict[str, set[str]] = {}
    for app, doc in workloads.items():
        for container in _containers(doc):
            env = _k8s_env(container)
            for entry in env.values():
                if _secret(entry):
                    users_of.setdefault(_secret(entry)[0], set()).add(app)
            if "PREFECT_API_URL" in env:
                assert _secret(env["PREFECT_API_AUTH_STRING"]) == ("wikirag-prefect", "auth-string"), app
            if "MLFLOW_TRACKING_URI" in env:
                assert _secret(env["MLFLOW_TRACKING_PASSWORD"]) == ("wikirag-mlflow", "password"), app
                assert _secret(env["MLFLOW_TRACKING_USERNAME"]) == ("wikirag-mlflow", "username"), app
            if "WIKIRAG_DASK_ADDRESS" in env:
                assert env["WIKIRAG_DASK_ADDRESS"]["value"].startswith("tls://"), app
                mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
                for var in ("CA_FILE", "CLIENT__CERT", "CLIENT__KEY"):
                    path = env[f"DASK_DISTRIBUTED__COMM__TLS__{var}"]["value"]
                    assert any(path.startswith(m + "/") for m in mounts), f"{app}: {path} is not mounted"
    server = _k8s_env(workloads["prefect-server"]["spec"]["template"]["spec"]["containers"][0])
    assert _secret(server["PREFECT_SERVER_API_AUTH_STRING"]) == ("wikirag-prefect", "auth-string")
    mlflow = workloads["mlflow"]["spec"]["template"]["spec"]["containers"][0]
    assert "basic-auth" in mlflow["command"][mlflow["command"].index("--app-name") + 1]
    env = _k8s_env(mlflow)
    assert _secret(env["MLFLOW_AUTH_ADMIN_PASSWORD"]) == ("wikirag-mlflow", "password")
    # the artifacts' identity: the MLflow server's alone (and SeaweedFS's, which holds it, and the bucket job)
    assert _secret(env["AWS_ACCESS_KEY_ID"]) == ("wikirag-mlflow-s3", "access-key-id")
    assert users_of["wikirag-mlflow-s3"] == {"mlflow", "s3", "s3-buckets"}, users_of["wikirag-mlflow-s3"]
    assert "mlflow" not in users_of["wikirag-s3"]
    for app in ("dask-scheduler", "dask-worker"):
        container = workloads[app]["spec"]["template"]["spec"]["containers"][0]
        _assert_dask_tls(app, container["command"], {k: e.get("value") for k, e in _k8s_env(container).items()})


def _assert_dask_tls(where: str, command: list[str], env: dict) -> None:
    assert command[command.index("--protocol") + 1] == "tls", where
    for option in ("--tls-ca-file", "--tls-cert", "--tls-key"):
        assert option in command, f"{where}: {option}"
    assert not [a for a in command if a.startswith("tcp://")], where
    assert env.get("DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION") == "True", where


def test_compose_engines_ask_for_credentials() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        env = service.get("environment") or {}
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        if "PREFECT_API_URL" in env:
            assert env.get("PREFECT_API_AUTH_STRING", "").startswith("${PREFECT_API_AUTH_STRING:?"), name
        if "MLFLOW_TRACKING_URI" in env:
            assert env.get("MLFLOW_TRACKING_PASSWORD", "").startswith("${MLFLOW_TRACKING_PASSWORD:?"), name
        if "WIKIRAG_DASK_ADDRESS" in env:
            assert env["WIKIRAG_DASK_ADDRESS"].startswith("tls://"), name
            assert "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY" in env, name
        uses_artifacts_identity = any("WIKIRAG_MLFLOW_S3" in str(v) for v in env.values())
        assert uses_artifacts_identity == (name in ("s3", "s3-init", "mlflow")), name
    server = services["prefect-server"]["environment"]
    assert server["PREFECT_SERVER_API_AUTH_STRING"].startswith("${PREFECT_API_AUTH_STRING:?")
    mlflow = services["mlflow"]
    assert mlflow["command"][mlflow["command"].index("--app-name") + 1] == "basic-auth"
    assert mlflow["environment"]["AWS_ACCESS_KEY_ID"].startswith("${WIKIRAG_MLFLOW_S3_KEY:?")
    assert mlflow["environment"]["MLFLOW_AUTH_ADMIN_PASSWORD"].startswith("${MLFLOW_TRACKING_PASSWORD:?")
    assert "password" not in _compose()["configs"]["mlflow-auth"]["content"].replace("default_permission", "")
    for name in ("dask-scheduler", "dask-worker"):
        _assert_dask_tls(f"compose {name}", services[name]["command"], services[name]["environment"])
    assert services["s3"]["command"][:4] == ["python", "-m", "runtime.services", "seaweedfs"]


def test_the_image_holds_every_package() -> None:
    dockerfile = (INFRA / "Dockerfile").read_text()
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in (p.rstrip("*") for p in include):
        if (ROOT / package / "__init__.py").is_file():
            assert f"COPY {package} {package}" in dockerfile, f"infra/Dockerfile: COPY {package} {package}"


def _python_modules(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-m"]


def test_every_python_module_a_manifest_runs_is_a_command_and_the_training_recipe_is_a_train_config() -> None:
    """A `-m MODULE` in a container's command must be a module that runs as a program (it once named the recipe's
    library module, which has no main), and the training Job's recipe must validate before a pod is scheduled."""
    import importlib.util

    from rag_core.train.train_config import TrainConfig

    commands = [c.get("command", []) + c.get("args", []) for doc in _k8s_docs() for c in _containers(doc)]
    commands += [s["command"] for s in _compose()["services"].values() if isinstance(s.get("command"), list)]
    modules = {m for argv in commands for m in _python_modules(argv)}
    assert "tasks.adapters.torchrun_launcher" in modules
    for module in modules:
        found = importlib.util.find_spec(module)
        assert found is not None and found.origin, f"{module}: no such module"
        main = (Path(found.origin).with_name("__main__.py") if found.submodule_search_locations
                else Path(found.origin))
        runs = main.exists() and (main.name == "__main__.py" or 'if __name__ == "__main__"' in main.read_text())
        assert runs, f"{module}: runs nothing as a program"
    recipes = [doc for doc in _k8s_docs() if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] ==
               "wikirag-train-recipe"]
    assert len(recipes) == 1
    config = TrainConfig.model_validate_json(recipes[0]["data"]["train.json"])
    assert config.task == "nq" and config.output == "runs/nq"
