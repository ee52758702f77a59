"""Guarantee: a registered model is data; loading it runs the installed code only.

One real model (tiny BERT question encoder, tiny Llama generator, a real FAISS index of
real passages) is logged and registered in a real SQLite MLflow store. Each attack then
changes its artifact files (or its registry entry) on disk as someone with write access to
the artifact bucket (or to the registry) would, and runs `wikirag ask --model`: the answer
is one ``wikirag: error: <file>: ...`` line, and the attacker's code never ran (its marker
file never appears). Every test puts the artifact and the tags back as they were.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import mlflow
import pytest
import yaml
from mlflow import MlflowClient

from cli.wikirag import main
from rag_core.storage import Store
from tasks.adapters.mlflow_flavor import CHECKSUMS_TAG, MAX_NEW_TOKENS_CAP, ModelInputError
from tasks.adapters.mlflow_registry import log_rag_model, register
from tasks.adapters.mlflow_tracking import tracked_run
from tasks.adapters.model_checksums import ModelArtifactError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NAME, QUESTION = "wikirag-cloze", "Who was the teacher of Alexander the Great?"
CHAMPION = f"models:/{NAME}@champion"


@dataclass(frozen=True)
class Registered:
    uri: str  # the tracking store
    artifact: Path  # the logged model's files, where the artifact store keeps them
    store: Store
    index_version: str


@pytest.fixture(scope="module")
def registered(bound_model, tmp_path_factory: pytest.TempPathFactory) -> Registered:  # noqa: F811
    store, version, model_dir = bound_model
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    with tracked_run(uri, "wikirag-cloze", "finetune") as run:
        model_uri = log_rag_model(uri, run.run_id, model_dir, store_url=store.url, index_version=version)
        register(uri, model_uri, "cloze", run_id=run.run_id, metric="em", value=0.5, margin=0.0, store=store,
                 index_version=version)
    location = MlflowClient(tracking_uri=uri).get_logged_model(model_uri.removeprefix("models:/")).artifact_location
    return Registered(uri, Path(urlparse(location).path), store, version)


@pytest.fixture
def model(registered: Registered, tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Registered]:
    """The registered model, its artifact and version tag restored after the test."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registered.uri)
    client = MlflowClient(tracking_uri=registered.uri)
    tag = client.get_model_version(NAME, "1").tags[CHECKSUMS_TAG]
    shutil.copytree(registered.artifact, tmp_path / "artifact-as-logged")
    try:
        yield registered
    finally:
        shutil.rmtree(registered.artifact)
        shutil.copytree(tmp_path / "artifact-as-logged", registered.artifact)
        client.set_model_version_tag(NAME, "1", CHECKSUMS_TAG, tag)
        for version in client.search_model_versions(f"name='{NAME}'"):
            if str(version.version) != "1":
                client.delete_model_version(NAME, version.version)


def _ask(capsys: pytest.CaptureFixture, model_uri: str = CHAMPION) -> tuple[int, str, str]:
    code = main(["ask", "--model", model_uri, "--json", QUESTION])
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys: pytest.CaptureFixture, starts: str, contains: str = "", model_uri: str = CHAMPION) -> str:
    code, out, err = _ask(capsys, model_uri)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"wikirag: error: {starts}") and contains in lines[0], lines[0]
    return lines[0]


def _payload(marker: Path) -> str:
    """Python that leaves ``marker`` behind if anything imports or runs it."""
    return f"import pathlib\npathlib.Path({str(marker)!r}).write_text('attacker code ran')\n"


def _as_registry_writer(artifact: Path, uri: str) -> None:
    """What someone who can also write the registry does next: checksums.json rewritten over the files as they
    are now, and the version's anchor tag set to its digest (a fully self-consistent artifact)."""
    files = {p.relative_to(artifact).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(artifact.rglob("*")) if p.is_file() and p.name != "checksums.json"}
    (artifact / "checksums.json").write_text(json.dumps({"sha256": files}))
    digest = hashlib.sha256((artifact / "checksums.json").read_bytes()).hexdigest()
    MlflowClient(tracking_uri=uri).set_model_version_tag(NAME, "1", CHECKSUMS_TAG, digest)


