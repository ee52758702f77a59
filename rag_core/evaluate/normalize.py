"""Answer normalisation as SQuAD v1.1's official evaluate script defines it.

Lower case, punctuation removed, the articles "a", "an", "the" removed,
whitespace collapsed. EM, F1, answer recall and the data gate's train/dev
overlap check all compare strings through it.
"""

from __future__ import annotations

import re
import string

_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)  # what the script's character filter drops
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's ``normalize_answer``: lower, drop punctuation, drop articles, collapse whitespace."""
    text = text.lower().translate(_DROP_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())
