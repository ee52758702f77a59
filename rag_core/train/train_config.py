"""What a fine-tuning run is given and returns: :class:`TrainConfig`, :class:`TrainResult`, the process's place in a
torchrun job (:class:`Distributed`), the learning-rate schedule, and the split of each optimizer step's examples
over ranks and micro-batches. :mod:`rag_core.train.recipe` runs it.

The data position is the step alone: example k of the training stream is position k % N of epoch k // N's seeded
permutation; step s reads positions [s * batch_size, (s + 1) * batch_size), rank r every W-th of each micro-batch.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_core.errors import WikiragError
from rag_core.index.encoders import EncoderConfig

# Fields that may change between a run and its resumption: they do not change the trajectory.
# weight_mix acts after the last step, so runs that differ only in it share their checkpoints
RUN_CONTROL = frozenset({"max_steps", "eval_every", "max_dev_examples", "checkpoint_every", "keep_checkpoints",
                         "log_every", "threads", "device", "activation_checkpointing", "rank_memory", "weight_mix"})


class TrainConfigError(WikiragError):
    """A training config that cannot run as given (the message names the field and the fix)."""


class TrainConfig(BaseModel):
    """One fine-tuning run; also the ``finetune`` flow's parameter. Defaults follow the RAG paper where it says."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str = Field(description="task kind (rag_core.train.loaders.TASK_KINDS): nq, triviaqa, ..., cloze")
    train: str = Field(description="training examples: a path or URL in the task kind's format")
    dev: str | None = Field(None, description="dev examples (same format) for the dev loss; None = none")
    kind: Literal["sequence", "token"] = Field("sequence", description="RAG-Sequence or RAG-Token marginalisation")
    generator: str | None = Field(None, description="generator folder (seq2seq or decoder-only); None = the small "
                                                    "default BART; real runs: runtime.default_generator.default_generator_dir")
    index_version: str | None = Field(None, description="index version on the store; None = LATEST (resolved at "
                                                        "setup and recorded in the model)")
    question_encoder: EncoderConfig | None = Field(None, description="initial question tower; None = the encoder "
                                                                     "recorded in the index manifest")
    n_docs: int = Field(5, ge=1, description="passages per question (the paper: 5 or 10)")
    max_context_length: int = Field(300, ge=8, description="seq2seq generator input tokens per passage")
    max_answer_length: int = Field(64, ge=2, description="target tokens per answer")
    train_generator_layers: int | None = Field(
        None, ge=1, description="train only the generator's last N decoder blocks (and its final norm), freezing "
                                "the rest: the backward pass stops there, so a step costs less; None = every "
                                "parameter (the paper)")
    train_question_encoder: bool = Field(True, description="train the question tower too (the paper); False = "
                                                            "retrieve as the index's own encoder does, train the "
                                                            "generator only")
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="epsilon of the paper's label smoothing")
    dropout: float | None = Field(None, ge=0.0, lt=1.0, description="every dropout probability in both towers; "
                                                                     "None = the models' own")
    optimizer: Literal["adam", "adamw"] = Field("adam", description="the paper: Adam")
    lr: float = Field(3e-5, gt=0.0, description="peak learning rate (the paper: about 3e-5)")
    weight_decay: float = Field(0.0, ge=0.0, description="L2 (adam) or decoupled (adamw) weight decay")
    adam_eps: float = Field(1e-8, gt=0.0, description="Adam's epsilon")
    warmup_steps: int | None = Field(None, ge=0, description="linear warm-up from 0 over this many steps; None = "
                                                              "a tenth of max_steps (at least 1)")
    schedule: Literal["constant", "linear", "cosine"] = Field("linear", description="after warm-up: decay to 0 "
                                                                                    "at max_steps, or constant")
    grad_clip: float | None = Field(None, gt=0.0, description="clip the global gradient norm; None = no clipping")
    batch_size: int = Field(8, ge=1, description="examples per optimizer step over all ranks and micro-steps "
                                                 "(results do not depend on the process count)")
    grad_accum: int | None = Field(None, ge=1, description="micro-batches per optimizer step on each rank; None = "
                                                           "one example each (a rank holds one question's n_docs "
                                                           "rows of activations at a time; the same gradient)")
    activation_checkpointing: bool = Field(True, description="keep only each generator block's input for the "
                                                             "backward pass and recompute the rest there (the same "
                                                             "gradient, more compute; SmolLM2, n_docs 5: a rank's "
                                                             "peak 4.2 GB instead of 5.0)")
    rank_memory: Literal["lean", "fast"] = Field(
        "lean", description="a torchrun rank's process (runtime.process_tuning): lean = freed memory goes back to "
                            "the system and oneDNN keeps fewer kernels (SmolLM2 at the finetune defaults: 3.6 GB per "
                            "rank, 0.78x the examples/s of memory kept, bench/rank_malloc_bench.py); fast = freed "
                            "memory kept for reuse, as in other processes")
    max_steps: int = Field(100, ge=0, description="optimizer steps in all (a resumed run counts those done)")
    weight_mix: float = Field(1.0, gt=0.0, le=1.0, description="the saved model's weights: this share of the "
                              "fine-tuned ones and the rest of the start's (WiSE-FT, Wortsman et al. 2022); 1 = the "
                              "fine-tuned weights as trained")
    eval_every: int = Field(0, ge=0, description="dev loss every N steps; 0 = at the start and the end only")
    max_dev_examples: int = Field(256, ge=1, description="dev loss over at most the first N dev examples")
    checkpoint_every: int = Field(50, ge=0, description="checkpoint every N steps (and at the end); 0 = at the "
                                                        "end only")
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on the store")
    log_every: int = Field(1, ge=1, description="log loss, learning rate and examples/s every N steps")
    seed: int = Field(0, description="data order, dropout and every generator's seed")
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="autocast dtype (weights stay float32); auto = bf16 only where "
                            "rag_core.perf.precision.choose_precision finds it native")
    device: str = Field("auto", description="auto = rag_core.perf.device.choose_device: cuda:LOCAL_RANK where CUDA "
                        "is available, else cpu; WIKIRAG_DEVICE forces")
    threads: int | None = Field(None, ge=1, description="torch threads per process; None = as set (torchrun: 1)")
    output: str = Field("runs/default", description="folder on the store: checkpoints/, model/, result.json")


