"""Two models on the same questions, question by question: what the second gained and lost against the first, and
whether that difference is more than chance.

On a few dozen questions, a gap of a few points between two means comes from a handful of changed answers,
so a gate that compares means also says how many answers changed each way. The exact two-sided sign test on
those changed answers (questions both models got right, or both wrong, say nothing about which is better)
gives the chance of a split at least this uneven between two equally good models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def gained_lost(first: Sequence[float], second: Sequence[float]) -> tuple[int, int]:
    """``(gained, lost)``: questions the second model scores higher than the first, and the reverse, from each
    model's per-question score in the same question order (1 right, 0 wrong for EM or answer-in-output: gained
    is then right where the first was wrong; graded scores such as ROUGE-L count any rise or fall)."""
    if len(first) != len(second):
        raise ValueError(f"the two models scored {len(first)} and {len(second)} questions; give the same questions")
    gained = sum(1 for a, b in zip(first, second, strict=True) if b > a)
    lost = sum(1 for a, b in zip(first, second, strict=True) if a > b)
    return gained, lost


# Below this p-value a split of changed answers is more than chance: what the summary says, and what the gate on
# real questions asks of a fine-tune before it replaces its zero-shot start
CHANCE = 0.05


def beyond_chance(gained: int, lost: int) -> bool:
    """More answers gained than lost, by a split that equally good models give with probability under CHANCE."""
    return gained > lost and sign_test(gained, lost) < CHANCE


def sign_test(gained: int, lost: int) -> float:
    """The exact two-sided sign test's p-value: under equally good models each changed answer goes either way
    with probability 1/2; 1.0 when nothing changed."""
    n, low = gained + lost, min(gained, lost)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(low + 1)) / 2**n
    return min(1.0, 2 * tail)
