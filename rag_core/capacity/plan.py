"""What an index rebuild of a dump will take, from the dump's multistream index and measured rates.

:func:`predict` is arithmetic only: the dump's size and the :class:`Rates`
that :mod:`rag_core.capacity.calibration` measured on a few of its
streams give passages, bytes per stage, RAM per worker and hours
per stage; the index factory comes from the index stage's own ``auto`` rule
(:func:`rag_core.index.faiss_index.choose_factory`) with the workers' memory as
its budget, and the shard count from the embedding stage's rule, raised until
one shard's build fits a worker. :func:`check_budget` refuses, in one line of
numbers, a plan that exceeds a :class:`Budget`.

The model (each figure per the whole run, W = workers, one core each):

* passages = the dump's compressed bytes x passages per compressed byte of
  the sampled streams (bytes, not pages: article length varies along a dump,
  and a stream's compressed size follows its text);
* disk: the dump, the passages (Parquet bytes per passage as sampled), the
  embeddings (4 * dim + id bytes per passage) and the index version (the
  factory's bytes per vector + its passage table); the peak is their sum (a
  rebuild keeps all of them);
* hours: start-up, then per stage (ingest, embed, index) its CPU seconds over W,
  CPU = fixed + overhead x calibrated compute (dump bytes / bytes parsed per CPU
  second, passages / passages encoded per CPU second, vectors / vectors indexed
  per CPU second; see STAGE_OVERHEAD);
* RAM per worker: the worker's base (interpreter, torch, FAISS) + the largest
  of the encoder's working set, one shard's build (vectors + index) and its
  share of the whole index when the workers serve search (index bytes / W).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from rag_core.errors import WikiragError
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.faiss_index import (
    HNSW_EXTRA_BYTES,
    HNSW_M,
    IVF_ID_BYTES,
    PQ_SUBQUANTIZERS,
    IndexBuildError,
    IndexConfig,
    fast_scan_bytes,
)

GB = 1e9
# What a stage costs beyond the compute a calibration times, from bench/scale_bench.py's 30,000- and
# 100,000-passage rebuilds (its 300,000 and 1,000,000 are the checks): the process tree's CPU per stage was
# fixed + overhead x the calibrated compute. Ingest and embed also read and write parts, hash texts and log
# Prefect task runs (about 10 s for a worker's model load and the stage's gates); the index stage reads vectors
# only. Embed's factor is fitted on 100,000-passage rebuilds of two days, each against its own calibration,
# because the small encoder's calibration pass swings more from day to day than the stage itself does.
STAGE_OVERHEAD = {"ingest": 1.35, "embed": 0.95, "index": 1.15}
STAGE_FIXED_CPU_S = {"ingest": 10.0, "embed": 10.0, "index": 0.0}
# Wall time of the Prefect server and Dask cluster coming up and the publish (62-82 s there, loaded machine).
STARTUP_S = 60.0
# A Dask worker's resident memory before it holds data: Python, torch, transformers, FAISS, pyarrow imported
# (bench/scale_bench.py's worker peak at 30,000 passages, rounded up).
WORKER_BASE_BYTES = 900 * 1024**2
NO_FACTORY = "none fits"  # the plan's factory when no index family fits the workers' memory
EMBEDDING_ID_BYTES = 24  # the ids file beside each vector file: passage id and 64-bit text hash, compressed


class CapacityError(WikiragError):
    """The rebuild does not fit the budget given (disk, memory per worker, deadline)."""


class Budget(BaseModel):
    """What the rebuild may use; None = not limited. Also the options of ``wikirag plan``."""

    model_config = ConfigDict(frozen=True)

    workers: int = Field(1, ge=1, description="Dask workers, one core each")
    worker_memory_gb: float | None = Field(None, gt=0, description="RAM of one worker, in GB")
    disk_gb: float | None = Field(None, gt=0, description="disk for the dump and the store together, in GB")
    deadline_hours: float | None = Field(None, gt=0, description="hours the whole rebuild may take")


@dataclass(frozen=True, slots=True)
class Rates:
    """What a calibration measured: per page, per passage and per vector, on one core."""

    passages_per_dump_byte: float  # passages per compressed byte of the sampled streams
    parse_bytes_per_cpu_s: float  # compressed dump bytes parsed, cleaned and chunked per CPU second
    embed_passages_per_cpu_s: float
    index_vectors_per_cpu_s: float
    passage_bytes: float  # Parquet bytes per passage (the passages stage)
    index_text_bytes: float  # the index version's passage table, bytes per passage
    dim: int
    encoder_bytes: int  # the encoder's weights in memory
    fast_scan: bool = True  # False: auto's fast-scan missed the recall target on the calibration's vectors
    refused_index_cpu_s: float = 0.0  # the refused fast-scan's calibration build: the rebuild tries it once too


@dataclass(slots=True)
class Plan:
    """A rebuild's predicted cost; ``over`` lists what exceeds the budget (empty: it fits)."""

    dump: str
    pages: int
    passages: int
    factory: str
    shards: int
    disk_bytes: dict[str, float]
    hours: dict[str, float]
    worker_memory_bytes: float
    budget: Budget
    rates: Rates
    stream_bytes: int
    over: list[str] = field(default_factory=list)

    @property
    def disk_total(self) -> float:
        return sum(self.disk_bytes.values())

    @property
    def hours_total(self) -> float:
        return sum(self.hours.values())

    def summary(self) -> dict:
        """The plan as plain JSON values (bytes in GB, times in hours)."""
        return {"dump": self.dump, "pages": self.pages, "passages": self.passages, "factory": self.factory,
                "shards": self.shards, "workers": self.budget.workers,
                "disk_gb": {k: round(v / GB, 3) for k, v in self.disk_bytes.items()},
                "store_gb": round((self.disk_total - self.disk_bytes["dump"]) / GB, 3),
                "disk_total_gb": round(self.disk_total / GB, 3),
                "hours": {k: round(v, 4) for k, v in self.hours.items()}, "hours_total": round(self.hours_total, 4),
                "worker_memory_gb": round(self.worker_memory_bytes / GB, 2), "budget": self.budget.model_dump(),
                "fits": not self.over, "over": self.over, "rates": asdict(self.rates),
                "dump_bytes": int(self.disk_bytes["dump"]), "stream_bytes": self.stream_bytes}


