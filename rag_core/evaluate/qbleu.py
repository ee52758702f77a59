"""Q-BLEU-1 (Nema & Khapra, EMNLP 2018), the RAG paper's metric for Jeopardy! question generation.

BLEU rewards any shared word; a generated clue that keeps the function words
and loses the entity is not answerable. Q-BLEU mixes BLEU with an
*answerability* score that weighs word classes differently. The paper's definition, which we follow:

    P_avg = sum_i w_i * h_i / |l_i(generated)|      R_avg = sum_i w_i * h_i / |l_i(reference)|
    Answerability = 2 * P_avg * R_avg / (P_avg + R_avg)
    Q-BLEU-1 = delta * Answerability + (1 - delta) * BLEU-1

over the classes i of named entities (ne), question words (qt), relevant content words (re) and
function words (fw); ``l_i(q)`` are the words of class i in q and ``h_i`` the class-i words of the
generated clue that match the reference's class-i words (clipped counts, as BLEU clips). A class
absent from a clue adds nothing to its sum: the weights are not renormalised (the released script
scores an empty class about 0 too), so a perfect clue without a question word, as most Jeopardy!
clues are, scores 1 - delta * w_qt = 0.86.

Choices, where the paper leaves room:
- Weights: the authors' released script's example for SQuAD (the RAG paper uses the SQuAD-tuned
  metric): ne 0.6, qt 0.2, re 0.1, fw 0.1 (1 - the others), delta 0.7.
- Word classes as that script finds them, made disjoint: question words (what, which, who, ... and
  the word after "what"/"which") first, then function words (a closed list), then capitalised words
  (named entities), then the rest. The script lets a word sit in two classes ("The" at the start of
  a clue is both an entity and a function word); the paper treats the classes as a partition.
- The released script averages per-class F1 scores instead of taking the F1 of the weighted P and R
  above; we implement the paper's formula.
- Tokens: sacrebleu's 13a tokenizer, punctuation tokens dropped, matched lower-cased (the script's
  PTB tokenizer lower-cases and drops punctuation). Clipped unigram counts come from sacrebleu's
  n-gram extraction and BLEU-1 from sacrebleu itself, on the same tokens.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU
from sacrebleu.metrics.helpers import extract_all_word_ngrams
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

CLASSES = ("ne", "qt", "re", "fw")
QUESTION_WORDS = frozenset({"what", "which", "why", "who", "whom", "whose", "where", "when", "how"})
# Closed-class English words (determiners, pronouns, prepositions, conjunctions, auxiliaries).
FUNCTION_WORDS = frozenset([
    "a", "an", "the", "this", "that", "these", "those", "some", "any", "each", "every", "no", "both", "either",
    "neither", "all", "such", "own", "same", "other", "i", "me", "my", "mine", "myself", "we", "us", "our", "ours",
    "ourselves", "you", "your", "yours", "yourself", "yourselves", "he", "him", "his", "himself", "she", "her",
    "hers", "herself", "it", "its", "itself", "they", "them", "their", "theirs", "themselves", "one", "in", "on",
    "at", "by", "for", "from", "to", "of", "with", "without", "into", "onto", "upon", "about", "above", "below",
    "over", "under", "between", "among", "through", "during", "before", "after", "since", "until", "till",
    "against", "toward", "towards", "across", "along", "around", "behind", "beyond", "near", "off", "out", "up",
    "down", "via", "per", "than", "as", "and", "or", "but", "nor", "so", "yet", "if", "then", "else", "because",
    "while", "whereas", "although", "though", "unless", "whether", "once", "is", "am", "are", "was", "were", "be",
    "been", "being", "have", "has", "had", "having", "do", "does", "did", "doing", "will", "would", "shall",
    "should", "can", "could", "may", "might", "must", "ought", "not", "very", "too", "also", "just", "only", "here",
    "there", "again", "further", "more", "most", "less", "least", "few", "s", "t", "don"
])


@dataclass(frozen=True)
class QBleuWeights:
    ne: float = 0.6  # named entities
    qt: float = 0.2  # question words
    re: float = 0.1  # relevant content words
    delta: float = 0.7  # answerability's share; BLEU-1 gets 1 - delta

    @property
    def fw(self) -> float:  # function words get what is left
        return 1.0 - self.ne - self.qt - self.re


SQUAD_WEIGHTS = QBleuWeights()


@functools.cache
def _bleu1() -> BLEU:
    # tokenize="none": the words are tokenized (and lower-cased) once, here, for both parts of the score
    return BLEU(max_ngram_order=1, tokenize="none", smooth_method="none", effective_order=True)


@functools.cache
def _tokenizer() -> Tokenizer13a:
    return Tokenizer13a()


def words(text: str) -> list[str]:
    """13a tokens without punctuation, case kept (capitals mark entities)."""
    return [t for t in _tokenizer()(text).split() if any(ch.isalnum() for ch in t)]


def word_classes(tokens: Sequence[str]) -> dict[str, list[str]]:
    """The lower-cased words of each class: qt, then fw, then ne (capitalised), then re."""
    out: dict[str, list[str]] = {c: [] for c in CLASSES}
    after_wh = False
    for token in tokens:
        low = token.lower()
        if low in QUESTION_WORDS or after_wh:
            cls = "qt"
        elif low in FUNCTION_WORDS:
            cls = "fw"
        elif token[0].isupper():
            cls = "ne"
        else:
            cls = "re"
        out[cls].append(low)
        after_wh = low in ("what", "which")
    return out


def answerability(generated: str, reference: str, weights: QBleuWeights = SQUAD_WEIGHTS) -> float:
    """The paper's answerability: the F1 of the class-weighted precision and recall."""
    gen, ref = word_classes(words(generated)), word_classes(words(reference))
    precision = recall = 0.0
    for cls in CLASSES:
        gen_counts, _ = extract_all_word_ngrams(" ".join(gen[cls]), 1, 1)
        ref_counts, _ = extract_all_word_ngrams(" ".join(ref[cls]), 1, 1)
        matched = sum((Counter(gen_counts) & Counter(ref_counts)).values())  # clipped, as BLEU clips
        weight = getattr(weights, cls)
        if gen[cls]:
            precision += weight * matched / len(gen[cls])
        if ref[cls]:
            recall += weight * matched / len(ref[cls])
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def qbleu1(generated: str, references: Sequence[str], weights: QBleuWeights = SQUAD_WEIGHTS) -> float:
    """Q-BLEU-1 of one generated clue in [0, 1]: the best over the references."""
    hyp = " ".join(words(generated)).lower()
    best = 0.0
    for reference in references:
        bleu = _bleu1().sentence_score(hyp, [" ".join(words(reference)).lower()]).score / 100.0
        best = max(best, weights.delta * answerability(generated, reference, weights) + (1 - weights.delta) * bleu)
    return best
