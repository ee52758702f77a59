"""Training configs for the tiny models and the parameters and gradients a run leaves, to compare runs."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from safetensors.torch import load_file

from rag_core.train.checkpoints import step_folder
from rag_core.train.train_config import TrainConfig


def make_config(tiny: SimpleNamespace, output: str, **fields) -> TrainConfig:
    """Small and exact: float32, no dropout (unless asked), one thread, 2 documents, 64 context tokens."""
    base = {"task": "cloze", "train": tiny.train, "dev": tiny.dev, "generator": tiny.bart, "n_docs": 2,
            "max_context_length": 64, "lr": 1e-3, "batch_size": 4, "max_steps": 2, "checkpoint_every": 0,
            "precision": "float32", "max_dev_examples": 8, "dropout": 0.0, "threads": 1, "output": output}
    return TrainConfig.model_validate({**base, **fields})


def parameters(tiny: SimpleNamespace, output: str, step: int) -> dict[str, torch.Tensor]:
    return load_file(tiny.root / "store" / output / "checkpoints" / step_folder(step) / "model.safetensors")


def gradients(tiny: SimpleNamespace, output: str) -> dict[str, torch.Tensor]:
    """The first step's gradients: Adam's first moment after one step is (1 - beta1) * gradient."""
    state = load_file(tiny.root / "store" / output / "checkpoints" / step_folder(1) / "optimizer.safetensors")
    return {k: v / 0.1 for k, v in state.items() if k.endswith(".exp_avg")}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)