def index_bytes_per_vector(factory: str, dim: int) -> float:
    """Bytes per vector of the factories ``auto`` picks (the same table as choose_factory's)."""
    graph = 8 * HNSW_M + HNSW_EXTRA_BYTES
    if factory == "Flat":
        return 4 * dim
    if factory == f"HNSW{HNSW_M}":
        return 4 * dim + graph
    if factory == f"HNSW{HNSW_M}_SQ8":
        return dim + graph
    if factory.endswith(",RFlat"):
        return fast_scan_bytes(dim)
    if factory.endswith(",SQ8"):
        return dim + IVF_ID_BYTES
    if ",PQ" in factory:
        return int(factory.rsplit(",PQ", 1)[1]) + IVF_ID_BYTES
    return 4 * dim  # an explicit factory outside the auto tiers: as large as the raw vectors


def predict(dump: str, pages: int, dump_bytes: int, rates: Rates, budget: Budget,
            embed: EmbedConfig | None = None, stream_bytes: int | None = None, factory: str = "auto") -> Plan:
    """The plan for a dump of ``pages`` pages at ``rates`` under ``budget`` (``over`` filled in, nothing raised).

    ``stream_bytes``: the dump's bytes after its header stream, what the rates were measured on (default: all).
    ``factory``: the rebuild's FAISS factory; ``auto`` plans what auto would pick under the budget.
    """
    stream_bytes = dump_bytes if stream_bytes is None else stream_bytes
    embed = embed or EmbedConfig()
    w = budget.workers
    passages = max(1, round(stream_bytes * rates.passages_per_dump_byte))
    memory = None if budget.worker_memory_gb is None else budget.worker_memory_gb * GB
    index_budget = None if memory is None else max(1, int(w * (memory - WORKER_BASE_BYTES)))
    try:
        # the rebuild's own rule (its IVF lists sized by its training sample), asked as the rebuild asks it
        factory = IndexConfig(factory=factory, memory_budget_bytes=index_budget).resolve_factory(
            passages, rates.dim, total_vectors=passages, shards=embed.num_shards(passages), fast_scan=rates.fast_scan)
        per_vector = index_bytes_per_vector(factory, rates.dim)
    except IndexBuildError:  # not even the smallest tier fits: size it as that tier, the memory check refuses
        factory, per_vector = NO_FACTORY, PQ_SUBQUANTIZERS[-1] + IVF_ID_BYTES
    shards = embed.num_shards(passages)
    build_bytes = 4 * rates.dim + per_vector  # one shard's vectors and its index, while it is built
    if memory is not None and memory > WORKER_BASE_BYTES:
        per_shard_cap = max(1, int((memory - WORKER_BASE_BYTES) / build_bytes))
        shards = max(shards, math.ceil(passages / per_shard_cap))
    shard_n = math.ceil(passages / shards)
    serve_bytes = passages * per_vector / w  # searching, the workers hold the version's shards between them
    worker_memory = WORKER_BASE_BYTES + max(2 * rates.encoder_bytes, shard_n * build_bytes, serve_bytes)
    disk = {"dump": float(dump_bytes), "passages": passages * rates.passage_bytes,
            "embeddings": passages * (4 * rates.dim + EMBEDDING_ID_BYTES),
            "index": passages * (per_vector + rates.index_text_bytes)}
    compute = {"ingest": stream_bytes / rates.parse_bytes_per_cpu_s,
               "embed": passages / rates.embed_passages_per_cpu_s,
               "index": passages / rates.index_vectors_per_cpu_s + refused_try(passages, rates)}
    hours = {"start-up, publish": STARTUP_S / 3600} | {
        stage: (STAGE_FIXED_CPU_S[stage] + STAGE_OVERHEAD[stage] * cpu_s) / w / 3600 for stage, cpu_s in compute.items()}
    plan = Plan(dump, pages, passages, factory, shards, disk, hours, worker_memory, budget, rates, stream_bytes)
    plan.over = over_budget(plan)
    return plan