class TrainResult(BaseModel):
    """What a run returns, and writes as ``<output>/result.json`` (the ``--result`` file of
    tasks/adapters/torchrun_launcher.py)."""

    final_step: int  # optimizer steps done
    world_size: int  # processes the (last) run had
    resumed_from: int | None  # the checkpoint step this run started from; None = a fresh start
    losses: list[float]  # mean training loss of every step, step 1 first (resumed runs included)
    final_loss: float | None  # mean of the last min(10, steps) losses
    dev_losses: list[tuple[int, float]]  # (step, mean dev NLL per example), step 0 = before training
    mixed_dev_loss: float | None = None  # the saved model's dev NLL when weight_mix < 1 (dev_losses: as trained)
    examples_per_s: float | None  # median training examples/s of this run's steps (after its first)
    model_url: str  # the saved RagModel (save_pretrained layout + manifest.json): checkpoints.load_model
    output_url: str  # <store>/<output>
    index_version: str | None
    precision: str  # float32 or bfloat16 autocast
    device: str


@dataclass(frozen=True)
class Distributed:
    """This process's place in a torchrun job: rank, world size and rank on its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Distributed:
        """torchrun's RANK, WORLD_SIZE and LOCAL_RANK from ``environ`` (the caller's ``os.environ``); one process
        without them."""
        return cls(int(environ.get("RANK", 0)), int(environ.get("WORLD_SIZE", 1)), int(environ.get("LOCAL_RANK", 0)))


def warmup_steps(config: TrainConfig) -> int:
    """The warm-up's steps: the config's, or a tenth of ``max_steps`` (at least 1 where there are 2 steps or more)."""
    if config.warmup_steps is not None:
        return config.warmup_steps
    return max(1, round(config.max_steps / 10)) if config.max_steps > 1 else 0


def lr_factor(step: int, config: TrainConfig) -> float:
    """The schedule: the learning rate of optimizer step ``step`` (0-based) over ``config.lr``."""
    warmup = warmup_steps(config)
    if step < warmup:
        return (step + 1) / (warmup + 1)  # no step at rate 0: the first one already moves the weights
    if config.schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, config.max_steps - warmup)
    if config.schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def trajectory(config: Mapping[str, Any]) -> dict[str, Any]:
    """A dumped config without :data:`RUN_CONTROL`: what a resumed run must share with its checkpoint."""
    return {k: v for k, v in config.items() if k not in RUN_CONTROL}


def trajectory_key(config: TrainConfig) -> str:
    """A hash of :func:`trajectory` without ``output``: the fields that decide what a run computes.

    Runs with the same key may share an output folder and resume each other's checkpoints; a
    changed recipe gets a folder of its own instead of the checkpoint's "config differs" error.
    """
    fields = trajectory(config.model_dump(mode="json", exclude={"output"}))
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def micro_steps(config: TrainConfig, world: int) -> int:
    """Micro-batches per optimizer step on each of ``world`` ranks: ``grad_accum``, or one per example when None."""
    return config.grad_accum or max(1, config.batch_size // world)


def micro_positions(step: int, micro: int, rank: int, world: int, config: TrainConfig) -> list[int]:
    """Positions in the training stream of rank ``rank``'s micro-batch ``micro`` of step ``step``."""
    size = config.batch_size // (world * micro_steps(config, world))
    start = step * config.batch_size + micro * world * size
    return [start + rank + world * j for j in range(size)]
