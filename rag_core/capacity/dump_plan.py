"""A dump's rebuild plan in one call: its index read, this machine calibrated, the plan predicted."""

from __future__ import annotations

import dataclasses
import re

from rag_core.capacity.calibration import SHARD_VECTORS, index_rates, read_streams, sample_rates
from rag_core.capacity.plan import NO_FACTORY, Budget, Plan, predict
from rag_core.errors import DumpError
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import EncoderConfig
from rag_core.wiki.dumps import DumpSource

MULTISTREAM_SUFFIX = "-multistream.xml.bz2"


def default_index(dump: str) -> str:
    """Where Wikimedia puts a multistream dump's index: beside it, ``...-multistream-index.txt.bz2``."""
    if not dump.endswith(MULTISTREAM_SUFFIX):
        raise DumpError(f"{dump}: not a multistream dump (...{MULTISTREAM_SUFFIX}); pass its index with --index")
    return dump.removesuffix(".xml.bz2") + "-index.txt.bz2"


def plan_rebuild(dump: str, index: str | None, budget: Budget, encoder: EncoderConfig | None = None, *,
                 embed: EmbedConfig | None = None, n_streams: int = 8, factory: str = "auto") -> Plan:
    """Pages from the index, rates from ``n_streams`` of the dump's streams, then :func:`predict`.

    The dump is parsed and embedded once; the index stage is timed on Flat, then again on the factory the plan
    picks when that is another (a graph or IVF index builds at its own rate).
    Where that is auto's fast-scan and it misses the recall target on the
    calibration's vectors (copies of the sampled passages' vectors, moved a
    little), the plan takes the next tier and calibrates that: the rebuild
    makes the same test on its own vectors
    (:func:`~rag_core.index.faiss_index.train_version_index`).
    """
    source = DumpSource(dump)
    dump_bytes = _size(source)  # a missing dump is named as such before its index is looked for
    index_source = DumpSource(index or default_index(dump))
    streams = read_streams(index_source, dump_bytes)
    pages = sum(len(s.page_ids) for s in streams)
    sampled, vectors = sample_rates(source, streams, dump_bytes, encoder, n_streams=n_streams)
    rates = index_rates(sampled, vectors, "Flat")
    plan = predict(dump, pages, dump_bytes, rates, budget, embed, dump_bytes - streams[0].offset, factory)
    calibrated = "Flat"
    while plan.factory not in (calibrated, NO_FACTORY):
        # IVF lists sized for the whole dump cannot train on a calibration sample: time adding and tuning on 64 lists
        calibrated = plan.factory
        again = index_rates(sampled, vectors, re.sub(r"IVF\d+", "IVF64", calibrated))
        # auto's fast-scan that missed on these vectors stays refused: the rebuild tries it, then takes the next tier
        refused = rates.refused_index_cpu_s or (0.0 if again.fast_scan else SHARD_VECTORS / again.index_vectors_per_cpu_s)
        rates = dataclasses.replace(again, fast_scan=again.fast_scan and rates.fast_scan, refused_index_cpu_s=refused)
        plan = predict(dump, pages, dump_bytes, rates, budget, embed, dump_bytes - streams[0].offset, factory)
    return plan


def _size(source: DumpSource) -> int:
    with source.open() as f:
        return f.seek(0, 2)
