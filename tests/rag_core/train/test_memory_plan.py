"""The memory plan of a training rank (rag_core/train/memory_plan.py) and `wikirag finetune`'s refusal before it starts.

Parameter counts are checked against the real loaded models; the refusal runs the real command on a
real published index and generator, asking for more ranks than any machine holds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rag_core.index.versions import read_index_manifest
from rag_core.model.generators import load_generator, train_last_blocks
from rag_core.train.memory_plan import (
    TrainingMemoryError,
    check_fits,
    check_training_memory,
    plan_memory,
    tensor_shapes,
    trained_count,
)
from rag_core.train.train_config import TrainConfig
from runtime.process_groups import die_with_parent

ROOT = Path(__file__).resolve().parents[3]


def _config(tiny: SimpleNamespace, **fields) -> TrainConfig:
    return TrainConfig.model_validate({"task": "cloze", "train": tiny.train, "dev": tiny.dev,
                                       "generator": tiny.llama, **fields})


def test_parameters_are_counted_from_the_weights_headers_as_the_loaded_model_has_them(tiny: SimpleNamespace) -> None:
    model, _ = load_generator(Path(tiny.llama))
    shapes = tensor_shapes(Path(tiny.llama))
    assert trained_count(shapes, None) == sum(p.numel() for p in model.parameters())  # tied head counted once
    train_last_blocks(model, 1)
    assert trained_count(shapes, 1) == sum(p.numel() for p in model.parameters() if p.requires_grad)
    with pytest.raises(TrainingMemoryError, match=r"no \*\.safetensors weights"):
        tensor_shapes(Path(tiny.root))


def test_the_plan_grows_with_what_a_rank_holds(tiny: SimpleNamespace) -> None:
    manifest = read_index_manifest(tiny.store, tiny.version)
    encoder = Path(manifest.encoder_config["path"])

    def plan(**fields):
        return plan_memory(_config(tiny, **fields), manifest, Path(tiny.llama), encoder, world_size=2,
                           precision="float32")

    base = plan(n_docs=2)
    assert base.index > manifest.count * manifest.dim * 4  # the stored vectors, at least
    assert plan(n_docs=4).activations == pytest.approx(2 * base.activations)
    assert plan(n_docs=2, grad_accum=1).activations == pytest.approx(4 * base.activations)  # 4 examples at once
    assert plan(n_docs=2, activation_checkpointing=False).activations > base.activations
    assert plan(n_docs=2, train_generator_layers=1).optimizer < base.optimizer
    assert plan(n_docs=2, weight_mix=0.5).optimizer == pytest.approx(base.optimizer + 4 * base.trained)  # the start
    assert plan(n_docs=2, rank_memory="fast").runtime > base.runtime  # ranks that keep their freed heap
    assert plan_memory(_config(tiny), None, Path(tiny.llama), encoder, world_size=2, precision="float32").index == 0


def test_ranks_that_do_not_fit_are_refused_in_one_line_with_the_numbers(tiny: SimpleNamespace) -> None:
    manifest = read_index_manifest(tiny.store, tiny.version)
    plan = check_training_memory(_config(tiny), 1, manifest, available=1e12)
    assert plan is not None and plan.per_rank > 0.9e9
    with pytest.raises(TrainingMemoryError) as refused:
        check_fits(plan, 4, available=3 * plan.per_rank + plan.checkpoint)
    message = str(refused.value)
    assert "\n" not in message
    assert re.search(r"4 training process\(es\) need about 4 x \d+\.\d GB \+ \d+\.\d GB for rank 0's checkpoints "
                     r"= \d+\.\d GB \(runtime .* GB each\) but "
                     r"\d+\.\d GB of memory is available; lower --nproc or --n-docs", message), message
    check_fits(plan, 3, available=3 * plan.per_rank + plan.checkpoint)  # exactly enough passes
    assert check_training_memory(_config(tiny, generator=None), 64, manifest, available=1.0) is None  # small BART


@pytest.mark.slow
def test_wikirag_finetune_refuses_more_ranks_than_memory_before_starting_anything(tiny: SimpleNamespace,
                                                                                   tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "WIKIRAG_HOME": str(home), "WIKIRAG_STORE": tiny.store.url, "PYTHONPATH": str(ROOT),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-m", "cli.wikirag", "finetune", "--task", "cloze", "--train", tiny.train,
                           "--dev", tiny.dev, "--generator", tiny.llama, "--nproc", "100000", "--max-steps", "1"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=die_with_parent)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "100000 training process(es) need about 100000 x" in errors[0], done.stderr[-3000:]
    assert "lower --nproc" in errors[0] and "Traceback" not in done.stderr
    assert not (home / "prefect").exists() and not (tmp_path / "mlflow.db").exists()  # nothing started
    assert not tiny.store.exists("runs")  # no training output
