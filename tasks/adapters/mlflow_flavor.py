"""wikirag's MLflow model flavor: a registered model is data (weights, config, checksums) read by installed code.

The artifact of a logged ``wikirag-<task>`` model::

    MLmodel              pyfunc flavor: loader_module tasks.adapters.mlflow_flavor, data "data", no code
    requirements.txt  python_env.yaml  conda.yaml
    data/rag_model/      RagModel.save_pretrained: question_encoder/, generator/ (safetensors, JSON), rag.json
    data/binding.json    {"store", "index_version", "n_docs"}: the index the model retrieves from
    checksums.json       {"sha256": {path: digest}} of every other file of the artifact

The sha256 of ``checksums.json`` is the anchor, kept outside the artifact store: a tag
(``CHECKSUMS_TAG``) of the logged model and of each registered version. Nothing in the
artifact is imported, unpickled or executed: weights are safetensors, everything else is
JSON or text, and data/ may hold no other kind of file.

Two ways in:

- :func:`load_registered` (wikirag's loaders: ``ask --model``, ``evaluate``, the pipeline)
  resolves the URI to one model version, downloads its files, reads MLmodel as YAML data and
  refuses any loader but this module, checks the anchor, then every file (changed, missing or
  added), and builds the model with :meth:`RagModel.from_pretrained`. It never calls
  ``mlflow.pyfunc.load_model``.
- :func:`_load_pyfunc` (``mlflow.pyfunc.load_model``, ``mlflow models serve``): MLflow has read
  MLmodel and imported this installed module; every file is checked against checksums.json
  (the anchor is out of reach there) before the model is built.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rag_core.errors import WikiragError
from rag_core.model.answers import MAX_NEW_TOKENS
from tasks.adapters.model_checksums import ModelArtifactError, check_files, write_checksums

FLAVOR_MODULE = __name__  # what MLmodel must name as the pyfunc loader_module
DATA_DIR, RAG_DIR, BINDING = "data", "rag_model", "binding.json"
CHECKSUMS_TAG = "wikirag.checksums_sha256"
# The one file MLflow adds to a model's folder as it loads it (the name and version it loaded), at the root; YAML
# that no wikirag loader reads.
MLFLOW_WRITES = "registered_model_meta"
# The pyfunc settings a wikirag model has (what save_model writes); any other (a code folder, a models-from-code
# file, artifacts) would make MLflow run something from the artifact
_FLAVOR_KEYS = frozenset({"loader_module", "data", "env", "python_version", "config"})
MAX_NEW_TOKENS_CAP = 256  # answer tokens one request may ask for: generation time grows with it, per question
# Consumers load the model where wikirag is installed (`pip install -e .`; `mlflow models serve --env-manager
# local`): wikirag is no PyPI package, so these are the pins its code needs beside it.
PIP_REQUIREMENTS = ["torch==2.13.0", "transformers>=5.24,<5.25", "faiss-cpu>=1.15,<1.16"]


class ModelInputError(WikiragError):
    """A prediction request the model refuses (its parameters are out of bounds)."""


# -- saving ------------------------------------------------------------------------------------
class ArtifactWriter:
    """The flavor ``mlflow.models.Model.log`` saves with: writes the artifact (module docstring) into its folder
    and keeps the sha256 of its checksums.json in ``digest``, for the caller to record outside the artifact."""

    def __init__(self, model_dir: str | Path, binding: dict[str, Any]) -> None:
        self.model_dir = Path(model_dir)
        self.binding = {k: v if v is None or isinstance(v, int) else str(v) for k, v in binding.items()}  # YAML-safe
        self.digest: str | None = None

    def save_model(self, path: str, mlflow_model: Any) -> None:
        import shutil

        from mlflow.models.signature import ModelSignature
        from mlflow.pyfunc import add_to_model
        from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
        from mlflow.utils.environment import _mlflow_conda_env, _process_pip_requirements, _PythonEnv

        root = Path(path)
        shutil.copytree(self.model_dir, root / DATA_DIR / RAG_DIR)
        (root / DATA_DIR / BINDING).write_text(json.dumps(self.binding, indent=1, sort_keys=True))
        conda_env, requirements, _ = _process_pip_requirements(_mlflow_conda_env(),
                                                               pip_requirements=PIP_REQUIREMENTS)
        (root / "conda.yaml").write_text(yaml.safe_dump(conda_env, default_flow_style=False))
        (root / "requirements.txt").write_text("\n".join(requirements))
        _PythonEnv.current().to_yaml(str(root / "python_env.yaml"))
        mlflow_model.signature = ModelSignature(
            inputs=Schema([ColSpec("string")]),  # questions: a list, or a DataFrame whose "question" column is taken
            params=ParamSchema([ParamSpec("max_new_tokens", "long", MAX_NEW_TOKENS)]))
        # model_config lists what a consumer may override when loading (another index version: a knowledge update)
        add_to_model(mlflow_model, loader_module=FLAVOR_MODULE, data=DATA_DIR, conda_env="conda.yaml",
                     python_env="python_env.yaml", model_config={"index_version": self.binding["index_version"]})
        mlflow_model.save(str(root / "MLmodel"))
        self.digest = write_checksums(root)


# -- loading -----------------------------------------------------------------------------------
class RagPredictor:
    """What a pyfunc model wraps: ``predict`` over the RagModel ``model``."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def predict(self, model_input, params=None):  # no type hints: MLflow would read them as a schema
        """Questions (a list of strings, or a DataFrame with a ``question`` column) -> one record each:
        ``{"question", "answer", "provenance": [{"passage_id", "title", "score", "similarity"}, ...]}``
        (rag_core.model.answers)."""
        from rag_core.model.answers import answer, too_long

        if hasattr(model_input, "columns"):  # a DataFrame (what `mlflow models serve` hands over)
            column = "question" if "question" in model_input.columns else model_input.columns[0]
            questions = [str(q) for q in model_input[column].tolist()]
        elif isinstance(model_input, str):
            questions = [model_input]
        else:
            questions = [str(q) for q in model_input]
        blank = [i for i, q in enumerate(questions) if not q.strip()]
        if blank:  # `wikirag ask` refuses them too: an empty question retrieves arbitrary passages
            raise ModelInputError(f"question {blank[0] + 1} of {len(questions)} is empty; give each question as text")
        refusal = next((refusal for i, q in enumerate(questions)
                        if (refusal := too_long(f"question {i + 1} of {len(questions)}", q))), None)
        if refusal:
            raise ModelInputError(refusal)
        asked = (params or {}).get("max_new_tokens", MAX_NEW_TOKENS)
        if not isinstance(asked, numbers.Integral) or isinstance(asked, bool) or not 1 <= asked <= MAX_NEW_TOKENS_CAP:
            raise ModelInputError(f"max_new_tokens {asked!r}: give a whole number from 1 to {MAX_NEW_TOKENS_CAP} "
                                  "(answer tokens per question)")
        max_new_tokens = int(asked)
        return answer(self.model, questions, max_new_tokens=max_new_tokens)


