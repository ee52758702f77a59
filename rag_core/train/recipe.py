"""The fine-tuning recipe: setup, train, save, cleanup; one process, or many under torchrun (DDP).

    result = run(TrainConfig(task="nq", train="nq-train.jsonl", dev="nq-dev.jsonl"), store)

``run`` is the whole recipe; :class:`Recipe` exposes its four steps. The caller
(``tasks/adapters/torchrun_launcher.py`` under torchrun, a test, a notebook) passes what this module
must not read itself: the store (with its credentials), the run logger (MLflow's lives outside rag_core;
ranks other than 0 get a :class:`~rag_core.train.tracking.NullLogger`) and :class:`Distributed`, torchrun's
rank and world size (``Distributed.from_environ(os.environ)``). With a world size above 1 the recipe joins the
process group (``env://``: torch reads torchrun's MASTER_ADDR/PORT; gloo on CPU, nccl on GPU).

One optimizer step (the DDP-correct split, ``rag_core.model.rag_model``):

1. ``search`` (no gradients, outside DDP): each rank asks the retriever for its micro-batch's
   passages, their stored vectors and the generator inputs (the retriever: the index loaded in
   this process, or ``open_retriever``'s, e.g. shards and vectors held once by Dask workers for all
   ranks: tasks/adapters/torchrun_launcher.py ``--dask-address``);
2. ``DDP(RagModel)(search_result, labels)``: question encoder, ``doc_scores`` = q·v, generator
   and the RAG-Sequence/Token NLL in one forward, so every trained parameter is used inside
   the wrapped forward; backward all-reduces the gradients (the last micro-step only);
3. clip, optimizer step, schedule step. The index and its vectors never change.

``batch_size`` is the global batch: each of W ranks runs ``grad_accum`` micro-batches of
``batch_size / (W * grad_accum)`` examples (by default one example each: a rank then holds the
activations of one question's ``n_docs`` prompts at a time, and with activation checkpointing only each
generator block's input of them; memory per rank does not grow with the batch), and the loss is
sum(NLL) * W / batch_size per micro-batch, so after DDP's average the gradient is the mean over the
global batch: the same config gives the same parameters with any number of processes or accumulation steps (tested,
to float rounding; with dropout > 0 the masks differ, so set ``dropout=0`` to compare).
Example k of the training stream is position k % N of epoch k // N's seeded permutation; step s
reads positions [s * batch_size, (s + 1) * batch_size), rank r every W-th of each micro-batch
(DistributedSampler's split). The data position is therefore the step alone.

Checkpoints (:mod:`rag_core.train.checkpoints`) every ``checkpoint_every`` steps and at the end;
a rerun with the same config resumes from the newest complete one and, with the same number of
processes, reaches the same parameters bit for bit (each rank's generator states are saved).
Parameters the loss cannot reach (e.g. a BERT pooler under mean pooling) are found by one probe
step at setup (RNG forked) and frozen, so DDP needs no ``find_unused_parameters``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import distributed as dist
from torch import nn

from rag_core.index.encoders import EncoderConfig
from rag_core.progress import StageProgress
from rag_core.storage import Store, is_local
from rag_core.train import checkpoints as ckpt
from rag_core.train.examples import Example
from rag_core.train.loss_curves import draw_losses, ema
from rag_core.train.tracking import NullLogger, RunLogger
from rag_core.train.train_config import (
    Distributed,
    TrainConfig,
    TrainConfigError,
    TrainResult,
    lr_factor,
    micro_positions,
    micro_steps,
    trajectory,
)

log = logging.getLogger(__name__)

_DROPOUT_ATTRIBUTES = ("dropout", "attention_dropout", "activation_dropout")


# Tasks whose target is a sentence or a question, not a span: their replies are kept whole.
FREE_FORM_TASKS = frozenset({"msmarco", "jeopardy"})


def initial_model(config: TrainConfig, retriever: Any, device: str = "cpu") -> Any:
    """The RagModel a run starts from (its zero-shot baseline): the generator and question tower as loaded."""
    from rag_core.index.manifest import IndexManifest
    from rag_core.model.generators import GeneratorConfig
    from rag_core.model.rag_model import RagConfig, RagModel

    encoder = config.question_encoder or EncoderConfig(
        **(IndexManifest.model_validate(retriever.manifest).encoder_config or {}))
    rag = RagConfig(kind=config.kind, n_docs=config.n_docs, max_context_length=config.max_context_length,
                    max_answer_length=config.max_answer_length, label_smoothing=config.label_smoothing,
                    question_encoder=encoder, generator=GeneratorConfig(path=config.generator, dtype="float32"),
                    short_answers=config.task not in FREE_FORM_TASKS, device=device)
    model = RagModel.create(rag, retriever)
    if config.dropout is not None:
        set_dropout(model, config.dropout)
    return model


def set_dropout(module: nn.Module, p: float) -> None:
    """Every dropout probability of ``module``: nn.Dropout layers and transformers' float attributes."""
    for sub in module.modules():
        if isinstance(sub, nn.Dropout):
            sub.p = p
        for name in _DROPOUT_ATTRIBUTES:
            if isinstance(getattr(sub, name, None), float):
                setattr(sub, name, p)


