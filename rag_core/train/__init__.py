"""Training: task data, the fine-tuning recipe, checkpoints, run tracking."""
