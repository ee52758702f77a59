"""Fine-tuning step cost of a decoder-only generator: one left-padded batch vs each prompt without its padding.

Side by side in one run, interleaved, on the main job's fine-tune (flows/pipeline.py ``ShortRun``:
RAG-Sequence, n_docs 2, the last 15 of SmolLM2's 30 blocks trained, 2 examples per process and step,
so 4 prompts per forward) over a real Flat index (all-MiniLM-L6-v2) of the sample's first
``--passages`` passages and the cloze task drawn from them. The prompts of retrieved passages differ
in length, so a batch of them is partly left padding, which a CPU computes like real tokens.
"batched" runs the padded batch (the layout accelerators need), "rows" runs each prompt alone
(``DecoderOnlyFamily.unpadding``; "auto", the default, picks rows on a CPU). Each run is the recipe
in this process with one torch thread, as each torchrun rank has; its figure is the recipe's own
median examples/s over its steps after the first. The ratio is taken per repeat (rows / batched).

    python bench/unpadding_bench.py [--home H | --generator DIR] [--steps N] [--markdown FILE] [--avx2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import emulate_avx2_if_asked, publish, spread
from train_bench import add_input_arguments
from train_layers_bench import add_run_arguments, main_job_inputs, recipe_rate, start_one_thread

WAYS = {"batched": "one left-padded batch", "rows": "each prompt alone, unpadded"}


def main() -> int:
    emulate_avx2_if_asked()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_input_arguments(parser)
    add_run_arguments(parser, steps=4)
    args = parser.parse_args()
    info = start_one_thread()
    from rag_core.model.generators import DecoderOnlyFamily

    rates: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="wikirag-unpadding-bench-") as tmp:
        store, task, described, base = main_job_inputs(Path(tmp), args)
        for repeat in range(args.repeats):
            for way in WAYS:
                DecoderOnlyFamily.unpadding = way
                config = base.model_copy(update={"output": f"runs/{way}-{repeat}"})
                rate, _, precision = recipe_rate(config, store, f"repeat {repeat + 1}: {way}")
                rates[way].append(rate)
        DecoderOnlyFamily.unpadding = "auto"
        info.finish()

    ratio = [rows / batched for batched, rows in zip(rates["batched"], rates["rows"], strict=True)]
    lines = [("## Fine-tuning a decoder-only generator: padded batch vs unpadded prompts, capability "
              f"{info.hardware.capability}"), "",
             *info.markdown_header(),
             (f"Generator: {described}, its last {base.train_generator_layers} blocks trained, and the index's "
              f"all-MiniLM-L6-v2 question encoder. Index: Flat, {args.passages} sample passages; cloze task: "
              f"{len(task.train)} train examples. The main job's fine-tune: RAG-Sequence, n_docs={base.n_docs}, "
              f"{base.batch_size} examples per step (one of its 2 processes), lr {base.lr}; {args.steps} steps per "
              f"run (figure: the recipe's median over steps 2..{args.steps}), autocast {precision}, 1 torch thread, "
              f"in process; {args.repeats} repeats, interleaved."), "",
             "| generator forward | training examples/s (min / median / max) |",
             "|---|---|",
             *(f"| {way}: {text} | {spread(rates[way])} |" for way, text in WAYS.items()), "",
             f"Speed-up of unpadded prompts: {spread(ratio, '{:.2f}')}x (median {statistics.median(ratio):.2f}x)."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
