"""The main job's fine-tune step with activation checkpointing on (the recipe's default) and off.

Checkpointing keeps only each trained block's input and runs the block's forward again in the backward pass: memory
for time. The main job's short fine-tune holds 2 examples per process and step, so its activations are small either
way; this measures what the recomputation costs there. Side by side in one run, interleaved, on the main job's
settings (bench/train_layers_bench.py's inputs: a real Flat index of the sample's first ``--passages`` passages, the
cloze task drawn from them, the fetched SmolLM2-135M-Instruct with its last 15 blocks trained), one torch thread as
each torchrun rank has; a run's figure is the recipe's median examples/s over its steps after the first, and its
peak RSS (the process's high-water mark, reset before each run). The ratio is taken per repeat (off / on).

    python bench/checkpointing_bench.py [--home H | --generator DIR] [--markdown FILE] [--avx2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import emulate_avx2_if_asked, publish, reset_peak_rss, spread, status_bytes
from train_bench import add_input_arguments
from train_layers_bench import add_run_arguments, main_job_inputs, recipe_rate, start_one_thread

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    emulate_avx2_if_asked()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_input_arguments(parser)
    add_run_arguments(parser, steps=3)
    args = parser.parse_args()
    info = start_one_thread()
    rates: dict[bool, list[float]] = {True: [], False: []}
    peaks: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="wikirag-checkpointing-bench-") as tmp:
        store, task, described, base = main_job_inputs(Path(tmp), args)
        for repeat in range(args.repeats):
            for on in (True, False):
                config = base.model_copy(update={"activation_checkpointing": on,
                                                 "output": f"runs/{'on' if on else 'off'}-{repeat}"})
                reset_peak_rss()
                rate, _, precision = recipe_rate(config, store, f"repeat {repeat + 1}: checkpointing {on}")
                rates[on].append(rate)
                peaks[on].append(status_bytes("VmHWM") / 1e9)
        info.finish()

    ratio = [off / on for on, off in zip(rates[True], rates[False])]
    lines = [f"## Fine-tuning step with activation checkpointing on and off, capability {info.hardware.capability}",
             "", *info.markdown_header(),
             (f"Generator: {described}, its last {base.train_generator_layers} decoder blocks trained; question "
              f"encoder: the index's all-MiniLM-L6-v2. Index: Flat, {args.passages} sample passages; cloze task: "
              f"{len(task.train)} train examples. The main job's fine-tune settings: RAG-Sequence, "
              f"n_docs={base.n_docs}, {base.batch_size} examples per step (one of its 2 processes), one example per "
              f"micro-batch; {args.steps} steps per run (figure: the recipe's median over steps 2..{args.steps}), "
              f"autocast {precision}, 1 torch thread, in process; {args.repeats} repeats, interleaved. Peak RSS: "
              "the whole bench process's high-water mark over the run (index and models included)."), "",
             "| activation checkpointing | training examples/s (min / median / max) "
             "| peak RSS, GB (min / median / max) |",
             "|---|---|---|",
             f"| on (the recipe's default) | {spread(rates[True])} | {spread(peaks[True], '{:.2f}')} |",
             f"| off | {spread(rates[False])} | {spread(peaks[False], '{:.2f}')} |", "",
             f"Speed-up with checkpointing off: {spread(ratio, '{:.2f}')}x (median {statistics.median(ratio):.2f}x)."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
