"""Passage encoding in Dask workers: Dask's background sampling on (its defaults) vs turned down (wikirag's).

    python bench/worker_background_bench.py [--passages 300] [--repeats 3] [--avx2] [--markdown FILE]

Each Dask process samples in the background besides running tasks: the
statistical profiler takes a stack sample of the task thread every 10 ms, the
event loop checks its health every 20 ms, the system monitor reads psutil every
500 ms. On a local cluster with one worker per core that CPU comes out of the
encoding. Side by side in one run: two 2-worker, 1-thread-per-worker
``BoundedLocalCluster`` s, one with Dask's defaults for those settings
(``DASK_*`` variables, as a user who wants them would set them), one as wikirag
starts it (``runtime.local_cluster.QUIET_SETTINGS``). Both workers of a cluster
encode the same ``--passages`` real sample passages at once, as two shards of an
index rebuild (bench/worker_malloc_bench.py's method). A cluster's figure is its
two workers' passages/s added, plus the CPU seconds the worker processes spent
beyond the encoding threads' own (the background); the ratio (wikirag / Dask's
defaults) is taken per repeat; repeats alternate the order.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
from report import RunInfo, alternating, emulate_avx2_if_asked, publish, spread  # noqa: E402

WARMUP = 32
# Dask's own defaults for what runtime.local_cluster.QUIET_SETTINGS turns down
DASK_DEFAULTS = {"distributed.worker.profile.enabled": True, "distributed.admin.tick.interval": "20ms",
                 "distributed.admin.system-monitor.interval": "500ms"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def encode_and_count(titles: list[str], texts: list[str], ready: str, go: str) -> tuple[float, float, float, str]:
    """On a worker: worker_malloc_bench's timed pass, plus the process's and this thread's CPU seconds during it."""
    import time

    from worker_malloc_bench import encode_when_both_ready

    process, thread = time.process_time(), time.thread_time()
    rate, dtype = encode_when_both_ready(titles, texts, ready, go)
    return rate, time.process_time() - process, time.thread_time() - thread, dtype


@contextlib.contextmanager
def dask_defaults() -> Iterator[None]:
    """Dask's own sampling settings, set as a user would (so quiet_background leaves them), for one cluster."""
    import dask

    env = {"DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(value)
           for key, value in DASK_DEFAULTS.items()}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with dask.config.set(DASK_DEFAULTS):
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def worker_settings() -> dict:
    import dask

    return {key: dask.config.get(key) for key in DASK_DEFAULTS}


def cluster_run(kind: str, titles: list[str], texts: list[str]) -> tuple[float, float, dict, str]:
    """(both workers' passages/s, their background CPU s, the workers' settings, dtype) for one cluster."""
    from worker_malloc_bench import on_both_workers

    from runtime.local_cluster import BoundedLocalCluster

    options = dict(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None)
    with dask_defaults() if kind == "dask" else contextlib.nullcontext():
        cluster = BoundedLocalCluster(**options)
    results, (settings, *_) = on_both_workers(cluster, encode_and_count, titles, texts, worker_settings)
    rate = sum(r[0] for r in results)
    background = sum(r[1] - r[2] for r in results)
    return rate, background, settings, results[0][3]


def main(argv: list[str] | None = None) -> int:
    emulate_avx2_if_asked()
    from worker_malloc_bench import cluster_bench_args

    if (given := cluster_bench_args(__doc__, argv)) is None:
        return 0
    args, titles, texts = given
    info = RunInfo.start()
    kinds = {"dask": "Dask's defaults", "wikirag": "wikirag's local cluster (`QUIET_SETTINGS`)"}
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    backgrounds: dict[str, list[float]] = {kind: [] for kind in kinds}
    settings: dict[str, dict] = {}
    dtype = "?"
    for r, kind in alternating(kinds, args.repeats):
        started = time.perf_counter()
        rate, background, settings[kind], dtype = cluster_run(kind, titles, texts)
        rates[kind].append(rate)
        backgrounds[kind].append(background)
        log(f"# round {r + 1}: {kind} {rate:.1f} passages/s, background {background:.2f} CPU s "
            f"({time.perf_counter() - started:.0f} s)")
    info.finish()

    ratios = [w / d for d, w in zip(rates["dask"], rates["wikirag"], strict=True)]
    shown = ", ".join(f"`{key.rsplit('.', 2)[-2]}.{key.rsplit('.', 1)[-1]}`" for key in DASK_DEFAULTS)
    lines = ["## Passage encoding in Dask workers: Dask's background sampling", "", *info.markdown_header(),
             f"A `BoundedLocalCluster` of 2 worker processes, 1 thread each; both workers encode the same "
             f"{len(texts)} real sample passages at once with the packaged all-MiniLM-L6-v2 (dtype auto: {dtype}), "
             f"after a {WARMUP}-passage warm-up; {args.repeats} repeats, alternating order. Background: the worker "
             "processes' CPU seconds during the pass beyond their encoding threads' own.", "",
             f"| cluster | workers' {shown} | passages/s, both workers (min / median / max) "
             "| background CPU s, both workers |",
             "|---|---|---|---|",
             *(f"| {text} | {', '.join(str(v) for v in settings[kind].values())} | {spread(rates[kind], '{:.1f}')} "
               f"| {spread(backgrounds[kind], '{:.2f}')} |" for kind, text in kinds.items()),
             "", f"wikirag / Dask's defaults: {spread(ratios, '{:.3f}')}x (median {statistics.median(ratios):.3f}x)."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
