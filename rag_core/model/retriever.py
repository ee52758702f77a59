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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag_core.errors import WikiragError
from rag_core.index.embedding_files import read_ref
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


class VersionRetriever:
    """What the RAG model asks of any retriever beside ``retrieve``: the version's manifest, name and encoder,
    read from ``self.index`` (an in-process ShardedIndex, or tasks.adapters.dask_retriever's Dask-held one)."""

    index: Any

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


class IndexRetriever(VersionRetriever):
    """A published index version plus the exact vectors of its passages."""

    def __init__(self, index: ShardedIndex, vectors: list[np.ndarray]) -> None:
        if len(vectors) != index.num_shards:
            raise RetrieverError(f"{len(vectors)} vector shards for {index.num_shards} index shards")
        self.index = index
        self.vectors = vectors  # [shard] -> float32 [n_s, dim]

    @classmethod
    def load(cls, store: Store, version: str | None = None) -> IndexRetriever:
        """Load a version (LATEST's when None) and the embedding files its manifest names."""
        index = ShardedIndex.load(store, version)
        manifest = IndexManifest.model_validate(index.manifest)
        vectors = [stored_vectors(store, manifest, entry.shard, index.passage_ids(entry.shard))
                   for entry in manifest.shards]
        return cls(index, vectors)

    def retrieve(self, question_vectors: Any, n_docs: int) -> Retrieved:
        """The top ``n_docs`` passages of each question; fewer passages than ``n_docs`` in all is an error."""
        n_docs = check_n_docs(self.version, self.index.ntotal, n_docs)
        scores, shards, rows = self.index.search_rows(question_vectors, n_docs)  # each [batch, n_docs]

        def passage(s: int, r: int) -> tuple[str, str | None, str | None]:
            hit = self.index.hit(s, r, 0.0)
            return hit.passage_id, hit.title, hit.text

        dim = self.vectors[0].shape[1]
        return assemble(self.version, scores, shards, rows, dim, passage, lambda s, r: self.vectors[s][r])


def stored_vectors(store: Store, manifest: IndexManifest, shard: int, passage_ids: list[str]) -> np.ndarray:
    """float32 ``[n, dim]``: shard ``shard``'s embedding file (sha256-checked), row for row its ``passage_ids``."""
    require_embeddings(manifest)
    entry = manifest.shards[shard]
    ids, matrix = read_ref(store, entry.embeddings)
    if ids != passage_ids:
        raise RetrieverError(f"index {manifest.version} shard {entry.shard}: {store.url_of(entry.embeddings.ids)} "
                             "lists other passages than the index shard; the version is damaged: rebuild it")
    return matrix


def require_embeddings(manifest: IndexManifest) -> None:
    """An error unless every shard of the version names its embedding files."""
    if any(entry.embeddings is None for entry in manifest.shards):
        raise RetrieverError(f"index {manifest.version} records no embedding files (published from bare "
                             "vectors); RAG needs them: build the version with build_version or index_rebuild")


def check_n_docs(version: str | None, ntotal: int, n_docs: Any) -> int:
    """``n_docs`` as an int, or an error when it is not positive or the index holds fewer passages."""
    n_docs = check_k(n_docs)
    if ntotal < n_docs:
        raise RetrieverError(f"index {version} holds {ntotal} passages; n_docs={n_docs} needs at least that many")
    return n_docs


def assemble(version: str | None, scores: np.ndarray, shards: np.ndarray, rows: np.ndarray, dim: int,
             passage: Callable[[int, int], tuple[str, str | None, str | None]],
             vector: Callable[[int, int], np.ndarray]) -> Retrieved:
    """A :class:`Retrieved` from a merged top-k ``(scores, shards, rows)``, each ``[batch, n_docs]``, and where
    the index keeps each row's ``(passage_id, title, text)`` and stored vector (in process, or on Dask workers)."""
    if (rows < 0).any():  # an approximate index may return fewer than asked
        raise RetrieverError(f"index {version} returned fewer than {rows.shape[1]} passages for a question; "
                             "raise efSearch/nprobe or use a Flat index")
    doc_vectors = np.empty((*rows.shape, dim), dtype=np.float32)  # [batch, n_docs, dim]
    ids, titles, texts = [], [], []
    for b, (q_shards, q_rows) in enumerate(zip(shards, rows)):
        found = [passage(int(s), int(r)) for s, r in zip(q_shards, q_rows)]
        for j, (s, r) in enumerate(zip(q_shards, q_rows)):
            doc_vectors[b, j] = vector(int(s), int(r))
        ids.append([p[0] for p in found])
        titles.append([p[1] or "" for p in found])
        texts.append([p[2] or "" for p in found])
    return Retrieved(ids, titles, texts, doc_vectors, scores.astype(np.float32))
