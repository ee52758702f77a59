"""The fine-tuning recipe in one process: real tiny BERT, BART and Llama, a real FAISS index of real passages.

The torchrun (gloo) tests are in test_recipe_ddp.py; they share the fixtures here.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from rag_core.train.checkpoints import CheckpointError, latest_checkpoint, load_model, read_checkpoint, step_folder
from rag_core.train.recipe import run
from rag_core.train.tracking import MemoryLogger
from rag_core.train.train_config import (Distributed, TrainConfig, TrainConfigError, lr_factor, micro_positions,
                                         trajectory_key, warmup_steps)
from tests.helpers.training import gradients, make_config, max_difference, parameters

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- pure parts


def test_schedule_warms_up_then_decays() -> None:
    config = TrainConfig(task="nq", train="x", warmup_steps=4, max_steps=14)
    assert [lr_factor(s, config) for s in (0, 2, 3, 4, 9, 14)] == [0.2, 0.6, 0.8, 1.0, 0.5, 0.0]
    # by default a tenth of the steps warm up, then the rate decays to 0 at the last step
    default = TrainConfig(task="nq", train="x", max_steps=24)
    assert default.schedule == "linear" and warmup_steps(default) == 2
    assert [lr_factor(s, default) for s in (0, 1, 2, 13, 24)] == [pytest.approx(1 / 3), pytest.approx(2 / 3), 1.0,
                                                                   0.5, 0.0]
    assert warmup_steps(default.model_copy(update={"max_steps": 1})) == 0
    cosine = config.model_copy(update={"schedule": "cosine"})
    assert lr_factor(9, cosine) == pytest.approx(0.5) and lr_factor(4, cosine) == 1.0
    assert lr_factor(13, config.model_copy(update={"schedule": "constant"})) == 1.0


@pytest.mark.parametrize(("world", "accum"), [(1, 1), (2, 1), (2, 3), (4, 2)])
def test_every_example_of_a_global_batch_is_read_once(world: int, accum: int) -> None:
    config = TrainConfig(task="nq", train="x", batch_size=24, grad_accum=accum)
    for step in (0, 5):
        read = sorted(k for micro in range(accum) for rank in range(world)
                      for k in micro_positions(step, micro, rank, world, config))
        assert read == list(range(step * 24, (step + 1) * 24))
    assert Distributed.from_environ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == Distributed(1, 4, 1)
    assert Distributed.from_environ({}) == Distributed(0, 1, 0)


def test_the_trajectory_key_changes_with_the_recipe_not_with_run_control() -> None:
    config = TrainConfig(task="nq", train="x", output="runs/a")
    key = trajectory_key(config)
    assert trajectory_key(config.model_copy(update={"output": "runs/b", "max_steps": 7, "threads": 2})) == key
    assert trajectory_key(config.model_copy(update={"lr": 1e-4})) != key
    assert trajectory_key(config.model_copy(update={"train_generator_layers": 10})) != key


# ----------------------------------------------------------------------------- runs


def test_a_run_logs_checkpoints_saves_and_reloads(tiny: SimpleNamespace, tmp_path: Path) -> None:
    logger = MemoryLogger()
    config = make_config(tiny, "runs/logged", max_steps=4, checkpoint_every=2, keep_checkpoints=1, eval_every=2)
    result = run(config, tiny.store, logger=logger)
    assert result.final_step == 4 and len(result.losses) == 4 and result.resumed_from is None
    assert [s for s, _ in result.dev_losses] == [0, 2, 4] and result.index_version == tiny.version
    assert [s for s, _ in logger.metrics["loss"]] == [1, 2, 3, 4] and len(logger.metrics["lr"]) == 4
    assert all(v > 0 for _, v in logger.metrics["examples_per_s"])
    assert logger.params["n_docs"] == 2 and logger.params["world_size"] == 1
    assert logger.params["resolved_index_version"] == tiny.version and logger.params["frozen_parameters"] > 0
    assert [folder for _, folder in logger.artifacts] == ["plots"]
    assert Path(logger.artifacts[0][0]).name == "loss_curve.png"

    output = tiny.store.child("runs/logged")
    assert output.list("checkpoints") == [step_folder(4)]  # keep_checkpoints=1: the older one went
    assert json.loads(output.read_bytes("result.json"))["model_url"] == result.model_url
    model = load_model(output.child("model"), _retriever(tiny), tmp_path / "model")
    assert model.trained_index_version == tiny.version
    saved = parameters(tiny, "runs/logged", 4)
    assert all(torch.equal(p.detach(), saved[name]) for name, p in model.named_parameters())
    assert len(model.generate(["Who was Achilles?"], max_new_tokens=3)) == 1


def _retriever(tiny: SimpleNamespace):
    from rag_core.model.retriever import IndexRetriever

    return IndexRetriever.load(tiny.store, tiny.version)


def test_gradient_accumulation_equals_the_larger_batch(tiny: SimpleNamespace) -> None:
    run(make_config(tiny, "runs/accum1", batch_size=8, grad_accum=1, max_steps=1), tiny.store)
    run(make_config(tiny, "runs/accum4", batch_size=8, grad_accum=4, max_steps=1), tiny.store)
    assert max_difference(gradients(tiny, "runs/accum1"), gradients(tiny, "runs/accum4")) < 1e-6
    # Adam's step is g / (|g| + eps): float rounding in gradients near eps moves a weight by up to ~1e-5 x lr
    one, four = parameters(tiny, "runs/accum1", 1), parameters(tiny, "runs/accum4", 1)
    assert max_difference(one, four) < 1e-2 * 1e-3
    start = load_file(Path(tiny.bart) / "model.safetensors")  # where both runs started
    moved = [float((one[f"generator.{k}"] - v).abs().max()) for k, v in start.items() if f"generator.{k}" in one]
    assert len(moved) > 10 and max(moved) > 1e-4  # the steps changed the weights: the comparison above can fail
    with pytest.raises(TrainConfigError, match="not a multiple of 1 processes x grad_accum 3"):
        run(make_config(tiny, "runs/bad", batch_size=8, grad_accum=3), tiny.store)


@pytest.mark.parametrize("generator", ["bart", "llama"])
def test_micro_batches_and_activation_checkpointing_give_the_gradient_of_the_whole_batch(tiny: SimpleNamespace,
                                                                                  generator: str) -> None:
    """One example per micro-batch (the default) with activations recomputed per block, against 8 examples at once."""
    path = getattr(tiny, generator)
    run(make_config(tiny, f"runs/whole-{generator}", generator=path, batch_size=8, max_steps=1, grad_accum=1),
        tiny.store)
    saving = make_config(tiny, f"runs/saving-{generator}", generator=path, batch_size=8, max_steps=1,
                         activation_checkpointing=True)
    assert saving.grad_accum is None
    run(saving, tiny.store)
    whole, micro = gradients(tiny, f"runs/whole-{generator}"), gradients(tiny, f"runs/saving-{generator}")
    largest = max(float(g.abs().max()) for g in whole.values())
    assert largest > 1e-3  # real gradients: the comparison can fail
    # float32 rounding of sums in another order: 4e-6 of the largest on an AMD EPYC (llama), under 1e-6 on an Intel
    # Xeon; a lost or doubled micro-batch would be off by an eighth of it
    assert max_difference(whole, micro) < 1e-5 * largest, (max_difference(whole, micro), largest)


def test_resume_is_exact_and_ignores_half_written_checkpoints(tiny: SimpleNamespace) -> None:
    """Dropout on: the generators' states must be restored too. (A real SIGKILL: test_recipe_ddp.py.)"""
    same = {"checkpoint_every": 2, "dropout": 0.1, "schedule": "constant"}  # max_steps may change on resume
    whole = run(make_config(tiny, "runs/whole", max_steps=6, **same), tiny.store)
    run(make_config(tiny, "runs/cut", max_steps=3, **same), tiny.store)  # checkpoints at 2 and 3 (the end)
    checkpoints = tiny.store.child("runs/cut/checkpoints")
    checkpoints.remove(step_folder(3))  # as if it had been killed before 3: it resumes from 2
    checkpoints.child(step_folder(4)).write_bytes(b"partial", "model.safetensors")  # killed while writing 4
    assert latest_checkpoint(checkpoints) == 2
    resumed = run(make_config(tiny, "runs/cut", max_steps=6, **same), tiny.store)
    assert resumed.resumed_from == 2 and resumed.losses == whole.losses
    assert max_difference(parameters(tiny, "runs/whole", 6), parameters(tiny, "runs/cut", 6)) == 0.0
    assert max_difference(parameters(tiny, "runs/whole", 6), parameters(tiny, "runs/whole", 4)) > 1e-4

    with pytest.raises(TrainConfigError, match=r"differs from the checkpoint's in \['lr'\]"):
        run(make_config(tiny, "runs/cut", max_steps=8, lr=5e-4, **same), tiny.store)
    damaged = checkpoints.child(step_folder(6))
    damaged.write_bytes(damaged.read_bytes("optimizer.safetensors")[:-8], "optimizer.safetensors")
    with pytest.raises(CheckpointError, match="does not match its manifest"):
        run(make_config(tiny, "runs/cut", max_steps=8, **same), tiny.store)


