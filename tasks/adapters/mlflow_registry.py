"""The MLflow Model Registry for wikirag: a RAG model logged as data with its index binding, and the promotion gate.

A trained model becomes a version of ``wikirag-<task>``: an MLflow model of wikirag's own
flavor (tasks/adapters/mlflow_flavor.py: the saved RAG model, its index binding and the sha256 of
every file; loading runs the installed code only). The sha256 of its checksums.json is a tag
of the logged model and of the registered version, outside the artifact store.

The index version a model reads is pinned in the store before the version is registered:
first under the logged model's id (``mlflow:wikirag-<task>/m-<id>``: the version number does
not exist yet), then, once registered, under ``mlflow:wikirag-<task>/<n>``, and the first pin
goes. A failed pin leaves no registered version, and no registered version reads an index
nobody holds; the version's ``index_pin`` tag names the pin that holds it.

The promotion gate moves the alias ``champion`` to the new version only when
its headline dev metric beats the current champion's by ``margin`` (or there
is no champion yet) and, when a zero-shot baseline is given, beats that too
(given the answers gained and lost against it, by more than chance);
otherwise the new version gets ``challenger``. The
decision, with its numbers, is written to the version's tags and to the
training run.

A refresh (tasks/refresh.py) registers the champion again, logged with a binding to a newer
index, through the same pin-first path and makes it champion (:func:`register_rebound`). A
version that took the alias from a champion names it in ``previous_champion``;
:func:`rollback` moves the alias back there once it finds that version's index still pinned.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from rag_core.errors import WikiragError
from rag_core.evaluate.paired import CHANCE, beyond_chance, sign_test
from rag_core.index.retention import pin_version, unpin_version, version_pins
from rag_core.storage import Store
from tasks.adapters.mlflow_flavor import CHECKSUMS_TAG, FLAVOR_MODULE, ArtifactWriter, logged_model_id
from tasks.adapters.mlflow_tracking import check_reachable
from tasks.adapters.model_checksums import ModelArtifactError

CHAMPION, CHALLENGER = "champion", "challenger"
PREVIOUS_TAG = "previous_champion"  # the champion a version replaced: what a rollback returns to
REFRESHED_FROM_TAG = "refreshed_from"  # the version a refresh logged again, bound to a newer index


def model_name(task: str) -> str:
    return f"wikirag-{task}"


def alias_now(client: MlflowClient, name: str, version: str | int) -> str:
    """The alias ``name`` version ``version`` holds now, champion first; "none" without one. (A model version
    from ``search_model_versions`` carries no aliases: MLflow fills them in ``get_model_version`` only.)"""
    aliases = client.get_model_version(name, str(version)).aliases
    return CHAMPION if CHAMPION in aliases else (sorted(aliases)[0] if aliases else "none")


def pin_name(name: str, version: str | int) -> str:
    """Who holds an index version pinned for version ``version`` of ``name`` (or, while it is being registered,
    for the logged model ``m-<id>`` it is registered from)."""
    return f"mlflow:{name}/{version}"


@dataclass(frozen=True)
class Promotion:
    """What the gate decided, and why, with its numbers."""

    name: str
    version: str
    alias: str  # champion or challenger
    metric: str
    value: float
    champion_version: str | None
    champion_value: float | None
    margin: float
    index_version: str
    reason: str


@contextlib.contextmanager
def _tracking(uri: str) -> Iterator[None]:
    """MLflow's fluent API (log_model, register_model) against ``uri``, restoring the process's URI after.

    ``set_tracking_uri`` also exports ``MLFLOW_TRACKING_URI``, and ``get_tracking_uri`` answers a default (a
    ``mlflow.db`` in the working directory) when none is set: setting that answer back would pin every later
    command of the process, and its children, to that database instead of the one its settings name. So the
    process-wide URI is cleared and the variable put back as it was."""
    exported = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # clears the URI and the variable it exported
        if exported is not None:
            os.environ["MLFLOW_TRACKING_URI"] = exported


def log_rag_model(tracking_uri: str, run_id: str, model_dir: str | Path, *, store_url: str, index_version: str,
                  n_docs: int | None = None) -> str:
    """Log a saved RAG model as a wikirag-flavored model of run ``run_id``, bound to ``index_version``; its URI.

    The sha256 of the artifact's checksums.json becomes the logged model's ``CHECKSUMS_TAG`` tag."""
    check_reachable(tracking_uri)
    writer = ArtifactWriter(model_dir, {"store": store_url, "index_version": index_version, "n_docs": n_docs})
    with _tracking(tracking_uri), mlflow.start_run(run_id=run_id):  # the run's experiment holds the model
        info = mlflow.models.Model.log(None, name="model", flavor=writer, flavor_name=FLAVOR_MODULE, run_id=run_id,
                                       params={"index_version": index_version})
    digest = str(writer.digest)
    client = MlflowClient(tracking_uri=tracking_uri)
    client.set_logged_model_tags(info.model_id, {CHECKSUMS_TAG: digest})
    client.set_tag(run_id, CHECKSUMS_TAG, digest)
    return info.model_uri


def _champion(client: MlflowClient, name: str) -> tuple[str | None, float | None]:
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None, None
    value = champion.tags.get("dev_metric_value")
    return str(champion.version), (float(value) if value is not None else None)


def gate(name: str, metric: str, value: float, margin: float, champion_version: str | None,
         champion_value: float | None, baseline: float | None = None,
         changed: tuple[int, int] | None = None) -> tuple[str, str]:
    """``(alias, reason)`` for a new version of ``name`` scoring ``value``: champion when it beats its zero-shot
    ``baseline`` (when given; strictly; with ``changed``, its answers gained and lost against it question by
    question, by more than chance: rag_core.evaluate.paired.beyond_chance) and the current champion's value by
    ``margin`` (or there is none), else challenger. A change to the rule raises tasks.finetune.GATE_RULE and
    tasks.qa_gate.RULE (rerun versions are then placed anew)."""
    if baseline is not None and value <= baseline:
        return CHALLENGER, (f"{metric} {value:.4f} does not beat its zero-shot start's {baseline:.4f}: "
                            "kept as challenger")
    if baseline is not None and changed is not None and not beyond_chance(*changed):
        gained, lost = changed
        return CHALLENGER, (f"{metric} {value:.4f} is above its zero-shot start's {baseline:.4f} by {gained} answers "
                            f"gained and {lost} lost, within chance (two-sided sign test p = "
                            f"{sign_test(gained, lost):.3f}, promotion needs < {CHANCE}): kept as challenger")
    if champion_version is None or champion_value is None:
        return CHAMPION, f"first {name} version with a {metric}: champion"
    if value >= champion_value + margin:
        return CHAMPION, (f"{metric} {value:.4f} >= champion v{champion_version}'s {champion_value:.4f} "
                          f"+ margin {margin}: promoted")
    return CHALLENGER, (f"{metric} {value:.4f} < champion v{champion_version}'s {champion_value:.4f} "
                        f"+ margin {margin}: kept as challenger")


def register(tracking_uri: str, model_uri: str, task: str, *, run_id: str, metric: str, value: float,
             margin: float, store: Store, index_version: str, baseline: float | None = None,
             changed: tuple[int, int] | None = None) -> Promotion:
    """Pin ``index_version`` for ``model_uri`` (a logged wikirag model), register it as a new version of
    ``wikirag-<task>`` carrying its checksum anchor, and gate its promotion (:func:`gate`; ``baseline``: the
    zero-shot start's ``metric``, to beat; ``changed``: answers gained and lost against it); a failed pin registers
    nothing."""
    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    name = model_name(task)
    version = _register_pinned(client, tracking_uri, model_uri, name, store, index_version)
    champion_version, champion_value = _champion(client, name)
    alias, reason = gate(name, metric, value, margin, champion_version, champion_value, baseline, changed)
    promotion = Promotion(name, version, alias, metric, value, champion_version, champion_value, margin,
                          index_version, reason)
    _record(client, promotion, store, run_id)
    return promotion


def _register_pinned(client: MlflowClient, tracking_uri: str, model_uri: str, name: str, store: Store,
                     index_version: str) -> str:
    """Pin ``index_version`` for the logged model ``model_uri``, register it as a new version of ``name`` carrying
    its checksum anchor, and move the pin to the version's own name; its version number (module docstring)."""
    model_id = logged_model_id(model_uri)
    anchor = client.get_logged_model(model_id).tags.get(CHECKSUMS_TAG) if model_id else None
    if not anchor:
        raise ModelArtifactError(f"{model_uri}: not a model logged by tasks.adapters.mlflow_registry.log_rag_model (no "
                                 f"{CHECKSUMS_TAG} tag); log it with wikirag, then register the URI it returns")
    pending = pin_name(name, model_id)  # the version number does not exist yet
    held = pending in version_pins(store, index_version)  # left by an earlier attempt a version may rely on
    pin_version(store, index_version, pending, note=f"{model_uri}, being registered as {name}")
    try:
        with _tracking(tracking_uri):
            version = mlflow.register_model(model_uri, name, tags={CHECKSUMS_TAG: anchor, "index_pin": pending}).version
    except BaseException:
        if not held:  # nothing registered: the pin would hold nothing
            unpin_version(store, index_version, pending)
        raise
    # the pin under the version's own name; should this fail, the pending pin (named by index_pin) still holds
    pin_version(store, index_version, pin_name(name, version), note=f"registered model {name} version {version}")
    client.set_model_version_tag(name, str(version), "index_pin", pin_name(name, version))
    if not held:
        unpin_version(store, index_version, pending)
    return str(version)


def _record(client: MlflowClient, promotion: Promotion, store: Store, run_id: str,
            extra_tags: dict[str, str] | None = None) -> None:
    """The decision on the version's tags and in run ``run_id``, then the alias moved; a version promoted over a
    champion names it in ``PREVIOUS_TAG`` (what :func:`rollback` returns to)."""
    name, version = promotion.name, promotion.version
    tags = {"dev_metric": promotion.metric, "dev_metric_value": f"{promotion.value:.6f}",
            "index_version": promotion.index_version, "store": store.url, "promotion": promotion.reason,
            "run_id": run_id, **(extra_tags or {})}
    if promotion.alias == CHAMPION and promotion.champion_version is not None:
        tags[PREVIOUS_TAG] = promotion.champion_version
    for key, tag in tags.items():
        client.set_model_version_tag(name, version, key, tag)
    client.set_registered_model_alias(name, promotion.alias, version)
    client.log_dict(run_id, asdict(promotion), "promotion.json")
    client.set_tag(run_id, "promotion", f"{name} v{version} -> {promotion.alias}: {promotion.reason}")


def register_rebound(tracking_uri: str, model_uri: str, name: str, *, run_id: str, metric: str, value: float,
                     store: Store, index_version: str, source_version: str, reason: str) -> Promotion:
    """Register ``model_uri`` (version ``source_version`` of ``name`` logged again, bound to ``index_version``) as
    a new version of ``name``, pinned first (:func:`register`), and make it champion: a refresh already decided
    (tasks/refresh.py), for ``reason``."""
    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    version = _register_pinned(client, tracking_uri, model_uri, name, store, index_version)
    champion_version, champion_value = _champion(client, name)
    promotion = Promotion(name, version, CHAMPION, metric, value, champion_version, champion_value, 0.0,
                          index_version, reason)
    _record(client, promotion, store, run_id, {REFRESHED_FROM_TAG: source_version})
    return promotion


class RollbackError(WikiragError):
    """A rollback the registry cannot make (no champion, no earlier version, its index no longer pinned)."""


@dataclass(frozen=True)
class Rollback:
    name: str
    from_version: str
    to_version: str
    index_version: str


def registered_versions(tracking_uri: str, name: str | None = None) -> list[dict[str, Any]]:
    """Every version of each ``wikirag-*`` registered model (or of ``name``), by model name then version: its
    aliases, the metric its gate judged, its index binding and the gate's reason, all from tags (text: nothing
    read here runs)."""
    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    models, token = [], None
    while True:  # every page: a registry may hold more models than one answer carries
        page = client.search_registered_models(filter_string=f"name = '{name}'" if name and "'" not in name
                                               else None, page_token=token)
        models += [m for m in page if m.name.startswith(model_name("")) and (name is None or m.name == name)]
        if not (token := page.token):
            break
    rows = []
    for model in sorted(models, key=lambda m: m.name):
        aliases: dict[str, list[str]] = {}
        for alias, version in (model.aliases or {}).items():
            aliases.setdefault(str(version), []).append(alias)
        for version in sorted(client.search_model_versions(f"name='{model.name}'"), key=lambda v: int(v.version)):
            tags = version.tags
            rows.append({"name": model.name, "version": str(version.version),
                         "aliases": sorted(aliases.get(str(version.version), [])), "metric": tags.get("dev_metric"),
                         "value": _number(tags.get("dev_metric_value")),
                         "index_version": tags.get("index_version"), "promotion": tags.get("promotion")})
    return rows


def _number(tag: str | None) -> float | None:
    """A tag's number, or None where it is absent or not one (a tag is text anyone with access can set)."""
    try:
        return float(tag) if tag is not None else None
    except ValueError:
        return None


def rollback(tracking_uri: str, name: str, open_store: Callable[[str], Store]) -> Rollback:
    """Move ``name``'s champion alias back to the version it replaced (its ``PREVIOUS_TAG``, else the highest
    version below it), once that version's index is found still pinned for it; ``open_store`` opens a version's
    ``store`` tag."""
    check_reachable(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        raise RollbackError(f"{name}: no {CHAMPION} in MLflow at {tracking_uri}; check the name "
                            "(registered models are wikirag-<task>)") from None
    earlier = [int(v.version) for v in client.search_model_versions(f"name='{name}'")
               if int(v.version) < int(champion.version)]
    previous = champion.tags.get(PREVIOUS_TAG) or (str(max(earlier)) if earlier else None)
    if previous is None:
        raise RollbackError(f"{name}: v{champion.version} is its first version; there is nothing to roll back to")
    target = client.get_model_version(name, previous)
    index_version, pin = target.tags.get("index_version"), target.tags.get("index_pin")
    if not index_version or not target.tags.get("store") or \
            pin not in version_pins(open_store(target.tags["store"]), index_version):
        raise RollbackError(f"{name} v{previous}: its index {index_version} is no longer pinned by {pin!r}; refused "
                            f"(it could read an index that is gone): register the model again with wikirag")
    client.set_registered_model_alias(name, CHAMPION, previous)
    client.set_model_version_tag(name, str(champion.version), "rolled_back", f"{CHAMPION} moved back to v{previous}")
    return Rollback(name, str(champion.version), previous, index_version)
