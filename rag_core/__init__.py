"""wikirag's library: dumps, passages, storage, retrieval and RAG math.

Pure functions and small classes over torch, transformers, faiss, numpy,
pyarrow and fsspec; it never imports prefect, dask, mlflow or great_expectations.
"""

from rag_core.errors import DumpError, GateError, StoreError, WikiragError
from rag_core.storage import Store
from rag_core.wiki.dumps import DumpSource, Page, iter_pages
from rag_core.wiki.ingest import IngestConfig, read_passages
from rag_core.wiki.multistream import StreamShard, iter_shard_pages, plan_shards, read_index
from rag_core.wiki.passages import PASSAGE_SCHEMA, PageCounts, passages_from_pages
from rag_core.wiki.wikitext import clean_wikitext

# torch, transformers and faiss take seconds to import: load the modules that
# need them on first use, so that ingest workers, which never do, start fast.
_LAZY = {
    "rag_sequence_nll": "rag_core.model.marginalize",
    "rag_token_nll": "rag_core.model.marginalize",
    "Encoder": "rag_core.index.encoders",
    "EncoderConfig": "rag_core.index.encoders",
    "EmbedConfig": "rag_core.index.embedding_files",
    "embed_rows": "rag_core.index.incremental_embedding",
    "IndexConfig": "rag_core.index.faiss_index",
    "build_shard_index": "rag_core.index.faiss_index",
    "publish_version": "rag_core.index.versions",
    "read_index_manifest": "rag_core.index.versions",
    "verify_version": "rag_core.index.versions",
    "IndexManifest": "rag_core.index.manifest",
    "GateConfig": "rag_core.index.plan",
    "build_version": "rag_core.index.build",
    "pin_version": "rag_core.index.retention",
    "unpin_version": "rag_core.index.retention",
    "delete_version": "rag_core.index.retention",
    "collect_garbage": "rag_core.index.retention",
    "ShardedIndex": "rag_core.index.search",
    "IndexRetriever": "rag_core.model.retriever",
    "rag_token_generate": "rag_core.model.decoding",
    "rag_sequence_generate": "rag_core.model.decoding",
    "SequenceHypotheses": "rag_core.model.decoding",
    "RagModel": "rag_core.model.rag_model",
    "RagConfig": "rag_core.model.rag_model",
    "GeneratorConfig": "rag_core.model.rag_model",
    "RetrievalBatch": "rag_core.model.rag_model",
    "QuestionEncoder": "rag_core.model.question_encoder",
    # task data and metrics: sacrebleu and rouge-score load with the metrics, not with rag_core
    **dict.fromkeys(("Example", "Provenance", "TaskDataError", "write_examples"), "rag_core.train.examples"),
    **dict.fromkeys(("TASK_KINDS", "load_task"), "rag_core.train.loaders"),
    **dict.fromkeys(("ClozeConfig", "cloze_task"), "rag_core.train.cloze"),
    **dict.fromkeys(("HEADLINE", "score"), "rag_core.evaluate.metrics"),
    "RetrievedPassage": "rag_core.evaluate.retrieval",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rag_core' has no attribute {name!r}")


__all__ = [
    *_LAZY,
    "PASSAGE_SCHEMA",
    "DumpError",
    "DumpSource",
    "GateError",
    "IngestConfig",
    "Page",
    "PageCounts",
    "Store",
    "StoreError",
    "StreamShard",
    "WikiragError",
    "clean_wikitext",
    "iter_pages",
    "iter_shard_pages",
    "passages_from_pages",
    "plan_shards",
    "read_index",
    "rag_sequence_nll",
    "rag_token_nll",
    "read_passages",
]
