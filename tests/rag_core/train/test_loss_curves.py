"""Loss curves: the moving average that smooths a noisy train loss, and the one figure of train and dev loss."""

from __future__ import annotations

import random

import pytest
from matplotlib.figure import Figure

from rag_core.train.loss_curves import draw_losses, ema


def test_the_moving_average_starts_at_the_first_value_and_keeps_a_constant() -> None:
    assert ema([5.0, 5.0, 5.0]) == pytest.approx([5.0, 5.0, 5.0])
    assert ema([4.0, 0.0], weight=0.5) == pytest.approx([4.0, 4.0 / 3.0])  # (0.5*2 + 0) / (1 - 0.25)


def test_the_moving_average_shows_a_falling_trend_under_batch_noise() -> None:
    rng = random.Random(0)
    trend = [10.0 - 0.25 * step for step in range(24)]
    noisy = [t + rng.uniform(-4, 4) for t in trend]  # "15 -> 2.6 -> 11": single batches hide the trend
    smooth = ema(noisy)
    def jitter(values: list[float]) -> float:
        return sum(abs(b - a) for a, b in zip(values, values[1:])) / (len(values) - 1)

    assert jitter(smooth[4:]) < jitter(noisy) / 3
    assert smooth[-1] < smooth[4] - 2


def test_train_and_dev_loss_are_drawn_on_one_figure() -> None:
    axes = Figure().add_subplot()
    draw_losses(axes, [(1, 3.0), (2, 2.0), (3, 2.5)], [(0, 4.0), (3, 2.2)], "generated-qa")
    labels = [line.get_label() for line in axes.get_lines()]
    assert labels[1:] == ["generated-qa: train loss (moving average, 0.8)", "generated-qa: dev loss"]
    assert list(axes.get_lines()[2].get_xdata()) == [0, 3]
