"""What one training rank will hold in memory, estimated before any rank starts, and the check against the machine.

    plan = plan_memory(config, manifest, generator_dir, encoder_dir)  # bytes per rank, by part
    check_fits(plan, nproc, available_bytes)  # raises TrainingMemoryError in one line when they do not fit

The parts (each rank holds its own copy of every one):

- **runtime**: Python, torch, transformers and FAISS loaded, the tokenizers, the gloo group;
- **weights**: both towers in float32 (training keeps float32 weights; bf16 is autocast only), counted from the
  safetensors headers without loading a tensor;
- **optimizer**: gradient, Adam's m and v for every trained parameter (12 bytes each), under bf16 autocast
  the bf16 copy of each trained weight that autocast caches for a forward, and with ``weight_mix`` below 1 the
  float32 copy of each trained weight as it started (4 bytes);
- **activations**: what the backward pass keeps for one micro-batch (``micro`` examples x ``n_docs`` prompt
  rows of about :data:`ROW_TOKENS` tokens): with activation checkpointing one ``hidden``-wide input per block and
  token plus one block recomputed at a time, without it every trained block's intermediate tensors;
- **index**: the FAISS shards, the stored float32 vectors and the passage columns of an index loaded in the rank
  (none when a Dask cluster holds the index for all ranks).

Rank 0 alone also holds a checkpoint's serialized copy of the weights and the optimizer's state while it writes
one (``checkpoint``). The runtime part is calibrated on SmolLM2-135M-Instruct at ``wikirag finetune``'s defaults
(n_docs 5, batch 8, micro-batches of one example, the last 15 blocks trained, activation checkpointing, bf16
autocast, the ranks' malloc handing freed memory back): 2 ranks under torchrun peaked at 3.5-3.6 GB in 3 steps
(bench/rank_malloc_bench.py) and up to 3.8 GB in 10, beside 1.8 GB for the other parts; the rest is the
interpreter and libraries, the backward pass's transients, the DDP and gloo buffers and oneDNN's kernel cache.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_core.errors import WikiragError

GB = 1e9
RUNTIME_BYTES = 2.0e9  # a rank's peak beyond the parts counted (module docstring): measured, not derived
KEPT_HEAP_BYTES = 0.8e9  # more with rank_memory "fast" (freed heap kept): bench/rank_malloc_bench.py, max to max
ROW_TOKENS = {"decoder-only": 256, "seq2seq": None}  # decoder-only: system + passage + question + answer tokens
PASSAGE_COLUMN_BYTES = 700  # ids, titles, texts per passage (Arrow), measured on the sample
_BLOCK = re.compile(r"\.(?:layers|h|block)\.(\d+)\.")
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1}


class TrainingMemoryError(WikiragError):
    """The planned training ranks would not fit in the machine's available memory."""


@dataclass(frozen=True)
class MemoryPlan:
    """Estimated bytes one rank holds at its peak, by part (module docstring)."""

    runtime: float
    weights: float
    optimizer: float
    activations: float
    index: float
    checkpoint: float  # rank 0 only: the serialized weights and optimizer state while it writes a checkpoint
    parameters: int  # both towers
    trained: int  # parameters with a gradient

    @property
    def per_rank(self) -> float:
        return self.runtime + self.weights + self.optimizer + self.activations + self.index

    def parts(self) -> str:
        return ", ".join(f"{name} {value / GB:.1f}" for name, value in (
            ("runtime", self.runtime), ("weights", self.weights), ("optimizer", self.optimizer),
            ("activations", self.activations), ("index", self.index)))


