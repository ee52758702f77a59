"""Evaluation: the paper's metrics per task kind, retrieval recall, and each kind's headline metric.

Names load on first use: the cloze task needs only the answer normalisation,
not sacrebleu and rouge-score.
"""

_LAZY = {
    **dict.fromkeys(("DEFAULT_KS", "HEADLINE", "EvaluationError", "bleu1", "exact_match", "f1_score", "headline_each",
                     "label_match", "regex_match", "rouge_l", "score"), "rag_core.evaluate.metrics"),
    "normalize_answer": "rag_core.evaluate.normalize",
    **dict.fromkeys(("QBleuWeights", "answerability", "qbleu1"), "rag_core.evaluate.qbleu"),
    **dict.fromkeys(("RetrievedPassage", "has_answer", "retrieval_scores", "retrieved_passages"),
                    "rag_core.evaluate.retrieval"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rag_core.evaluate' has no attribute {name!r}")


__all__ = [
    "DEFAULT_KS", "HEADLINE", "EvaluationError", "QBleuWeights", "RetrievedPassage", "answerability", "bleu1",
    "exact_match", "f1_score", "has_answer", "headline_each", "label_match", "normalize_answer", "qbleu1",
    "regex_match", "retrieval_scores", "retrieved_passages", "rouge_l", "score",
]
