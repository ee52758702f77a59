"""Loss curves a reader can see through: a batch's loss is noisy, so train loss is drawn smoothed beside dev loss.

One drawing, used by the recipe's ``loss_curve.png`` and the main job's ``training_loss.png``:
each step's train loss faint, its exponential moving average bold, and the dev loss (one point per
evaluation, step 0 = before training) on the same axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SMOOTHING = 0.8  # weight of the running average per step: a 24-step run still shows its trend after ~5 steps


def ema(values: Sequence[float], weight: float = SMOOTHING) -> list[float]:
    """The exponential moving average of ``values``, debiased (as TensorBoard's smoothing): the first point is
    the first value, not pulled towards 0."""
    out, running = [], 0.0
    for i, value in enumerate(values, start=1):
        running = weight * running + (1 - weight) * value
        out.append(running / (1 - weight ** i))
    return out


def draw_losses(axes: Any, losses: Sequence[tuple[int, float]], dev_losses: Sequence[tuple[int, float]] = (),
                label: str = "") -> None:
    """Train loss per step (faint), its :func:`ema` (bold) and dev loss (points joined) of one run on ``axes``."""
    prefix = f"{label}: " if label else ""
    if losses:
        steps, values = zip(*losses)
        line, = axes.plot(steps, values, linewidth=0.8, alpha=0.3)
        axes.plot(steps, ema(values), linewidth=2, color=line.get_color(),
                  label=f"{prefix}train loss (moving average, {SMOOTHING})")
    if dev_losses:
        axes.plot(*zip(*dev_losses), marker="o", linestyle="--", label=f"{prefix}dev loss")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("NLL per example")