def test_the_untampered_model_answers_through_wikirag_and_through_mlflow_pyfunc(model: Registered,
                                                                              capsys: pytest.CaptureFixture) -> None:
    code, out, err = _ask(capsys)
    assert code == 0, err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["question"] == QUESTION and len(record["provenance"]) == 2

    mlflow.set_tracking_uri(model.uri)
    pyfunc = mlflow.pyfunc.load_model(CHAMPION)  # what `mlflow models serve` does: loader_module is installed code
    assert pyfunc.metadata.flavors["python_function"]["loader_module"] == "tasks.adapters.mlflow_flavor"
    [served] = pyfunc.predict([QUESTION])
    assert served == record  # the same model, built the same way, gives the same answer and provenance
    with pytest.raises(ModelInputError, match=f"max_new_tokens {MAX_NEW_TOKENS_CAP + 1}: give a whole number"):
        pyfunc.predict([QUESTION], params={"max_new_tokens": MAX_NEW_TOKENS_CAP + 1})
    with pytest.raises(ModelInputError, match="question 2 of 2 is empty; give each question as text"):
        pyfunc.predict([QUESTION, "  "])
    with pytest.raises(ModelInputError, match="question 2 of 2 is 1,001 characters .*a question is at most 1,000"):
        pyfunc.predict([QUESTION, "x" * 1001])

    # MLflow's loader left its registered_model_meta among the model's files (a local artifact store): wikirag
    # does not read it, and still answers, the same
    assert (model.artifact / "registered_model_meta").is_file()
    code, again, err = _ask(capsys)
    assert code == 0, err
    assert json.loads(again.strip().splitlines()[-1]) == record


def test_an_alias_or_name_the_registry_lacks_says_what_it_has(model: Registered,
                                                                capsys: pytest.CaptureFixture) -> None:
    """A first run's model may be challenger only: the line lists the versions and their aliases."""
    _refused(capsys, f"models:/{NAME}@challenger: not found in MLflow at {model.uri} (",
             f"); {NAME} has v1, aliases @champion = v1: give models:/{NAME}/VERSION or one of those aliases",
             model_uri=f"models:/{NAME}@challenger")
    _refused(capsys, "models:/wikirag-nq@champion: not found in MLflow", f"); registered models: {NAME}",
             model_uri="models:/wikirag-nq@champion")


@pytest.mark.parametrize("where", ["python_model.py", "data/rag_model/generator/modeling_llama.py",
                                   "code/tasks/adapters/mlflow_flavor.py"])
def test_a_python_file_added_to_the_artifact_is_refused_and_never_imported(model: Registered, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture,
                                                                           where: str) -> None:
    marker = tmp_path / "marker"
    (model.artifact / where).parent.mkdir(parents=True, exist_ok=True)
    (model.artifact / where).write_text(_payload(marker))
    _refused(capsys, f"models:/{NAME}/1/{where}: not in checksums.json (added after logging)")
    mlflow.set_tracking_uri(model.uri)
    with pytest.raises(ModelArtifactError, match=f"/{where}: not in checksums.json"):
        mlflow.pyfunc.load_model(CHAMPION)  # the flavor's own entry point checks the files too
    assert not marker.exists()


