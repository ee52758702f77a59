"""The main job's plots (tasks/reports.py), drawn by matplotlib and read back as pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colors
from matplotlib.image import imread

from tasks.qa_gate import ModelScores, QAGate
from tasks.reports import GATE_BARS, RECALL_KS, plot_gate, plot_recall


def _gate(values: dict[str, float], **fields) -> QAGate:
    scores = {model: ModelScores(em=v, f1=v, answer_in_output=v, examples=40) for model, v in values.items()}
    return QAGate(test_questions=40, sources={"written": 40}, scores=scores, name="wikirag-qa", version="3",
                  alias="challenger", reason="kept as challenger", **fields)


def _mask(image: np.ndarray, color: str) -> np.ndarray:
    """Where an RGBA image read back from PNG has ``color`` (one of matplotlib's default cycle)."""
    return np.abs(image[..., :3] - np.array(colors.to_rgb(color))).max(axis=-1) < 0.02


def _area(image: np.ndarray, color: str) -> int:
    return int(_mask(image, color).sum())


def test_the_gate_plot_draws_each_model_as_tall_as_its_scores(tmp_path: Path) -> None:
    gate = _gate({"closed-book": 0.1, "zero-shot": 0.3, "fine-tuned": 0.6}, gained=12, lost=0)
    path = plot_gate(gate, tmp_path / "real_questions.png")
    image = imread(path)
    assert image.shape[:2] == (380, 640)
    # one colour per model in GATE_BARS' order (closed-book, zero-shot, fine-tuned), three bars each of its scores'
    # height; the legend's swatches add the same small area to every colour
    areas = [_area(image, f"C{i}") for i in range(len(GATE_BARS))]
    assert 1.8 < areas[2] / areas[1] < 2.2 and 2.6 < areas[1] / areas[0] < 3.4


def test_the_gate_plot_is_left_out_when_no_question_was_scored(tmp_path: Path) -> None:
    gate = QAGate(test_questions=0, sources={}, scores={}, name="wikirag-qa", version="", alias="not registered",
                  reason="no held-out real question is answerable from this index")
    assert plot_gate(gate, tmp_path / "real_questions.png") is None
    assert not (tmp_path / "real_questions.png").exists()


def _rows(image: np.ndarray, color: str) -> np.ndarray:
    """The image rows (0 at the top) holding pixels of ``color``."""
    return np.nonzero(_mask(image, color).any(axis=1))[0]


def test_the_recall_plot_shows_the_real_questions_below_a_generated_set_at_one(tmp_path: Path) -> None:
    """A generated set retrieves its own passage by construction (recall 1 at every k); the real held-out
    questions' curve is the one that says something, and it is drawn where its values are."""
    real = dict(zip(RECALL_KS, (0.2, 0.4, 0.6, 0.8, 0.9), strict=True))
    path = plot_recall({"generated-qa": {f"dev_answer_recall_at_{k}": 1.0 for k in RECALL_KS},
                        "real held-out questions": {f"dev_answer_recall_at_{k}": v for k, v in real.items()}},
                       tmp_path / "retrieval_recall.png")
    image = imread(path)
    left = image[:, : image.shape[1] * 35 // 100]  # k = 1 and 2; the legend sits at the lower right
    generated, held_out = _rows(left, "C0"), _rows(left, "C1")
    # there the generated curve is a flat line at the top, and the real one lies far below it (recall 0.2-0.4)
    assert generated.max() - generated.min() < 0.05 * image.shape[0]
    assert held_out.min() - generated.max() > 0.3 * image.shape[0]
    assert plot_recall({"generated-qa": {}}, tmp_path / "none.png") is None
