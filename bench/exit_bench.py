"""A command's exit: the interpreter's teardown with the imports' objects as they are vs frozen (``gc.freeze``).

    python bench/exit_bench.py [--repeats 5] [--avx2] [--markdown FILE]

What a wikirag process holds when it ends: a child imports the index rebuild's
flow (Prefect, Dask, pydantic, pyarrow, GX's gates) and loads the packaged
encoder (torch, transformers), as ``wikirag index-rebuild``'s process and each
of its Dask workers do. It then prints the time and returns, so the
interpreter tears itself down: once as is, once after ``gc.freeze()`` (what
``flows.cli.entry`` and ``runtime.local_cluster.dask_teardown`` do). The figure
is the seconds from that print to the child's end, as its parent sees it
(``Popen.wait``). Repeats alternate the order; the ratio is per repeat.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
from report import RunInfo, alternating, bench_parser, emulate_avx2_if_asked, parse_bench_args, publish, spread  # noqa: E402

CHILD = """
import gc, sys, time
import flows.index_rebuild
from rag_core.index.build import load_encoder
from rag_core.index.embeddings import EmbedConfig

load_encoder(EmbedConfig().encoder)
objects = len(gc.get_objects())
if sys.argv[1] == "frozen":
    gc.freeze()
print(objects, time.time(), flush=True)
"""


def teardown_seconds(kind: str) -> tuple[float, int]:
    """(seconds from the child's last statement to its end, objects it tracked) for one child."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, kind], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    proc.wait(timeout=120)
    ended = time.time()
    if proc.returncode != 0 or not line:
        raise SystemExit(f"the child ({kind}) failed with exit code {proc.returncode}")
    objects, printed = line.split()
    return ended - float(printed), int(objects)


def main(argv: list[str] | None = None) -> int:
    emulate_avx2_if_asked()
    args = parse_bench_args(bench_parser(__doc__, repeats=5, what="children of each kind"), argv)
    info = RunInfo.start()
    kinds = {"as-is": "objects as they are (Python's default)", "frozen": "`gc.freeze()` first (wikirag)"}
    seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
    objects: list[int] = []
    for r, kind in alternating(kinds, args.repeats):
        took, n = teardown_seconds(kind)
        seconds[kind].append(took)
        objects.append(n)
        print(f"# round {r + 1}: {kind} {took:.2f} s ({n:,} objects)", file=sys.stderr, flush=True)
    info.finish()
    ratios = [a / f for a, f in zip(seconds["as-is"], seconds["frozen"], strict=True)]
    lines = ["## A process's exit: the interpreter's teardown", "", *info.markdown_header(),
             "A child imports `flows.index_rebuild` and loads the packaged encoder (what `wikirag index-rebuild`'s "
             f"process and each Dask worker hold at their end: ~{statistics.median(objects):,.0f} objects tracked "
             "by the garbage collector), then ends; seconds from its last statement to its end as its parent sees "
             f"it; {args.repeats} repeats, alternating order.", "",
             "| at exit | teardown s (min / median / max) |", "|---|---|",
             *(f"| {text} | {spread(seconds[kind], '{:.2f}')} |" for kind, text in kinds.items()),
             "", f"as is / frozen: {spread(ratios, '{:.1f}')}x (median {statistics.median(ratios):.1f}x)."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
