"""Retrieval for the RAG model: top-n passages of a published index, with their stored vectors.

RAG's doc scores are inner products of the question embedding with the
retrieved passages' embeddings, computed in torch so that gradients reach the
question encoder while the documents stay frozen. The index finds the
passages (approximately, for HNSW or PQ); the vectors come from the embedding
files the index was built from (exact float32, whatever the index compresses),
so ``doc_scores`` do not depend on the index family.

The manifest names the embedding files each shard was built from, with their
sha256; those files are never rewritten while a version uses them. Loading
checks both hashes and that the embedding and index shards list the same
passage ids, row for row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rag_core.errors import WikiragError
from rag_core.index.embeddings import read_ref
from rag_core.index.manifest import IndexManifest
from rag_core.index.search import ShardedIndex, check_k
from rag_core.storage import Store


class RetrieverError(WikiragError):
    """An index version whose stored vectors cannot serve retrieval."""


@dataclass
class Retrieved:
    """The top ``n_docs`` passages of each question, best first."""

    passage_ids: list[list[str]]  # [batch][n_docs]
    titles: list[list[str]]  # [batch][n_docs]
    texts: list[list[str]]  # [batch][n_docs]
    doc_vectors: np.ndarray  # float32 [batch, n_docs, dim]: stored passage embeddings
    index_scores: np.ndarray  # float32 [batch, n_docs]: what the index returned (for reports)

    @property
    def n_docs(self) -> int:
        return self.doc_vectors.shape[1]


class IndexRetriever:
    """A published index version plus the exact vectors of its passages."""

    def __init__(self, index: ShardedIndex, vectors: list[np.ndarray]) -> None:
        if len(vectors) != len(index.shards):
            raise RetrieverError(f"{len(vectors)} vector shards for {len(index.shards)} index shards")
        self.index = index
        self.vectors = vectors  # [shard] -> float32 [n_s, dim]

    @classmethod
    def load(cls, store: Store, version: str | None = None) -> IndexRetriever:
        """Load a version (LATEST's when None) and the embedding files its manifest names."""
        index = ShardedIndex.load(store, version)
        manifest = IndexManifest.model_validate(index.manifest)
        vectors = []
        for entry in manifest.shards:
            if entry.embeddings is None:
                raise RetrieverError(f"index {manifest.version} records no embedding files (published from bare "
                                     "vectors); RAG needs them: build the version with build_version or index_rebuild")
            ids, matrix = read_ref(store, entry.embeddings)
            if ids != index.passage_ids(entry.shard):
                raise RetrieverError(f"index {manifest.version} shard {entry.shard}: {store.url_of(entry.embeddings.ids)} "
                                     "lists other passages than the index shard; the version is damaged: rebuild it")
            vectors.append(matrix)
        return cls(index, vectors)

    @property
    def manifest(self) -> dict[str, Any]:
        return self.index.manifest

    @property
    def version(self) -> str | None:
        return self.index.version

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The encoder fingerprint the index was built with (what a question encoder must match)."""
        return self.manifest["encoder"]

    def retrieve(self, question_vectors: Any, n_docs: int) -> Retrieved:
        """The top ``n_docs`` passages of each question; fewer passages than ``n_docs`` in all is an error."""
        n_docs = check_k(n_docs)
        if self.index.ntotal < n_docs:
            raise RetrieverError(f"index {self.version} holds {self.index.ntotal} passages; n_docs={n_docs} "
                                 "needs at least that many")
        scores, shards, rows = self.index.search_rows(question_vectors, n_docs)  # each [batch, n_docs]
        if (rows < 0).any():  # an approximate index may return fewer than asked
            raise RetrieverError(f"index {self.version} returned fewer than {n_docs} passages for a question; "
                                 "raise efSearch/nprobe or use a Flat index")
        dim = self.vectors[0].shape[1]
        doc_vectors = np.empty((*rows.shape, dim), dtype=np.float32)  # [batch, n_docs, dim]
        ids, titles, texts = [], [], []
        for b in range(rows.shape[0]):
            hits = [self.index.hit(int(s), int(r), float(x)) for s, r, x in zip(shards[b], rows[b], scores[b])]
            ids.append([h.passage_id for h in hits])
            titles.append([h.title or "" for h in hits])
            texts.append([h.text or "" for h in hits])
            for j, (s, r) in enumerate(zip(shards[b], rows[b])):
                doc_vectors[b, j] = self.vectors[int(s)][int(r)]
        return Retrieved(ids, titles, texts, doc_vectors, scores.astype(np.float32))
