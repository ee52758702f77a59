"""The registered model's code (MLflow "models from code": nothing is pickled).

MLflow runs this file when it loads a ``wikirag-<task>`` model; the saved RAG
model (question encoder, generator, rag.json) is the ``rag_model`` artifact,
and ``model_config`` binds it to an index: ``{"store": URL, "index_version":
V, "n_docs": N}``. The store's credentials come from the loading process's
environment (AWS_*), never from the model. ``predict`` takes questions (a
list of strings, or a DataFrame with a ``question`` column) and returns one
record per question: ``{"question", "answer", "provenance": [{"passage_id",
"title", "score"}, ...]}`` (rag_core.model.answers).
"""

from __future__ import annotations

from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel


class WikiragRagModel(PythonModel):
    """A RAG model bound to an index version on a store."""

    def load_context(self, context: Any) -> None:
        from flows.settings import Settings
        from rag_core.model.rag_model import RagModel
        from rag_core.model.retriever import IndexRetriever

        config = dict(context.model_config or {})
        store = Settings().open_store(config["store"])
        retriever = IndexRetriever.load(store, config.get("index_version"))
        overrides = {"n_docs": int(config["n_docs"])} if config.get("n_docs") else None
        self.model = RagModel.from_pretrained(context.artifacts["rag_model"], retriever, overrides)

    def predict(self, context, model_input, params=None):  # no type hints: MLflow would read them as a schema
        from rag_core.model.answers import MAX_NEW_TOKENS, answer

        if hasattr(model_input, "columns"):  # a DataFrame (what `mlflow models serve` hands over)
            column = "question" if "question" in model_input.columns else model_input.columns[0]
            questions = [str(q) for q in model_input[column].tolist()]
        elif isinstance(model_input, str):
            questions = [model_input]
        else:
            questions = [str(q) for q in model_input]
        max_new_tokens = int((params or {}).get("max_new_tokens", MAX_NEW_TOKENS))
        return answer(self.model, questions, max_new_tokens=max_new_tokens)


mlflow.models.set_model(WikiragRagModel())
