"""What a second process gets from this machine: the same matmul in 1 process, then in 2 at once.

    python bench/cores_bench.py [--seconds 5] [--repeats 3] [--markdown bench/results/cores.md]

Two DDP ranks (bench/train_bench.py) or two Dask workers can only scale as far
as the cores let two independent processes run. Each process here runs one
torch thread doing the matmul of a decoder layer's feed-forward (512 tokens x
576 @ 576 x 1536, SmolLM2-135M's shapes) in float32 and in bfloat16 for a
fixed time; the processes start together at a barrier. The ratio of the two
processes' combined rate to one process's rate is the ceiling for any
2-process speed-up of compute-bound work on this machine (2.0 on two
independent cores; lower where the two vCPUs share a physical core or its
matrix units). Repeats are interleaved (1 process, 2 processes, 1, 2, ...).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo, emulate_avx2_if_asked, publish, spread  # noqa: E402

SHAPE = (512, 576, 1536)  # tokens x hidden @ hidden x ffn: SmolLM2-135M's MLP
DTYPES = ("float32", "bfloat16")


def _work(dtype_name: str, seconds: float, barrier, results) -> None:
    import torch

    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    m, k, n = SHAPE
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b)  # warm-up: kernel selection, oneDNN primitive creation
    barrier.wait()
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        torch.matmul(a, b)
        done += 1
    results.put(2 * m * k * n * done / elapsed / 1e9)


def rate(processes: int, dtype_name: str, seconds: float) -> float:
    """Combined GFLOP/s of ``processes`` processes running the matmul side by side."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_work, args=(dtype_name, seconds, barrier, results)) for _ in range(processes)]
    for p in procs:
        p.start()
    rates = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


def main(argv: list[str] | None = None) -> int:
    emulate_avx2_if_asked()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="timed matmuls per process and run (default 5)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration (default 3)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--avx2", action="store_true", help="run as on an AVX2-only CPU (bench/report.py)")
    parser.add_argument("--markdown", type=Path, help="also write the section to this file")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("--repeats: at least 3 (a figure is min / median / max)")

    info = RunInfo.start()
    measured: dict[tuple[str, int], list[float]] = {}
    for r in range(args.repeats):
        for dtype in args.dtypes:
            for processes in (1, 2):
                measured.setdefault((dtype, processes), []).append(rate(processes, dtype, args.seconds))
                print(f"# round {r + 1}: {dtype}, {processes} process(es): "
                      f"{measured[dtype, processes][-1]:.1f} GFLOP/s", file=sys.stderr)
    info.finish()

    m, k, n = SHAPE
    lines = ["## Cores: what a second process gets", "", *info.markdown_header(),
             f"One torch thread per process, {m}x{k} @ {k}x{n} matmuls for {args.seconds:g} s per run, the processes "
             f"started together; {args.repeats} runs of each configuration, interleaved.", "",
             "| dtype | 1 process, GFLOP/s | 2 processes together, GFLOP/s | 2 processes / 1 (min / median / max) |",
             "|---|---:|---:|---:|"]
    for dtype in args.dtypes:
        one, two = measured[dtype, 1], measured[dtype, 2]
        ratios = [b / a for a, b in zip(one, two)]  # each 2-process run against the 1-process run just before it
        lines.append(f"| {dtype} | {spread(one, '{:.1f}')} | {spread(two, '{:.1f}')} | {spread(ratios, '{:.2f}')}x |")
    lines += ["", "A 2-process speed-up of compute-bound work (DDP ranks, Dask workers) cannot exceed the ratio of its "
              "dtype here."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