def test_transformers_remote_code_planted_by_a_registry_writer_is_refused(model: Registered, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    marker, generator = tmp_path / "marker", model.artifact / "data" / "rag_model" / "generator"
    config = json.loads((generator / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (generator / "config.json").write_text(json.dumps(config))
    (generator / "modeling_evil.py").write_text(_payload(marker))
    _as_registry_writer(model.artifact, model.uri)
    _refused(capsys, f"models:/{NAME}/1/data/rag_model/generator/modeling_evil.py: not a file a wikirag model "
             "may carry")
    assert not marker.exists()


def test_pickled_weights_planted_by_a_registry_writer_are_refused_and_never_unpickled(
        model: Registered, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    marker, generator = tmp_path / "marker", model.artifact / "data" / "rag_model" / "generator"

    class Payload:
        def __reduce__(self):
            return Path.write_text, (marker, "attacker code ran")

    (generator / "model.safetensors").unlink()  # transformers would fall back to the pickle beside it
    (generator / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    _as_registry_writer(model.artifact, model.uri)
    _refused(capsys, f"models:/{NAME}/1/data/rag_model/generator/pytorch_model.bin: not a file a wikirag model "
             "may carry")
    assert not marker.exists()


def _models_from_code(spec: dict, artifact: Path, marker: Path) -> None:
    spec["flavors"]["python_function"] = {"loader_module": "mlflow.pyfunc.loaders.code_model",
                                          "model_code_path": "python_model.py", "python_model": "python_model.py"}
    (artifact / "python_model.py").write_text(_payload(marker))


def _another_module(spec: dict, artifact: Path, marker: Path) -> None:
    spec["flavors"]["python_function"].update(loader_module="evil_loader", code="code")
    (artifact / "code").mkdir()
    (artifact / "code" / "evil_loader.py").write_text(_payload(marker))


def _wikirag_module_shadowed(spec: dict, artifact: Path, marker: Path) -> None:
    spec["flavors"]["python_function"]["code"] = "code"  # MLflow puts it first on sys.path: `tasks` would be this
    (artifact / "code" / "tasks").mkdir(parents=True)
    (artifact / "code" / "tasks" / "__init__.py").write_text(_payload(marker))
    (artifact / "code" / "tasks" / "mlflow_flavor.py").write_text(_payload(marker))


MLMODEL_ATTACKS = {
    "models from code": (_models_from_code, "loader_module is 'mlflow.pyfunc.loaders.code_model', not "
                                            "'tasks.adapters.mlflow_flavor'; refused"),
    "another loader module": (_another_module, "loader_module is 'evil_loader', not 'tasks.adapters.mlflow_flavor'"),
    "a code folder shadowing wikirag": (_wikirag_module_shadowed,
                                        "the tasks.adapters.mlflow_flavor flavor names ['code']"),
}


@pytest.mark.parametrize("registry_writer", [False, True], ids=["bucket writer", "registry writer"])
@pytest.mark.parametrize("attack", list(MLMODEL_ATTACKS))
def test_a_tampered_mlmodel_is_refused_and_its_code_never_runs(model: Registered, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture, attack: str,
                                                               registry_writer: bool) -> None:
    marker, mlmodel = tmp_path / "marker", model.artifact / "MLmodel"
    plant, message = MLMODEL_ATTACKS[attack]
    spec = yaml.safe_load(mlmodel.read_text())
    plant(spec, model.artifact, marker)
    mlmodel.write_text(yaml.safe_dump(spec))
    if registry_writer:  # the checksums vouch for the files: the loader module alone must stop it
        _as_registry_writer(model.artifact, model.uri)
    _refused(capsys, f"models:/{NAME}/1/MLmodel: ", message)
    assert not marker.exists()


def test_a_weights_file_changed_by_one_byte_is_refused_naming_it(model: Registered,
                                                                capsys: pytest.CaptureFixture) -> None:
    weights = model.artifact / "data" / "rag_model" / "generator" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    _refused(capsys, f"models:/{NAME}/1/data/rag_model/generator/model.safetensors: sha256 differs from "
             "checksums.json")
    mlflow.set_tracking_uri(model.uri)
    with pytest.raises(ModelArtifactError, match="/data/rag_model/generator/model.safetensors: sha256 differs"):
        mlflow.pyfunc.load_model(CHAMPION)


def test_checksums_rewritten_by_a_bucket_writer_are_refused_by_the_registry_anchor(
        model: Registered, capsys: pytest.CaptureFixture) -> None:
    weights = model.artifact / "data" / "rag_model" / "question_encoder" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    listed = json.loads((model.artifact / "checksums.json").read_text())
    listed["sha256"]["data/rag_model/question_encoder/model.safetensors"] = hashlib.sha256(
        weights.read_bytes()).hexdigest()
    (model.artifact / "checksums.json").write_text(json.dumps(listed))
    _refused(capsys, f"models:/{NAME}/1/checksums.json: sha256 ", f"differs from the {CHECKSUMS_TAG} tag of "
             f"models:/{NAME}/1")


def test_a_missing_file_is_refused_naming_it(model: Registered, capsys: pytest.CaptureFixture) -> None:
    (model.artifact / "data" / "rag_model" / "rag.json").unlink()
    _refused(capsys, f"models:/{NAME}/1/data/rag_model/rag.json: listed in checksums.json but missing")


def test_a_version_registered_without_its_anchor_is_refused(model: Registered,
                                                           capsys: pytest.CaptureFixture) -> None:
    client = MlflowClient(tracking_uri=model.uri)
    source = client.get_model_version(NAME, "1").source  # the same files, registered around wikirag
    version = client.create_model_version(NAME, source).version
    _refused(capsys, f"models:/{NAME}/{version}: no {CHECKSUMS_TAG} tag", model_uri=f"models:/{NAME}/{version}")