def check_mlmodel(root: Path, where: str) -> None:
    """MLmodel read as data: its pyfunc flavor must be this module's, with no code folder and data in DATA_DIR."""
    file = root / "MLmodel"
    try:
        spec = yaml.safe_load(file.read_text())
        pyfunc = spec["flavors"]["python_function"]
        found = pyfunc.get("loader_module")
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        raise ModelArtifactError(f"{where}/MLmodel: missing or not an MLmodel with a python_function flavor; "
                                 "log the model with wikirag (tasks.adapters.mlflow_registry.log_rag_model)") from None
    if found != FLAVOR_MODULE:
        raise ModelArtifactError(f"{where}/MLmodel: loader_module is {found!r}, not {FLAVOR_MODULE!r}; refused "
                                 "(its code would run): load only models logged by wikirag")
    extra = sorted(set(pyfunc) - _FLAVOR_KEYS)
    if extra or pyfunc.get("data") != DATA_DIR:
        raise ModelArtifactError(f"{where}/MLmodel: the {FLAVOR_MODULE} flavor names {extra or pyfunc.get('data')!r}"
                                 f"; refused: a wikirag model carries data in {DATA_DIR!r} and no code")


def build(data: Path, where: str, index_version: str | None = None) -> Any:
    """The RagModel saved under ``data``, bound to its index (``index_version`` overrides the version)."""
    from runtime.settings import Settings  # the edge: the store's credentials come from this process's settings
    from rag_core.model.rag_model import RagModel
    from rag_core.model.retriever import IndexRetriever

    try:
        binding = json.loads((data / BINDING).read_text())
        store_url, version = str(binding["store"]), binding.get("index_version")
    except (OSError, ValueError, KeyError, TypeError):
        raise ModelArtifactError(f"{where}/{DATA_DIR}/{BINDING}: missing or not a binding "
                                 '{"store", "index_version", "n_docs"}; log the model again') from None
    retriever = IndexRetriever.load(Settings().open_store(store_url), index_version or version)
    overrides = {"n_docs": int(binding["n_docs"])} if binding.get("n_docs") else None
    return RagModel.from_pretrained(data / RAG_DIR, retriever, overrides)


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> RagPredictor:
    """MLflow's entry point (MLmodel's loader_module): the files checked against checksums.json, then built."""
    root = Path(data_path).parent
    check_mlmodel(root, str(root))
    check_files(root, str(root), ignore={MLFLOW_WRITES})  # MLflow's download writes it, on this side
    return RagPredictor(build(Path(data_path), str(root), (model_config or {}).get("index_version")))


