"""Questions to passages from a published index version: a pure query, no flow run; and the untrained RAG model
over an index that ``wikirag ask`` and the main job's zero-shot start answer with.

The query encoder defaults to the one the index manifest records; any other
must match the index's fingerprint (same weights, pooling and normalisation),
or the search stops with a clear error rather than returning nonsense.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from rag_core.errors import WikiragError
from rag_core.index.manifest import IndexManifest
from rag_core.storage import Store


# Top-100 is the deepest cut-off the DPR and RAG papers report; 1000 leaves room for a re-ranker's candidates,
# stays under FAISS's GPU limit of k <= 2048, and holds one batch of answers to ~64,000 hits.
MAX_K = 1000
QUESTIONS_PER_BATCH = 64


class SearchConfig(BaseModel):
    """What a search asks for."""

    k: int = Field(5, ge=1, description=f"passages per question, at most {MAX_K} (MAX_K)")
    version: str | None = Field(None, description="index version; None = LATEST")
    encoder_path: str | None = Field(None, description="query encoder directory; None = the one the index records")
    question_encoder_path: str | None = Field(None, description="DPR question encoder directory; None = recorded")
    questions_per_batch: int = Field(QUESTIONS_PER_BATCH, ge=1, description="questions encoded, searched and "
                                     "printed together: memory stays that of one batch however long the file")

    @field_validator("k")
    @classmethod
    def _at_most_max_k(cls, k: int) -> int:
        if k > MAX_K:
            raise ValueError(f"-k {k} is over the cap of {MAX_K} passages per question; ask for at most {MAX_K}")
        return k


def batches(questions: Iterable[str], size: int) -> Iterator[list[str]]:
    """Consecutive lists of ``size`` questions (the last may be shorter), read only as each is asked for."""
    it = iter(questions)
    while batch := list(itertools.islice(it, size)):
        yield batch


def query_encoder_config(manifest: IndexManifest, encoder_path: str | None, question_path: str | None) -> Any:
    """The encoder to embed questions with: the flags', else the one recorded in the manifest."""
    from rag_core.index.encoders import EncoderConfig, EncoderError

    if encoder_path:
        return EncoderConfig(path=encoder_path, question_path=question_path)
    recorded = EncoderConfig(**(manifest.encoder_config or {}))
    for name in ("path", "question_path"):
        value = getattr(recorded, name)
        if value and not Path(value).expanduser().is_dir():
            raise EncoderError(f"index {manifest.version} was built with the encoder at {value}, which is not on "
                               "this machine; pass --encoder DIR (and --question-encoder DIR for DPR)")
    return recorded


def answer_questions(store: Store, questions: Iterable[str], config: SearchConfig | None = None, *,
                     dask_address: str | None = None) -> Iterator[dict]:
    """For each question, in order: ``{"question", "results": [{passage_id, title, text, score}, ...]}``.

    Lazy: questions are taken, encoded and searched ``config.questions_per_batch`` at a time as the
    caller iterates, so memory holds one batch. With ``dask_address`` the shards stay in that
    cluster's workers and only top-k lists come back; else they are loaded here.
    """
    from rag_core.index.encoders import Encoder, check_compatible
    from rag_core.index.search import ShardedIndex

    config = config or SearchConfig()
    with ExitStack() as stack:
        if dask_address:
            from distributed import Client

            from tasks.adapters.dask_retriever import DaskShardedIndex

            client = stack.enter_context(Client(dask_address))
            index: Any = stack.enter_context(DaskShardedIndex.load(client, store, config.version))
        else:
            index = ShardedIndex.load(store, config.version)
        manifest = IndexManifest.model_validate(index.manifest)
        if manifest.encoder is None:
            raise WikiragError(f"index {manifest.version} records no encoder (published from bare vectors); "
                               "it cannot be searched with questions")
        encoder = Encoder.load(query_encoder_config(manifest, config.encoder_path, config.question_encoder_path))
        check_compatible(manifest.encoder, encoder.fingerprint)
        for batch in batches(questions, config.questions_per_batch):
            hits = index.search(encoder.encode_questions(batch), config.k)
            for q, found in zip(batch, hits):
                yield {"question": q, "results": [{"passage_id": h.passage_id, "title": h.title, "text": h.text,
                                                   "score": round(h.score, 6)} for h in found]}


def untrained_model(store: Store, index: str | None, generator: str, *, kind: str = "sequence", n_docs: int = 5,
                    dtype: str = "float32") -> Any:
    """The index's own question encoder, the index and a generator folder, untrained: the paper's RAG before
    fine-tuning, as ``wikirag ask`` answers with it. (A fine-tune's own baseline is
    ``tasks.finetune.zero_shot_model``, built from its TrainConfig.)"""
    from rag_core.model.generators import GeneratorConfig
    from rag_core.model.rag_model import RagConfig, RagModel
    from rag_core.model.retriever import IndexRetriever

    retriever = IndexRetriever.load(store, index)
    question_encoder = query_encoder_config(IndexManifest.model_validate(retriever.manifest), None, None)
    config = RagConfig(kind=kind, n_docs=n_docs, question_encoder=question_encoder,
                       generator=GeneratorConfig(path=generator, dtype=dtype))
    return RagModel.create(config, retriever)
