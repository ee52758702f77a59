"""Training through the Dask-held index (tasks.adapters.dask_retriever.DaskRetriever, what ``--dask-address`` gives every
rank) is the same run as training on the index loaded in process: the same top-k passages at every retrieval and the
same loss at every step, on a real FAISS index of real sample passages, with the question tower trained."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from distributed import Client, LocalCluster

from rag_core.model.retriever import IndexRetriever, Retrieved
from rag_core.train.recipe import run
from tests.helpers.training import make_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STEPS = 4


class RecordingRetriever:
    """A real retriever whose every answer is kept, in order (the recipe's probe, training and dev retrievals)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.answers: list[Retrieved] = []

    def __getattr__(self, name: str) -> Any:  # manifest, version, fingerprint: the inner retriever's
        return getattr(self.inner, name)

    def retrieve(self, question_vectors: Any, n_docs: int) -> Retrieved:
        self.answers.append(self.inner.retrieve(question_vectors, n_docs))
        return self.answers[-1]


def _train(tiny: SimpleNamespace, output: str, retriever: Any, **fields) -> tuple[list[float], RecordingRetriever]:
    recording = RecordingRetriever(retriever)
    config = make_config(tiny, output, batch_size=4, max_steps=STEPS, schedule="constant", lr=1e-2, **fields)
    assert config.train_question_encoder  # the question tower moves, so later retrievals depend on earlier steps
    result = run(config, tiny.store, retriever=recording)
    assert len(result.losses) == STEPS
    return result.losses, recording


def test_training_through_the_dask_held_index_retrieves_the_same_passages_and_reaches_the_same_losses(
        tiny: SimpleNamespace) -> None:
    from tasks.adapters.dask_retriever import DaskRetriever

    local_losses, local = _train(tiny, "runs/equal-local", IndexRetriever.load(tiny.store, tiny.version))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        with DaskRetriever.load(client, tiny.store, tiny.version, share="equality") as shared:
            dask_losses, remote = _train(tiny, "runs/equal-dask", shared)

    assert len(remote.answers) == len(local.answers) >= STEPS
    for got, want in zip(remote.answers, local.answers):
        assert got.passage_ids == want.passage_ids  # the same top-k, in the same order
        assert np.array_equal(got.doc_vectors, want.doc_vectors)
    assert np.allclose(dask_losses, local_losses, rtol=0, atol=1e-6), (dask_losses, local_losses)

    # The comparison can fail: another data order retrieves other passages and reaches other losses.
    other_losses, other = _train(tiny, "runs/equal-seed1", IndexRetriever.load(tiny.store, tiny.version), seed=1)
    assert [a.passage_ids for a in other.answers] != [a.passage_ids for a in local.answers]
    assert max(abs(a - b) for a, b in zip(other_losses, local_losses)) > 1e-3