class Recipe:
    """setup -> train -> save -> cleanup (see the module docstring); :func:`run` calls them in order."""

    def __init__(self, config: TrainConfig, store: Store, *, logger: RunLogger | None = None,
                 distributed: Distributed | None = None, retriever: Any = None,
                 open_retriever: Callable[[Store, str | None], Any] | None = None,
                 data_options: Mapping[str, Any] | None = None) -> None:
        self.config, self.store = config, store
        self.dist = distributed or Distributed()
        self.logger: RunLogger = (logger or NullLogger()) if self.dist.rank == 0 else NullLogger()
        self.retriever = retriever  # open_retriever(store, index_version) at setup when None (module docstring)
        self.open_retriever = open_retriever
        self.data_options = dict(data_options or {})
        self.output = store.child(config.output)
        self._owns_group = False
        self._threads = torch.get_num_threads()
        self._orders: dict[int, np.ndarray] = {}
        self.losses: list[float] = []
        self.dev_losses: list[tuple[int, float]] = []
        self.mixed_dev_loss: float | None = None
        self.start_weights: dict[str, torch.Tensor] = {}
        self.rates: list[float] = []
        self.resumed_from: int | None = None
        self.step = 0

    # -- setup --------------------------------------------------------------------------
    def setup(self) -> None:
        from rag_core.perf.device import choose_device, process_group_backend
        from rag_core.perf.precision import choose_precision
        from rag_core.train.loaders import load_task

        c, d = self.config, self.dist
        self.micro_steps = micro_steps(c, d.world_size)
        per_rank = c.batch_size / (d.world_size * self.micro_steps)
        if per_rank != int(per_rank) or per_rank < 1:
            raise TrainConfigError(f"batch_size {c.batch_size} is not a multiple of {d.world_size} processes x "
                                   f"grad_accum {self.micro_steps}; choose a batch_size divisible by their product")
        if c.threads:
            torch.set_num_threads(c.threads)
        self.device = torch.device(choose_device(c.device, local_rank=d.local_rank))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if d.world_size > 1 and not dist.is_initialized():
            dist.init_process_group(process_group_backend(str(self.device)), rank=d.rank, world_size=d.world_size)
            self._owns_group = True
        self.precision = choose_precision(c.precision, str(self.device)).dtype
        self.train_examples = load_task(c.task, c.train, self._options(c.train))
        self.dev_examples = load_task(c.task, c.dev, self._options(c.dev))[: c.max_dev_examples] if c.dev else []
        if d.rank == 0:
            for name in ckpt.remove_incomplete(self.output.child("checkpoints")):
                log.info("removed %s: a checkpoint killed while being written", name)
        latest = ckpt.latest_checkpoint(self.output.child("checkpoints"))
        found = None if latest is None else ckpt.read_checkpoint(self.output.child("checkpoints"), latest)
        # a resumed run retrieves from the version it started with, wherever LATEST points now
        self.model = self._build_model(c.index_version or (found.state.index_version if found else None))
        if c.train_generator_layers is not None:
            from rag_core.model.generators import train_last_blocks

            trained, blocks = train_last_blocks(self.model.generator, c.train_generator_layers)
            log.info("generator: training its last %d of %d decoder blocks, the rest frozen", trained, blocks)
        if not c.train_question_encoder:
            self.model.question_encoder.requires_grad_(False)
        if c.activation_checkpointing and getattr(self.model.generator, "supports_gradient_checkpointing", False):
            # non-reentrant: exact with frozen blocks below and inputs that need no gradient
            self.model.generator.activation_checkpointing_enable({"use_reentrant": False})
        self.trainable = self._freeze_unreached()
        if c.weight_mix < 1:  # a resumed run rebuilt the same start above; its checkpoint is loaded below
            self.start_weights = {name: p.detach().clone() for name, p in self.trainable}
        opt = torch.optim.AdamW if c.optimizer == "adamw" else torch.optim.Adam
        self.optimizer = opt([p for _, p in self.trainable], lr=c.lr, eps=c.adam_eps, weight_decay=c.weight_decay,
                             fused=self.device.type in ("cpu", "cuda"))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, c))
        self._seed(c.seed * 1_000_003 + d.rank)
        if found is not None:
            self._resume(found)
        self.model.train()
        self.ddp: nn.Module = self.model
        if d.world_size > 1:
            self.ddp = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                forward_sync_buffers=False, gradient_as_bucket_view=True)  # buffers never change here
        frozen = sum(p.numel() for p in self.model.parameters() if not p.requires_grad)
        self.logger.log_params({**c.model_dump(mode="json"), "world_size": d.world_size, "precision": self.precision,
                                "device": str(self.device), "resolved_index_version": self.model.index_version,
                                "n_train": len(self.train_examples), "n_dev": len(self.dev_examples),
                                "trainable_parameters": sum(p.numel() for _, p in self.trainable),
                                "frozen_parameters": frozen})
        self.logger.set_tags({"wikirag.task": c.task, "wikirag.index_version": str(self.model.index_version),
                              "wikirag.resumed_from": str(self.resumed_from)})

    def _options(self, url: str) -> dict[str, Any]:
        return {} if is_local(url) else self.data_options  # S3 options would confuse the local filesystem

    def _build_model(self, index_version: str | None) -> Any:
        from rag_core.model.retriever import IndexRetriever

        if self.retriever is None:
            self.retriever = (self.open_retriever or IndexRetriever.load)(self.store, index_version)
        return initial_model(self.config, self.retriever, str(self.device))

    def _freeze_unreached(self) -> list[tuple[str, nn.Parameter]]:
        """One probe step (first training example, RNG forked): parameters left without a gradient are frozen.

        One passage is enough: which parameters the loss reaches does not depend on how many it reads (with one,
        the question tower's gradient is zero, but it is computed), and the probe costs a fifth of a default one."""
        probe = self.train_examples[0]
        self.model.train()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            found = self.model.search([probe.input], n_docs=1)
            labels = self.model.answer_labels([probe.targets[0]])
            with self._autocast():
                self.model(found, labels).float().sum().backward()
        unreached = [name for name, p in self.model.named_parameters() if p.requires_grad and p.grad is None]
        for name, p in self.model.named_parameters():
            p.grad = None
            if name in unreached:
                p.requires_grad_(False)
        if unreached:
            log.info("not trained (the loss does not reach them): %s", ", ".join(unreached))
        return [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]

    def _seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def _resume(self, found: ckpt.Checkpoint) -> None:
        step = found.state.step
        saved, ours = trajectory(found.state.config), trajectory(self.config.model_dump(mode="json"))
        if saved != ours:
            changed = sorted(k for k in ours if saved.get(k) != ours[k])
            raise TrainConfigError(f"{found.url}: this run's config differs from the checkpoint's in {changed}; "
                                   "resume with the same config, or give a new output folder")
        names = [name for name, _ in self.trainable]
        if found.state.param_names != names:
            raise TrainConfigError(f"{found.url}: the checkpoint trains other parameters than this model; resume "
                                   "with the generator and encoder it was made with")
        ckpt.load_parameters(self.model, found.parameters, found.url)
        ckpt.load_optimizer(self.optimizer, found.optimizer, found.state.param_groups)
        self.scheduler.load_state_dict(found.state.scheduler)
        if found.state.world_size == self.dist.world_size:
            rank = self.dist.rank
            ckpt.set_rng_state(self.device, found.rng[rank], found.state.python_rng[rank],
                               found.state.numpy_rng[rank])
        else:
            log.warning("%s was written by %d processes, this run has %d: dropout masks are reseeded (the data "
                        "order is not affected)", found.url, found.state.world_size, self.dist.world_size)
            self._seed((self.config.seed * 1_000_003 + step) * 1_000_003 + self.dist.rank)
        self.step = self.resumed_from = step
        self.losses = list(found.state.losses)
        self.dev_losses = [(int(s), float(v)) for s, v in found.state.dev_losses]
        log.info("resuming from %s (step %d)", found.url, step)

    # -- train ---------------------------------------------------------------------------
    def train(self) -> None:
        c = self.config
        if self.step == 0 and self.dev_examples:
            self._evaluate()
        with StageProgress(f"train {c.task}", max(0, c.max_steps - self.step), "step",
                           log=log.info if self.dist.rank == 0 else (lambda _line: None)) as progress:
            while self.step < c.max_steps:
                self._one_step()
                progress.update()

    def _one_step(self) -> None:
        """One optimizer step over the global batch (module docstring), then logging, dev loss, checkpoint."""
        c = self.config
        started = time.perf_counter()
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        scale = self.dist.world_size / c.batch_size
        for micro in range(self.micro_steps):
            examples = [self._example(k) for k in
                        micro_positions(self.step, micro, self.dist.rank, self.dist.world_size, c)]
            sync = micro == self.micro_steps - 1 or not isinstance(self.ddp, nn.parallel.DistributedDataParallel)
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                loss = self._loss(self.ddp, examples, scale)
                loss.backward()
            total += loss.detach().double() / scale
        if c.grad_clip:
            nn.utils.clip_grad_norm_([p for _, p in self.trainable], c.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.losses.append(self._global_sum(total) / c.batch_size)
        seconds = time.perf_counter() - started
        if self.step > (self.resumed_from or 0) + 1:  # the first step of a process warms up its kernels
            self.rates.append(c.batch_size / seconds)
        if self.step % c.log_every == 0 or self.step == c.max_steps:
            self.logger.log_metrics({"loss": self.losses[-1], "loss_smoothed": ema(self.losses)[-1], "lr": lr,
                                     "examples_per_s": c.batch_size / seconds}, step=self.step)
        if self.dev_examples and c.eval_every and self.step % c.eval_every == 0 and self.step < c.max_steps:
            self._evaluate()
        if (c.checkpoint_every and self.step % c.checkpoint_every == 0) or self.step == c.max_steps:
            if self.step == c.max_steps and self.dev_examples:
                self._evaluate()  # the final dev loss goes into the last checkpoint's history
            self._checkpoint()

    def _example(self, position: int) -> Example:
        n = len(self.train_examples)
        epoch, index = divmod(position, n)
        if epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng([self.config.seed, epoch]).permutation(n)}
        return self.train_examples[int(self._orders[epoch][index])]

    def _loss(self, forward: nn.Module, examples: Sequence[Example], scale: float) -> torch.Tensor:
        """sum(NLL) * scale of ``examples`` (their first targets), searched outside ``forward``."""
        found = self.model.search([e.input for e in examples])  # no gradients: FAISS and stored vectors
        labels = self.model.answer_labels([e.targets[0] for e in examples])
        with self._autocast():
            return forward(found, labels).float().sum() * scale

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.precision != "bfloat16":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def _global_sum(self, value: torch.Tensor) -> float:
        if self.dist.world_size > 1:
            value = value.clone()
            dist.all_reduce(value)
        return float(value)

    def _evaluate(self) -> None:
        value = self._dev_loss()
        self.dev_losses.append((self.step, value))
        self.logger.log_metrics({"dev_loss": value}, step=self.step)

    @torch.no_grad()
    def _dev_loss(self) -> float:
        """Mean dev NLL per example; the dev set is split over the ranks, the model stays unwrapped."""
        self.model.eval()
        mine = self.dev_examples[self.dist.rank::self.dist.world_size]
        size = max(1, self.config.batch_size // (self.dist.world_size * self.micro_steps))
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for start in range(0, len(mine), size):
            total += self._loss(self.model, mine[start: start + size], 1.0).double()
        self.model.train()
        return self._global_sum(total) / len(self.dev_examples)

    def _checkpoint(self) -> None:
        tensors, python, numpy_state = ckpt.rng_state(self.device)
        every = [(tensors, python, numpy_state)]
        if self.dist.world_size > 1:
            every = [None] * self.dist.world_size
            dist.all_gather_object(every, ({k: v.cpu() for k, v in tensors.items()}, python, numpy_state))
        if self.dist.rank == 0:
            started = time.perf_counter()
            state = ckpt.State(
                step=self.step, examples_seen=self.step * self.config.batch_size, world_size=self.dist.world_size,
                config=self.config.model_dump(mode="json"), scheduler=self.scheduler.state_dict(), param_groups=[],
                param_names=[name for name, _ in self.trainable], python_rng=[e[1] for e in every],
                numpy_rng=[e[2] for e in every], losses=self.losses, dev_losses=[list(x) for x in self.dev_losses],
                index_version=self.model.index_version)
            url = ckpt.write_checkpoint(self.output.child("checkpoints"), state, self.model, self.optimizer,
                                        [e[0] for e in every], keep=self.config.keep_checkpoints)
            self.logger.log_metrics({"checkpoint_seconds": time.perf_counter() - started}, step=self.step)
            log.info("checkpoint %s", url)
        if self.dist.world_size > 1:
            dist.barrier()  # no rank runs ahead of a checkpoint that may be its restart point

    # -- save ----------------------------------------------------------------------------
    @torch.no_grad()
    def mix_weights(self) -> None:
        """Move each trained weight back toward the start: start + weight_mix * (trained - start), on every rank.

        A fine-tune on a few hundred generated pairs pulls a small reader away from what it did well zero-shot;
        averaging the two in weight space (WiSE-FT) keeps much of both (docs/architecture.md)."""
        share = self.config.weight_mix
        for name, p in self.trainable:
            p.copy_(torch.lerp(self.start_weights.pop(name), p, share))
        if self.dev_examples:
            self.mixed_dev_loss = self._dev_loss()
            self.logger.log_metrics({"mixed_dev_loss": self.mixed_dev_loss}, step=self.step)
        log.info("saved weights: %g of the fine-tuned ones, %g of the start's", share, 1 - share)

    def save(self) -> TrainResult:
        """The final model (after :meth:`mix_weights` when ``weight_mix`` < 1) and result.json (rank 0 writes;
        every rank returns the result)."""
        if self.start_weights:
            self.mix_weights()
        model_store = self.output.child("model")
        tail = self.losses[-10:]
        result = TrainResult(
            final_step=self.step, world_size=self.dist.world_size, resumed_from=self.resumed_from,
            losses=self.losses, final_loss=sum(tail) / len(tail) if tail else None, dev_losses=self.dev_losses,
            mixed_dev_loss=self.mixed_dev_loss,
            examples_per_s=statistics.median(self.rates) if self.rates else None, model_url=model_store.url,
            output_url=self.output.url, index_version=self.model.index_version, precision=self.precision,
            device=str(self.device))
        if self.dist.rank == 0:
            ckpt.save_model(self.model, model_store)
            self.output.write_json(result.model_dump(mode="json"), "result.json")
            metrics = {"final_loss": result.final_loss} if result.final_loss is not None else {}
            if self.dev_losses:
                metrics["final_dev_loss"] = self.dev_losses[-1][1]
            self.logger.log_metrics(metrics, step=self.step)
            self._plot()
        if self.dist.world_size > 1:
            dist.barrier()
        return result

    def _plot(self) -> None:
        """loss_curve.png: training loss per step (and smoothed) and dev loss per evaluation, logged as an artifact."""
        from matplotlib.figure import Figure  # no pyplot: no global backend state

        if not self.losses:
            return
        figure = Figure(figsize=(6, 3.5), dpi=100)
        axes = figure.add_subplot()
        draw_losses(axes, list(enumerate(self.losses, start=1)), self.dev_losses)
        if self.mixed_dev_loss is not None:
            axes.plot([self.step], [self.mixed_dev_loss], marker="*", markersize=12, linestyle="none",
                      label=f"dev loss, saved weights ({self.config.weight_mix:g} fine-tuned)")
        axes.set_title(f"{self.config.task}: RAG-{self.config.kind.title()}, {self.dist.world_size} process(es)")
        axes.legend()
        figure.tight_layout()
        with tempfile.TemporaryDirectory(prefix="wikirag-plot-") as tmp:
            path = Path(tmp) / "loss_curve.png"
            figure.savefig(path)
            self.logger.log_artifact(path, "plots")

    # -- cleanup -------------------------------------------------------------------------
    def cleanup(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False
        torch.set_num_threads(self._threads)


def run(config: TrainConfig, store: Store, *, logger: RunLogger | None = None, distributed: Distributed | None = None,
        retriever: Any = None, open_retriever: Callable[[Store, str | None], Any] | None = None,
        data_options: Mapping[str, Any] | None = None) -> TrainResult:
    """The whole recipe (module docstring). ``retriever``: an IndexRetriever-like object; else
    ``open_retriever(store, version)`` opens the run's index version (the config's, a resumed run's, or LATEST's;
    default ``IndexRetriever.load``: the version loaded in this process; tasks/adapters/torchrun_launcher.py passes
    the Dask-held one that all ranks share); ``data_options``: fsspec options for task files at remote URLs
    (S3 credentials)."""
    recipe = Recipe(config, store, logger=logger, distributed=distributed, retriever=retriever,
                    open_retriever=open_retriever, data_options=data_options)
    try:
        recipe.setup()
        recipe.train()
        return recipe.save()
    finally:
        recipe.cleanup()

