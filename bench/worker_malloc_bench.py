"""Passage encoding in Dask workers: Dask's default nanny environment vs wikirag's local cluster.

    python bench/worker_malloc_bench.py [--passages 300] [--repeats 3] [--avx2] [--markdown FILE]

Dask's nanny starts each worker with ``MALLOC_TRIM_THRESHOLD_=65536``. Setting a
glibc malloc threshold freezes glibc's mmap threshold at 128 KiB, so every
activation buffer of an encoder batch larger than that is a fresh ``mmap`` whose
pages fault in again; wikirag's local cluster (runtime/local_cluster.py) drops the
variable and keeps glibc's adaptive thresholds. Side by side in one run: a
2-worker, 1-thread-per-worker cluster of each kind; in each, both workers load
the encoder (``dtype="auto"``), warm up, wait for each other, then encode the
same ``--passages`` real sample passages at once (the index rebuild's shape:
one shard per worker). A cluster's figure is the sum of its two workers'
passages/s; the ratio is taken per repeat (wikirag / default); repeats
alternate the order.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
from report import RunInfo, alternating, bench_parser, emulate_avx2_if_asked, parse_bench_args, publish, spread  # noqa: E402

TRIM = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
WARMUP = 32


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def encode_when_both_ready(titles: list[str], texts: list[str], ready: str, go: str) -> tuple[float, str]:
    """On a worker: load the encoder, warm up, wait for the other worker, then time one pass over the passages."""
    import torch
    from distributed import Event, Queue

    from rag_core.index.encoders import Encoder, EncoderConfig

    torch.set_num_threads(1)
    encoder = Encoder.load(EncoderConfig())
    encoder.encode_passages(titles[:WARMUP], texts[:WARMUP])
    Queue(ready).put(1)
    Event(go).wait(timeout=120)
    started = time.perf_counter()
    encoder.encode_passages(titles, texts)
    return len(texts) / (time.perf_counter() - started), encoder.precision.dtype


def worker_trim_threshold() -> str | None:
    """On a worker: its own MALLOC_TRIM_THRESHOLD_ (this function travels by value; ``os`` is the worker's)."""
    import os

    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def cluster_rate(kind: str, titles: list[str], texts: list[str]) -> tuple[float, str | None, str]:
    """(both workers' passages/s together, the workers' MALLOC_TRIM_THRESHOLD_, dtype) for one cluster."""
    import dask
    from distributed import LocalCluster

    from runtime.local_cluster import DASK_TRIM_DEFAULT, BoundedLocalCluster

    options = dict(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    if kind == "default":
        with dask.config.set({TRIM: int(DASK_TRIM_DEFAULT)}):  # Dask's own value, whatever an earlier cluster set
            cluster = LocalCluster(**options)
    else:  # it also clears the value the default cluster's nanny left in this process's environment
        cluster = BoundedLocalCluster(**options)
    results, trims = on_both_workers(cluster, encode_when_both_ready, titles, texts, worker_trim_threshold)
    (trim,) = set(trims)
    return sum(rate for rate, _ in results), trim, results[0][1]


def on_both_workers(cluster: Any, task: Callable[..., Any], titles: list[str], texts: list[str],
                    probe: Callable[[], Any]) -> tuple[list[Any], list[Any]]:
    """In ``cluster`` (closed after): ``task(titles, texts, ready, go)`` on each worker, released together once all
    are ready (:func:`encode_when_both_ready`'s protocol); (their results, ``probe()`` run on each worker)."""
    from distributed import Client, Event, Queue

    with cluster, Client(cluster) as client:
        probed = list(client.run(probe).values())
        ready, go = f"ready-{uuid.uuid4().hex}", f"go-{uuid.uuid4().hex}"
        queue, event = Queue(ready), Event(go)
        futures = [client.submit(task, titles, texts, ready, go, workers=[address], pure=False)
                   for address in client.scheduler_info()["workers"]]
        for _ in futures:
            queue.get(timeout=300)
        event.set()
        return client.gather(futures), probed


def sample_passages(count: int) -> tuple[list[str], list[str]] | None:
    """``count`` seeded random passages of the real sample (titles, texts), or None (logged) where it is missing."""
    from embed_bench import SAMPLE, load_passages

    if not SAMPLE.exists():
        log(f"skipped: {SAMPLE} is missing (the real sample lives in ../shared/data)")
        return None
    return load_passages(SAMPLE, count)


def cluster_bench_args(doc: str, argv: list[str] | None) -> tuple[argparse.Namespace, list[str], list[str]] | None:
    """A two-cluster bench's arguments (the shared ones and ``--passages``) and its passages; None where the sample
    is missing (logged)."""
    parser = bench_parser(doc, what="runs of each cluster")
    parser.add_argument("--passages", type=int, default=300, help="seeded random sample passages per worker")
    args = parse_bench_args(parser, argv)
    sample = sample_passages(args.passages)
    return None if sample is None else (args, *sample)


def main(argv: list[str] | None = None) -> int:
    emulate_avx2_if_asked()
    if (given := cluster_bench_args(__doc__, argv)) is None:
        return 0
    args, titles, texts = given
    info = RunInfo.start()
    kinds = {"default": "Dask's default nanny environment", "wikirag": "wikirag's local cluster (BoundedLocalCluster)"}
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    trims: dict[str, str | None] = {}
    dtype = "?"
    for r, kind in alternating(kinds, args.repeats):
        rate, trims[kind], dtype = cluster_rate(kind, titles, texts)
        rates[kind].append(rate)
        log(f"# round {r + 1}: {kind} {rate:.1f} passages/s (MALLOC_TRIM_THRESHOLD_={trims[kind]})")
    info.finish()

    ratios = [w / d for d, w in zip(rates["default"], rates["wikirag"], strict=True)]
    lines = ["## Passage encoding in Dask workers: glibc's malloc thresholds", "", *info.markdown_header(),
             f"A local cluster of 2 worker processes, 1 thread each; both workers encode the same {len(texts)} real "
             f"sample passages at once with the packaged all-MiniLM-L6-v2 (dtype auto: {dtype}), after a "
             f"{WARMUP}-passage warm-up; {args.repeats} repeats, alternating order.", "",
             "| cluster | workers' MALLOC_TRIM_THRESHOLD_ | passages/s, both workers (min / median / max) |",
             "|---|---|---|",
             *(f"| {text} | {trims[kind] or 'unset'} | {spread(rates[kind], '{:.1f}')} |"
               for kind, text in kinds.items()),
             "", f"wikirag / default: {spread(ratios, '{:.2f}')}x (median {statistics.median(ratios):.2f}x)."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
