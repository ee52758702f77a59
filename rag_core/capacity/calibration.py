"""Rates measured on this machine from a few of the dump's own streams, for :func:`rag_core.capacity.plan.predict`.

:func:`sample_rates` parses ``n_streams`` streams spread over the dump (the same
reader, cleaner and chunker as ingest) and encodes up to ``max_passages`` of their
passages with the rebuild's encoder; :func:`index_rates` builds and tunes an index
of a factory the plan may use over ``index_vectors`` vectors like them. Rates are
per CPU second of this process (one worker = one core), so the plan scales them
by the workers it is given.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from rag_core.capacity.plan import Rates
from rag_core.errors import DumpError
from rag_core.index.encoders import Encoder, EncoderConfig, packaged_model_path
from rag_core.index.faiss_index import IndexConfig, TrainedIndex, build_tuned_shard, fast_scan_falls_short
from rag_core.parquet_bytes import table_to_parquet
from rag_core.wiki.dumps import DumpSource
from rag_core.wiki.multistream import Stream, StreamShard, iter_shard_pages, read_index
from rag_core.wiki.passages import passages_from_pages


def read_streams(index: DumpSource, dump_bytes: int) -> list[Stream]:
    """The index's streams, checked against the dump's size (an index of another dump is refused)."""
    streams = read_index(index)
    if streams[-1].offset >= dump_bytes:
        raise DumpError(f"{index.name}: its last stream starts at byte {streams[-1].offset:,}, past the dump's "
                        f"{dump_bytes:,} bytes; give the index published with this dump")
    return streams


def sample_shards(streams: list[Stream], dump_bytes: int, n_streams: int) -> list[StreamShard]:
    """``n_streams`` single-stream shards spread evenly over the dump (first and last included)."""
    n = min(n_streams, len(streams))
    picks = sorted({round(i * (len(streams) - 1) / max(1, n - 1)) for i in range(n)})
    shards = []
    for i in picks:
        end = streams[i + 1].offset if i + 1 < len(streams) else dump_bytes
        shards.append(StreamShard(0, 1, streams[i].offset, end, (streams[i],)))
    return shards


EMBED_REPEATS = 3
PARSE_REPEATS = 2
# A whole default shard (EmbedConfig.passages_per_shard): tuning costs a shard the same at any size, so a smaller
# calibration index would charge it to fewer vectors and over-predict the index stage
SHARD_VECTORS = 20_000
CALIBRATION_NOISE = 0.3  # expected distance of a calibration vector from the sampled unit vector it copies


def _cpu(fn):
    start = time.process_time()
    result = fn()
    return result, max(time.process_time() - start, 1e-6)


def _weights_bytes(config: EncoderConfig) -> int:
    folder = Path(config.path) if config.path else packaged_model_path()
    return sum(p.stat().st_size for p in folder.glob("*") if p.suffix in (".safetensors", ".bin"))


def sample_rates(dump: DumpSource, streams: list[Stream], dump_bytes: int, encoder: EncoderConfig | None = None, *,
                 n_streams: int = 8, max_passages: int = 256) -> tuple[Rates, np.ndarray]:
    """Parse and embed rates on a sample of the dump, and the sampled passages' vectors; the index is timed
    apart, once per factory, by :func:`index_rates` (its fields here are Flat's, untimed)."""
    shards = sample_shards(streams, dump_bytes, n_streams)

    def parse() -> tuple[pa.Table, int]:
        table = pa.concat_tables(passages_from_pages(iter_shard_pages(dump, shard))[0] for shard in shards)
        return table, len(table_to_parquet(table))  # ingest writes its parts: their encoding is part of the cost

    # the best of 2: the first pass also pays the dump's first reads and the parser's imports, once per worker
    parsed = [_cpu(parse) for _ in range(PARSE_REPEATS)]
    (table, parquet_bytes), parse_cpu = parsed[0][0], min(cpu for _, cpu in parsed)
    sampled_bytes = sum(shard.end - shard.start for shard in shards)
    if table.num_rows == 0:
        raise DumpError(f"{dump.name}: the {len(shards)} sampled streams hold no article text; "
                        "give a pages-articles dump")
    # spread over every sampled stream: the first rows are one stream's articles, of one length and kind
    sample = table.take(np.unique(np.linspace(0, table.num_rows - 1, min(max_passages, table.num_rows)).astype(int)))
    titles, texts = sample.column("title").to_pylist(), sample.column("text").to_pylist()
    config = encoder or EncoderConfig()
    model = Encoder.load(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a worker of one core: idle threads would spin and count as CPU time here
    try:
        model.encode_passages(titles[:8], texts[:8])  # first-call set-up is once per worker, not per passage
        # the best of 3: a small encoder's pass takes a fraction of a second, where one hiccup counts double
        timed = [_cpu(lambda: model.encode_passages(titles, texts)) for _ in range(EMBED_REPEATS)]
        vectors, embed_cpu = timed[0][0], min(cpu for _, cpu in timed)
    finally:
        torch.set_num_threads(threads)

    passage_bytes = parquet_bytes / table.num_rows
    text_bytes = len(table_to_parquet(table.select(["passage_id", "title", "text"]))) / table.num_rows
    rates = Rates(passages_per_dump_byte=table.num_rows / sampled_bytes, parse_bytes_per_cpu_s=sampled_bytes / parse_cpu,
                  embed_passages_per_cpu_s=len(texts) / embed_cpu, index_vectors_per_cpu_s=math.inf,
                  passage_bytes=passage_bytes, index_text_bytes=text_bytes, dim=int(vectors.shape[1]),
                  encoder_bytes=_weights_bytes(config))
    return rates, vectors


def index_rates(rates: Rates, vectors: np.ndarray, factory: str, index_vectors: int = SHARD_VECTORS) -> Rates:
    """``rates`` with the index stage timed on ``factory`` over ``index_vectors`` vectors around ``vectors``, and
    whether auto's fast-scan reaches the recall target on them (``fast_scan``)."""
    rng = np.random.default_rng(0)
    base = vectors[rng.integers(len(vectors), size=index_vectors)]
    # distinct vectors around the sampled ones, each moved by the same distance at any width
    noisy = base + rng.normal(scale=CALIBRATION_NOISE / np.sqrt(base.shape[1]), size=base.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    (index, report), index_cpu = _cpu(lambda: build_tuned_shard(noisy.astype(np.float32), IndexConfig(factory=factory)))
    # the rebuild's own test (train_version_index): a fast-scan that misses here would fall back there
    fast_scan = not fast_scan_falls_short(TrainedIndex(factory, index, report), IndexConfig().recall_target)
    return dataclasses.replace(rates, index_vectors_per_cpu_s=index_vectors / index_cpu, fast_scan=fast_scan)