def refused_try(passages: int, rates: Rates) -> float:
    """CPU seconds a rebuild spends on auto's fast-scan before refusing it. It trains and tunes it once, on its
    training sample, whatever the version's size; the calibration's own try, on a shard's worth of vectors, stands
    for that (tuning searches the same queries at any size)."""
    return 0.0 if rates.fast_scan else rates.refused_index_cpu_s


def over_budget(plan: Plan) -> list[str]:
    """Each figure of ``plan`` above its budget, as 'what: need X (budget Y)'."""
    b, over = plan.budget, []
    if b.disk_gb is not None and plan.disk_total > b.disk_gb * GB:
        over.append(f"disk {plan.disk_total / GB:,.3g} GB (budget {b.disk_gb:g} GB)")
    if b.worker_memory_gb is not None and plan.worker_memory_bytes > b.worker_memory_gb * GB:
        over.append(f"RAM per worker {plan.worker_memory_bytes / GB:,.3g} GB (budget {b.worker_memory_gb:g} GB)")
    if b.deadline_hours is not None and plan.hours_total > b.deadline_hours:
        over.append(f"time {plan.hours_total:,.3g} h with {b.workers} workers (deadline {b.deadline_hours:g} h)")
    return over


def check_budget(plan: Plan) -> Plan:
    """``plan`` when it fits its budget; otherwise CapacityError with the numbers, in one line."""
    if plan.over:
        raise CapacityError(
            f"{plan.dump}: a rebuild of {plan.passages:,} passages ({plan.factory}, {plan.shards} shards) does not "
            f"fit: {'; '.join(plan.over)}; raise the budget or add workers")
    return plan