def tensor_shapes(folder: Path) -> dict[str, tuple[list[int], str]]:
    """``{name: (shape, dtype)}`` of every tensor in the folder's ``*.safetensors`` files (headers only)."""
    shapes: dict[str, tuple[list[int], str]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        shapes.update({name: (entry["shape"], entry["dtype"]) for name, entry in header.items()
                       if name != "__metadata__"})
    if not shapes:
        raise TrainingMemoryError(f"{folder}: no *.safetensors weights to size the training job from; save the "
                                  "model with save_pretrained(safe_serialization=True)")
    return shapes


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def trained_count(shapes: dict[str, tuple[list[int], str]], last_blocks: int | None) -> int:
    """Parameters trained when only the last ``last_blocks`` numbered blocks (and unnumbered norms) train."""
    if last_blocks is None:
        return sum(_numel(shape) for shape, _ in shapes.values())
    blocks = [int(m.group(1)) for name in shapes if (m := _BLOCK.search(name))]
    first = (max(blocks) + 1 - last_blocks) if blocks else 0
    return sum(_numel(shape) for name, (shape, _) in shapes.items()
               if ((m := _BLOCK.search(name)) and int(m.group(1)) >= first)
               or (not m and "norm" in name and "embed" not in name))


def activation_bytes(model_config: dict[str, Any], tokens: int, trained_blocks: int, checkpointing: bool) -> float:
    """What the backward pass keeps for ``tokens`` tokens through the generator's blocks (float32)."""
    hidden = model_config.get("hidden_size") or model_config.get("d_model") or 768
    inner = model_config.get("intermediate_size") or model_config.get("decoder_ffn_dim") or 4 * hidden
    block = 4.0 * tokens * (10 * hidden + 5 * inner)  # q/k/v/o, norms, residuals, the gated MLP's four widths
    if checkpointing:
        return 4.0 * tokens * hidden * trained_blocks + block  # stored inputs + the block being recomputed
    return block * trained_blocks


def plan_memory(config: Any, index_manifest: Any | None, generator_dir: Path, encoder_dir: Path, *,
                world_size: int, precision: str) -> MemoryPlan:
    """The estimate for one rank of ``world_size`` running ``config`` (a TrainConfig); ``index_manifest``: the
    IndexManifest each rank loads, or None when a Dask cluster holds the index."""
    from rag_core.train.train_config import micro_steps

    generator, encoder = tensor_shapes(generator_dir), tensor_shapes(encoder_dir)
    model_config = json.loads((generator_dir / "config.json").read_text())
    parameters = sum(_numel(s) for s, _ in generator.values()) + sum(_numel(s) for s, _ in encoder.values())
    trained = trained_count(generator, config.train_generator_layers) + trained_count(encoder, None)
    optimizer = (12.0 * trained + (2.0 * trained if precision == "bfloat16" else 0.0)
                 + (4.0 * trained if config.weight_mix < 1 else 0.0))
    layers = model_config.get("num_hidden_layers") or model_config.get("decoder_layers") or 1
    trained_blocks = min(layers, config.train_generator_layers or layers)
    micro = config.batch_size // (world_size * micro_steps(config, world_size))
    decoder_only = not model_config.get("is_encoder_decoder", False)
    row = ROW_TOKENS["decoder-only"] if decoder_only else config.max_context_length + config.max_answer_length
    activations = activation_bytes(model_config, micro * config.n_docs * row, trained_blocks,
                                   config.activation_checkpointing)
    index = 0.0
    if index_manifest is not None:
        index = (sum(shard.bytes for shard in index_manifest.shards)
                 + index_manifest.count * (4 * index_manifest.dim + PASSAGE_COLUMN_BYTES))
    checkpoint = 1.6 * (4.0 * parameters + 8.0 * trained)  # measured: 3.0 GB above rank 1 for SmolLM2's 1.9 GB
    runtime = RUNTIME_BYTES + (KEPT_HEAP_BYTES if config.rank_memory == "fast" else 0.0)
    return MemoryPlan(runtime=runtime, weights=4.0 * parameters, optimizer=optimizer, activations=activations,
                      index=index, checkpoint=checkpoint, parameters=parameters, trained=trained)


def check_fits(plan: MemoryPlan, nproc: int, available: float) -> None:
    """Raise :class:`TrainingMemoryError` (one line, with the numbers and the flags to lower) unless ``nproc``
    ranks of ``plan`` fit in ``available`` bytes."""
    need = nproc * plan.per_rank + plan.checkpoint
    if need > available:
        raise TrainingMemoryError(
            f"{nproc} training process(es) need about {nproc} x {plan.per_rank / GB:.1f} GB + "
            f"{plan.checkpoint / GB:.1f} GB for rank 0's checkpoints = {need / GB:.1f} GB ({plan.parts()} GB each) "
            f"but {available / GB:.1f} GB of memory is available; lower --nproc "
            "or --n-docs, or train fewer generator blocks (--train-layers)")


def check_training_memory(config: Any, nproc: int, index_manifest: Any, *, index_in_ranks: bool = True,
                          available: float | None = None) -> MemoryPlan | None:
    """:func:`check_fits` for ``nproc`` ranks of ``config`` against psutil's available memory now (or
    ``available``); returns the plan, or None for the built-in small BART (no weights folder to size, ~5M
    parameters). ``index_in_ranks``: each rank loads ``index_manifest``'s index (no Dask cluster holds it)."""
    import psutil

    from rag_core.perf.device import choose_device
    from rag_core.perf.precision import choose_precision
    from rag_core.index.encoders import EncoderConfig, packaged_model_path

    if config.generator is None:
        return None
    encoder = config.question_encoder or EncoderConfig(**(index_manifest.encoder_config or {}))
    encoder_dir = Path(encoder.question_path or encoder.path or packaged_model_path()).expanduser()
    precision = choose_precision(config.precision, choose_device(config.device)).dtype
    plan = plan_memory(config, index_manifest if index_in_ranks else None, Path(config.generator).expanduser(),
                       encoder_dir, world_size=nproc, precision=precision)
    check_fits(plan, nproc, psutil.virtual_memory().available if available is None else available)
    return plan