def load_registered(model_uri: str, tracking_uri: str, index_version: str | None = None) -> Any:
    """The RagModel of ``models:/NAME@ALIAS``, ``models:/NAME/VERSION`` or ``models:/m-ID``, checked and built
    by installed code (module docstring); ``index_version`` overrides the version it is bound to."""
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        where, anchor, model_id = _resolve(client, model_uri)
        location = client.get_logged_model(model_id).artifact_location if model_id else None
    except MlflowException as exc:
        raise ModelArtifactError(f"{model_uri}: not found in MLflow at {tracking_uri} "
                                 f"({str(exc).splitlines()[0][:200]}); {_registered_as(client, model_uri)}") from None
    if not anchor or not location:
        raise ModelArtifactError(f"{where}: no {CHECKSUMS_TAG} tag or no logged model, so its files cannot be "
                                 "checked; refused: register models with wikirag "
                                 "(tasks.adapters.mlflow_registry.register)")
    with tempfile.TemporaryDirectory(prefix="wikirag-model-") as tmp, _no_progress_bar():
        # the logged model's own files. MLflow's pyfunc loader (and `mlflow models serve`) writes its
        # registered_model_meta into them when they are on a local disk: never read here, so not refused
        root = Path(download_artifacts(artifact_uri=location, dst_path=tmp, tracking_uri=tracking_uri))
        check_mlmodel(root, where)
        check_files(root, where, anchor=(anchor, f"the {CHECKSUMS_TAG} tag of {where}"), ignore={MLFLOW_WRITES})
        return build(root / DATA_DIR, where, index_version)


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """MLflow's download bar (a line per file on stderr) off: a refusal must stay one line."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    previous = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def _resolve(client: Any, model_uri: str) -> tuple[str, str | None, str | None]:
    """(exactly one model version or logged model, as a URI; the anchor recorded for it; its logged model's id)."""
    path = model_uri.removeprefix("models:/")
    name, sep, rest = path.partition("@") if "@" in path else path.partition("/")
    if not model_uri.startswith("models:/") or not name or "/" in rest or "@" in rest or (sep and not rest) or \
            (sep == "/" and not rest.isdigit()) or (not sep and not name.startswith("m-")):
        raise ModelArtifactError(f"{model_uri}: give models:/NAME@ALIAS, models:/NAME/VERSION or models:/m-ID")
    if not sep:
        logged = client.get_logged_model(name)
        return f"models:/{logged.model_id}", logged.tags.get(CHECKSUMS_TAG), logged.model_id
    version = client.get_model_version_by_alias(name, rest) if sep == "@" else client.get_model_version(name, rest)
    return (f"models:/{version.name}/{version.version}", version.tags.get(CHECKSUMS_TAG),
            version.model_id or logged_model_id(version.source or ""))


def _registered_as(client: Any, model_uri: str) -> str:
    """What the registry holds under ``model_uri``'s name, for a lookup that failed: its versions and their
    aliases (a first run's model can be challenger only), or the names it has."""
    from mlflow.exceptions import MlflowException

    name = model_uri.removeprefix("models:/").partition("@")[0].partition("/")[0]
    try:
        try:
            aliases = client.get_registered_model(name).aliases if name and "'" not in name else None
        except MlflowException:
            aliases = None
        if aliases is not None:
            versions = sorted({int(v.version) for v in client.search_model_versions(f"name = '{name}'")})
            if not versions:
                return f"{name} has no version yet"
            held = ", ".join(f"@{alias} = v{version}" for alias, version in sorted(aliases.items())) or "none"
            span = f"v{versions[0]}" if len(versions) == 1 else f"v{versions[0]} to v{versions[-1]}"
            return f"{name} has {span}, aliases {held}: give models:/{name}/VERSION or one of those aliases"
        names = sorted(m.name for m in client.search_registered_models(max_results=20))
    except MlflowException:
        return "check the name, version or alias"
    return f"registered models: {', '.join(names)}" if names else "no model is registered there yet"


def logged_model_id(model_uri: str) -> str | None:
    """``m-<id>`` of a logged model's URI ``models:/m-<id>``; None for any other URI."""
    found = re.fullmatch(r"models:/(m-[0-9a-f]+)", model_uri)
    return found.group(1) if found else None
