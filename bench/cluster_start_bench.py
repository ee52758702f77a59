"""An index rebuild's start: the ingest, then workers that can encode; the cluster started after the server vs ahead.

    python bench/cluster_start_bench.py [--repeats 5] [--avx2] [--markdown FILE]

Each measurement is a fresh child process that starts as ``wikirag
index-rebuild`` does, on the real sample dump, the packaged encoder, 2
workers and its own Prefect server in a fresh home (from the database
template, as every run after a machine's first):

* **after the server** (wikirag before ``flows.local_cluster.ClusterStart``):
  the server boots while the process loads the encoder
  (``flows.cli.warm_encoder``); the cluster starts when the flow begins (as
  Prefect's Dask task runner started it), the real ``ingest`` flow runs on it
  (parse, gates, publish), then each worker's first task imports the task
  modules and loads the encoder, as the first embedding task did;
* **ahead, warmed** (wikirag now): the cluster starts as the server boots and
  its workers warm up in the background (``flows.cli.index_warm_up``) while
  the server boots and the ingest runs; the same first task then finds that
  done or waits for it.

The figure is seconds from the child's start to both first tasks' end: when
the rebuild's workers can start encoding (what follows, the encoding, is the
same either way; bench/rebuild_bench.py times whole rebuilds). Repeats
alternate the order; the ratio is per repeat.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
from report import RunInfo, alternating, bench_parser, emulate_avx2_if_asked, parse_bench_args, publish, spread  # noqa: E402

SAMPLE = ROOT.parent / "shared/data/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
WORKERS = 2
KINDS = {"after": "cluster after the server; first tasks import and load (wikirag before)",
         "ahead": "cluster ahead, workers warmed in the background (wikirag)"}


def first_task() -> int:
    """What a worker's first tasks of a rebuild need: the task modules and the encoder."""
    import importlib
    import os

    from rag_core.index.build import load_encoder
    from rag_core.index.embeddings import EmbedConfig

    importlib.import_module("tasks.ingest")
    importlib.import_module("tasks.index")
    load_encoder(EmbedConfig().encoder)
    return os.getpid()


def child(kind: str, home: Path) -> None:
    """One start, timed from this process's start; prints JSON with the seconds."""
    from distributed import Client

    from flows.cli import index_warm_up, warm_encoder
    from flows.local_cluster import BoundedLocalCluster, ClusterStart, local_cluster_kwargs
    from flows.prefect_api import prefect_api
    from flows.settings import Settings
    from rag_core.index.embeddings import EmbedConfig
    from rag_core.wiki.ingest import IngestConfig

    embed = EmbedConfig()
    started = ClusterStart(None, WORKERS, index_warm_up(embed))

    def meanwhile() -> None:  # as flows.cli.run_index_rebuild's
        if kind == "ahead":
            started.start()
        warm_encoder(embed)
        importlib.import_module("flows.index_rebuild")

    with started, prefect_api(home / "prefect", meanwhile=meanwhile):
        server_ready = time.time()
        from flows.ingest import dask_runner, ingest

        cluster = BoundedLocalCluster(**local_cluster_kwargs(WORKERS)) if kind == "after" else None
        address = cluster.scheduler_address if cluster is not None else started.address()
        ingest.with_options(task_runner=dask_runner(address, None))(config=IngestConfig(dump=str(SAMPLE)),
                                                                    store=Settings().store_access())
        with Client(address) as client:
            workers = list(client.scheduler_info()["workers"])
            futures = [client.submit(first_task, workers=[w], pure=False, allow_other_workers=False) for w in workers]
            pids = client.gather(futures)
            ready = time.time()
        if cluster is not None:
            cluster.close()
        started.close()
    print(json.dumps({"server_ready": server_ready, "ready": ready, "workers": len(set(pids))}), flush=True)


def one_start(kind: str) -> tuple[float, float]:
    """(seconds to the server's answer, seconds to workers that can encode), from the child's spawn."""
    with tempfile.TemporaryDirectory(prefix="cluster-start-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "WIKIRAG_DASK_ADDRESS")}
        env |= {"PYTHONPATH": str(ROOT), "WIKIRAG_HOME": tmp}
        spawned = time.time()
        proc = subprocess.run([sys.executable, __file__, "--child", kind, tmp], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"the {kind} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        if out["workers"] != WORKERS:
            raise SystemExit(f"the {kind} child's first tasks ran on {out['workers']} workers, not {WORKERS}")
        return out["server_ready"] - spawned, out["ready"] - spawned


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child(argv[1], Path(argv[2]))
        return 0
    if not SAMPLE.exists():
        raise SystemExit(f"{SAMPLE}: the real sample dump is missing; run where ../shared/data is present")
    emulate_avx2_if_asked()
    args = parse_bench_args(bench_parser(__doc__, repeats=5, what="starts of each kind"), argv)
    info = RunInfo.start()
    server: dict[str, list[float]] = {k: [] for k in KINDS}
    ready: dict[str, list[float]] = {k: [] for k in KINDS}
    for r, kind in alternating(KINDS, args.repeats):
        to_server, to_ready = one_start(kind)
        server[kind].append(to_server)
        ready[kind].append(to_ready)
        print(f"# round {r + 1}: {kind} server {to_server:.1f} s, ingested and ready {to_ready:.1f} s", file=sys.stderr,
              flush=True)
    info.finish()
    ratios = [a / b for a, b in zip(ready["after"], ready["ahead"], strict=True)]
    lines = ["## An index rebuild's start: ingest, then workers that can encode", "", *info.markdown_header(),
             f"Fresh child processes started as `wikirag index-rebuild` starts (the real sample dump, packaged "
             f"encoder, {WORKERS} workers, its own Prefect server in a fresh home from the database template); "
             "seconds from the child's spawn to the server's answer, and to the end of the real `ingest` flow and "
             "then of a first task on each worker that imports the task modules and loads the encoder (method in the "
             f"script's docstring); {args.repeats} repeats, alternating order.", "",
             "| cluster | server answers, s (min / median / max) | workers ready, s (min / median / max) |",
             "|---|---|---|",
             *(f"| {text} | {spread(server[k], '{:.1f}')} | {spread(ready[k], '{:.1f}')} |"
               for k, text in KINDS.items()),
             "", f"before / wikirag: {spread(ratios, '{:.2f}')}x (median {statistics.median(ratios):.2f}x), "
             f"i.e. {statistics.median(ready['after']) - statistics.median(ready['ahead']):.1f} s earlier (medians)."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
