"""Two models on the same questions (rag_core/evaluate/paired.py): changed answers counted each way, and the exact
sign test's p-values worked by hand."""

from __future__ import annotations

import pytest

from rag_core.evaluate.paired import beyond_chance, gained_lost, sign_test


def test_changed_answers_are_counted_each_way_and_agreements_are_not() -> None:
    start = [1, 0, 1, 0, 1, 0]
    tuned = [0, 1, 1, 0, 1, 1]  # loses question 0, gains 1 and 5; 2-4 agree
    assert gained_lost(start, tuned) == (2, 1)
    assert gained_lost(tuned, start) == (1, 2)
    assert gained_lost(start, start) == (0, 0)
    with pytest.raises(ValueError, match="scored 2 and 3 questions"):
        gained_lost([1, 0], [1, 0, 1])


def test_graded_scores_count_every_rise_and_fall() -> None:
    start = [0.5, 0.2, 0.9, 0.0]
    tuned = [0.6, 0.2, 0.1, 0.3]  # rises on 0 and 3, falls on 2, ties on 1
    assert gained_lost(start, tuned) == (2, 1)


@pytest.mark.parametrize(("gained", "lost", "p"), [
    (0, 0, 1.0),  # nothing changed: no evidence
    (3, 3, 1.0),  # an even split
    (5, 0, 2 / 32),  # all five one way: 2 * (1/2)^5
    (0, 5, 2 / 32),  # two-sided
    (8, 1, 2 * (1 + 9) / 512),  # 2 * P(X <= 1), X ~ Binomial(9, 1/2)
    (4, 2, 2 * (1 + 6 + 15) / 64),
])
def test_the_sign_test_matches_the_binomial_tail_worked_by_hand(gained: int, lost: int, p: float) -> None:
    assert sign_test(gained, lost) == pytest.approx(p)


@pytest.mark.parametrize(("gained", "lost", "better"), [
    (5, 4, False),  # one question's lead: what chance gives
    (5, 0, False),  # p = 0.0625: five changes are too few to tell, however they fall
    (6, 0, True),  # p = 0.03125
    (8, 1, True),  # p = 0.039
    (1, 8, False),  # as uneven, the wrong way
])
def test_beyond_chance_asks_for_more_gained_than_lost_at_p_under_five_percent(gained: int, lost: int,
                                                                              better: bool) -> None:
    assert beyond_chance(gained, lost) is better