@pytest.mark.parametrize("generator", ["bart", "llama"])
def test_a_few_dozen_cloze_steps_lower_the_dev_loss(tiny: SimpleNamespace, generator: str) -> None:
    config = make_config(tiny, f"runs/learn-{generator}", generator=getattr(tiny, generator), max_steps=30,
                         batch_size=8, lr=3e-3, max_dev_examples=16, dropout=None, kind="token")
    result = run(config, tiny.store)
    (_, before), (_, after) = result.dev_losses[0], result.dev_losses[-1]
    print(f"\n{generator}: dev loss {before:.2f} -> {after:.2f} after 30 steps; {result.examples_per_s:.1f} examples/s")
    assert after < 0.9 * before


@pytest.mark.parametrize(("generator", "trained"), [
    ("llama", ("generator.model.layers.1.", "generator.model.norm.")),  # the last of 2 blocks and the final norm
    ("bart", ("generator.model.decoder.layers.0.",)),  # BART's decoder has 1 block and no final norm
])
def test_training_the_last_blocks_leaves_the_rest_of_the_generator_as_loaded(tiny: SimpleNamespace, generator: str,
                                                                             trained: tuple[str, ...]) -> None:
    path = getattr(tiny, generator)
    whole, last = MemoryLogger(), MemoryLogger()
    run(make_config(tiny, f"runs/all-{generator}", generator=path, max_steps=1), tiny.store, logger=whole)
    run(make_config(tiny, f"runs/last-{generator}", generator=path, max_steps=1, train_generator_layers=1),
        tiny.store, logger=last)
    start = {f"generator.{k}": v for k, v in load_file(Path(path) / "model.safetensors").items()}
    after = parameters(tiny, f"runs/last-{generator}", 1)
    moved = {name for name, value in start.items() if name in after and not torch.equal(value, after[name])}
    assert moved == {name for name in start if name in after and name.startswith(trained)}, sorted(moved)
    stated = read_checkpoint(tiny.store.child(f"runs/last-{generator}/checkpoints"), 1).state.param_names
    assert {n for n in stated if not n.startswith("question_encoder.")} == moved  # the optimizer holds no frozen one
    assert any(n.startswith("question_encoder.") for n in stated)  # the question tower still trains
    assert last.params["train_generator_layers"] == 1
    assert last.params["trainable_parameters"] < whole.params["trainable_parameters"]


