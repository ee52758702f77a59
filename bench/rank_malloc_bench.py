"""A training rank's malloc: freed memory handed back (the rank's policy) against kept for reuse (every other
wikirag process's), side by side on the real generator and real questions.

Two kinds of 2-rank run (``tasks.adapters.torchrun_launcher.launch_training``: ``torchrun --standalone``, gloo,
1 torch thread per rank, ``runtime.process_tuning.rank_environment``), the same recipe, data and models, only the
ranks' malloc differing:

- **handed back**: the ranks as ``wikirag finetune`` starts them (``runtime.process_tuning.hand_back_freed_memory``:
  blocks of ``RANK_MMAP_THRESHOLD`` and more mapped on their own, unmapped when freed);
- **kept for reuse**: the ranks' environment sets glibc's thresholds to :func:`keep_freed_memory`'s values
  (``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``; a user's malloc variables win over the tuning), as the
  ranks ran before.

Each run: setup, the recipe's dev-loss pass over ``--dev-examples``, ``--steps`` optimizer steps, the final dev
pass. Per run, the peak RSS of each rank (psutil every 0.2 s, ``train_bench.PeakRss``) and the recipe's median
examples/s over its steps after the first. ``--repeats`` runs of each kind, interleaved.

Defaults are ``wikirag finetune``'s: SmolLM2-135M-Instruct (``--home``'s ``wikirag models fetch``), its last 15
blocks trained (``rag_core.train.jobs.TRAINED_BLOCKS``), n_docs 5, batch 8 (4 one-example micro-batches per
rank), the precision rule's autocast; the index is ``--home``'s LATEST.

    python bench/rank_malloc_bench.py --home ~/.wikirag --train NQ.jsonl --dev NQ.jsonl [--markdown FILE]
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo, alternating, bench_parser, parse_bench_args, publish, spread  # noqa: E402
from train_bench import PeakRss  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RANKS = 2
KINDS = ("handed back", "kept for reuse")
GOAL_GB = 4.0  # issue 37: peak memory per rank at the finetune defaults


def one_run(config, store_url: str, kind: str) -> tuple[list[int], float]:
    """(each rank's peak RSS, the recipe's median examples/s) of one run of ``kind``."""
    from runtime import process_tuning
    from tasks.adapters.torchrun_launcher import launch_training

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if kind == "kept for reuse":
        env |= {"MALLOC_MMAP_THRESHOLD_": str(process_tuning.MMAP_THRESHOLD),
                "MALLOC_TRIM_THRESHOLD_": str(process_tuning.TRIM_THRESHOLD)}
    with PeakRss() as peak:
        result = launch_training(config, RANKS, store_url=store_url, env=env, timeout=1800)
    # a process a rank starts carries its command line until it execs: the run's ranks are its RANKS largest
    return sorted(peak.ranks.values())[-RANKS:], result.examples_per_s


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, what="runs of each kind, interleaved")
    parser.add_argument("--home", type=Path, default=Path("~/.wikirag"), help="wikirag workspace: its store's "
                        "LATEST index and models/SmolLM2-135M-Instruct")
    parser.add_argument("--train", required=True, help="NQ-open jsonl (question, answer) to train on")
    parser.add_argument("--dev", required=True, help="NQ-open jsonl for the dev-loss passes")
    parser.add_argument("--dev-examples", type=int, default=16, help="dev examples per dev-loss pass")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first warms up)")
    args = parse_bench_args(parser, argv)

    from rag_core.storage import Store
    from rag_core.train.jobs import TRAINED_BLOCKS
    from rag_core.train.train_config import TrainConfig
    from runtime.default_generator import resolve_generator
    from runtime.settings import quiet_environment

    quiet_environment()
    info = RunInfo.start(argv if argv is None else [sys.argv[0], *argv])
    home = args.home.expanduser()
    store = Store(str(home / "store"))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    base = TrainConfig(task="nq", train=args.train, dev=args.dev, generator=str(resolve_generator(home, None)),
                       train_generator_layers=TRAINED_BLOCKS, max_steps=args.steps, max_dev_examples=args.dev_examples,
                       checkpoint_every=0, output="runs/x")
    peaks: dict[str, list[int]] = {k: [] for k in KINDS}
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    for repeat, kind in alternating(KINDS, args.repeats):
        config = base.model_copy(update={"output": f"runs/malloc-bench-{stamp}-{kind[:4]}-{repeat}"})
        ranks, rate = one_run(config, store.url, kind)
        peaks[kind] += ranks
        rates[kind].append(rate)
        print(f"# repeat {repeat + 1} {kind}: ranks {[round(b / 1e9, 2) for b in ranks]} GB, {rate:.3f} examples/s",
              file=sys.stderr, flush=True)
    info.finish()
    publish(render(info, args, base, peaks, rates), args.markdown)
    return 0


def render(info: RunInfo, args, config, peaks: dict, rates: dict) -> str:
    def gb(values: list[int]) -> str:
        return spread([b / 1e9 for b in values], "{:.2f}")

    worst = max(peaks["handed back"]) / 1e9
    ratio = statistics.median(peaks["kept for reuse"]) / statistics.median(peaks["handed back"])
    speed = statistics.median(rates["handed back"]) / statistics.median(rates["kept for reuse"])
    lines = ["## A training rank's malloc: freed memory handed back vs kept for reuse", "", *info.markdown_header(),
             (f"{RANKS} ranks (`torchrun --standalone`, gloo, 1 torch thread each), `wikirag finetune`'s defaults: "
              f"{Path(config.generator).name}, its last {config.train_generator_layers} blocks and the question "
              f"encoder trained, n_docs {config.n_docs}, batch {config.batch_size} (one-example micro-batches), "
              f"precision rule; task nq, train `{args.train}`, dev-loss passes over {config.max_dev_examples} of "
              f"`{args.dev}` before and after {config.max_steps} steps; {args.repeats} runs per kind, interleaved. "
              "Peak RSS: psutil every 0.2 s, each rank of each run. Examples/s: the recipe's median over the steps "
              "after the first."), "",
             "| ranks' malloc | peak RSS per rank, GB (min / median / max) "
             "| training examples/s (min / median / max) |",
             "|---|---:|---:|",
             *(f"| {k} | {gb(peaks[k])} | {spread(rates[k], '{:.3f}')} |" for k in KINDS), "",
             (f"Kept / handed back, peak per rank: {ratio:.2f}x (medians). Handed back / kept, examples/s: "
              f"{speed:.2f}x (medians). Largest rank peak handed back: {worst:.2f} GB; goal < {GOAL_GB:g} GB: "
              f"{'PASS' if worst < GOAL_GB else 'FAIL'}."), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
