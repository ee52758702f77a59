"""A published index of real sample passages with the real all-MiniLM-L6-v2, for the generated-QA tests.

The round trip needs a retriever that finds passages by meaning: a random tiny encoder would keep
or drop pairs by chance. The passages are those of the sample that the question rules ask about,
plus the first 40 (questions about nothing), so the index is small (about 120 passages, a few
seconds to embed) and every candidate question has its passage in it.
"""

from __future__ import annotations

import pyarrow as pa

from rag_core.storage import Store
from rag_core.train.generated_qa import candidate_pairs
from tests.helpers.passagefiles import publish_small_index, sample_passages


def asked_passages() -> pa.Table:
    """The sample's passages that give at least one candidate pair, and the first 40 passages."""
    passages = sample_passages()
    asked = {pair["passage_id"] for pair in candidate_pairs(passages, per_passage=3)}
    ids = passages.column("passage_id").to_pylist()
    keep = [i < 40 or pid in asked for i, pid in enumerate(ids)]
    return passages.filter(pa.array(keep, pa.bool_()))


def publish_minilm_index(store: Store, dump_id: str, shards: int = 2) -> str:
    """Publish :func:`asked_passages` and a Flat index of them with the real MiniLM (float32); returns the version."""
    import torch

    from rag_core.index.encoders import Encoder, EncoderConfig

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        encoder = Encoder.load(EncoderConfig(dtype="float32", engine="torch"))
        return publish_small_index(store, dump_id, asked_passages(), encoder, shards)
    finally:
        torch.set_num_threads(threads)