def test_a_frozen_question_encoder_is_left_out_of_the_optimizer(tiny: SimpleNamespace) -> None:
    logger = MemoryLogger()
    run(make_config(tiny, "runs/frozen-question-encoder", max_steps=1, train_question_encoder=False), tiny.store,
        logger=logger)
    run(make_config(tiny, "runs/trained-question-encoder", max_steps=1), tiny.store)
    frozen, trained = (read_checkpoint(tiny.store.child(f"runs/{name}/checkpoints"), 1).state.param_names
                       for name in ("frozen-question-encoder", "trained-question-encoder"))
    tower = {n for n in trained if n.startswith("question_encoder.")}
    assert tower and set(frozen) == set(trained) - tower  # the generator trains as before, the tower not at all
    assert not any(k.startswith("question_encoder.") for k in gradients(tiny, "runs/frozen-question-encoder"))
    assert logger.params["train_question_encoder"] is False


def test_weight_mix_registers_the_midpoint_of_the_start_and_the_trained_weights(tiny: SimpleNamespace,
                                                                               tmp_path: Path) -> None:
    """WiSE-FT: checkpoints keep the weights as trained; the saved model is start + 0.5 * (trained - start)."""
    logger = MemoryLogger()
    mixed = make_config(tiny, "runs/mixed", weight_mix=0.5)
    result = run(mixed, tiny.store, logger=logger)
    trained = parameters(tiny, "runs/mixed", 2)
    run(make_config(tiny, "runs/as-trained"), tiny.store)
    assert max_difference(trained, parameters(tiny, "runs/as-trained", 2)) == 0.0  # the mix never reaches a checkpoint

    start = {f"generator.{k}": v for k, v in load_file(Path(tiny.bart) / "model.safetensors").items()}
    saved = dict(load_model(tiny.store.child("runs/mixed/model"), _retriever(tiny), tmp_path / "m").named_parameters())
    shared = [name for name in start if name in trained]
    moved = [name for name in shared if float((trained[name] - start[name]).abs().max()) > 1e-4]
    assert len(moved) > 10  # the steps changed the weights: the midpoint differs from both ends
    for name in shared:
        torch.testing.assert_close(saved[name].detach(), (start[name] + trained[name]) / 2, rtol=0, atol=1e-6)
    as_trained = load_model(tiny.store.child("runs/as-trained/model"), _retriever(tiny), tmp_path / "t")
    assert all(torch.equal(p.detach(), trained[name]) for name, p in as_trained.named_parameters() if name in trained)

    # the saved model has its own dev loss beside the trajectory's; a rerun of the finished run mixes from the start
    assert result.mixed_dev_loss is not None and result.mixed_dev_loss != result.dev_losses[-1][1]
    assert logger.metrics["mixed_dev_loss"] == [(2, result.mixed_dev_loss)]
    again = run(mixed, tiny.store)
    assert again.resumed_from == 2 and again.mixed_dev_loss == pytest.approx(result.mixed_dev_loss, abs=1e-6)
    resaved = load_model(tiny.store.child("runs/mixed/model"), _retriever(tiny), tmp_path / "m2").named_parameters()
    assert all(torch.equal(p.detach(), saved[name].detach()) for name, p in resaved)
