"""The key under which `wikirag finetune` reuses a registered version instead of training and gating again."""

from __future__ import annotations

from rag_core.train.train_config import TrainConfig
from tasks.finetune import GATE_RULE, fingerprint


def test_a_rerun_reuses_a_version_only_under_the_same_recipe_evaluation_and_gate(monkeypatch) -> None:
    """A version's alias was decided by its gate: another margin or rule revision must not reuse that decision."""
    config = TrainConfig(task="nq", train="train.jsonl", dev="dev.jsonl", index_version="v1")
    key = fingerprint(config, "64|32|fast|auto", 0.0)
    assert key == fingerprint(TrainConfig.model_validate(config.model_dump()), "64|32|fast|auto", 0)  # stable
    assert key != fingerprint(config, "64|32|fast|auto", 0.01)  # another margin: gate again
    assert key != fingerprint(config, "64|32|thorough|auto", 0.0)  # another evaluation
    assert key != fingerprint(config.model_copy(update={"max_steps": config.max_steps + 1}), "64|32|fast|auto", 0.0)
    monkeypatch.setattr("tasks.finetune.GATE_RULE", GATE_RULE + 1)
    assert key != fingerprint(config, "64|32|fast|auto", 0.0)  # the rule changed since: gate again
