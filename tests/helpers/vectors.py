"""Clustered test vectors and the exact search and recall that approximate indexes are measured against."""

from __future__ import annotations

import faiss
import numpy as np


def clustered_vectors(n: int, dim: int, *, seed: int = 0, clusters: int | None = None,
                      spread: float = 0.5) -> np.ndarray:
    """Unit vectors around random centres: like real embeddings, unlike uniform noise (STACK.md).

    ``spread`` is the noise around a centre relative to the centres' scale: at
    1.0 clusters overlap and an approximate index needs a wide search.
    """
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters or max(1, n // 100), dim))
    x = centres[rng.integers(len(centres), size=n)] + spread * rng.normal(size=(n, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def exact_topk(base: np.ndarray, queries: np.ndarray, k: int, metric: str = "ip") -> np.ndarray:
    flat = faiss.IndexFlatIP(base.shape[1]) if metric == "ip" else faiss.IndexFlatL2(base.shape[1])
    flat.add(base)
    return flat.search(queries, k)[1]


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth)]))
