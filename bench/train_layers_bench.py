"""Fine-tuning step cost: every generator parameter trained vs only its last N decoder blocks.

Side by side in one run, interleaved, on the main job's fine-tune settings (flows/pipeline.py
``ShortRun``: RAG-Sequence, n_docs 2, 160 context tokens per passage, 2 examples per process and
step) over a real Flat index (all-MiniLM-L6-v2) of the sample's first ``--passages`` passages and
the cloze task drawn from them. Each run is the recipe (rag_core.train.recipe.run) in this process
with one torch thread, as each torchrun rank has; its figure is the recipe's own median
examples/s over its steps after the first (the first warms up the kernels). The ratio is taken per
repeat (partial / all). The generator is the fetched SmolLM2-135M-Instruct (30 decoder blocks);
``--home`` or ``--generator`` as in bench/train_bench.py.

    python bench/train_layers_bench.py [--home H | --generator DIR] [--layers N] [--markdown FILE] [--avx2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo, emulate_avx2_if_asked, publish, spread
from train_bench import add_input_arguments, build_inputs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def add_run_arguments(parser: argparse.ArgumentParser, steps: int) -> None:
    """--steps, --repeats, --markdown, --avx2: how a side-by-side bench of recipe runs repeats and reports."""
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps per run; the first warms up")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", type=Path, help="write the section to this file")
    parser.add_argument("--avx2", action="store_true", help="emulate an AVX2-only CPU (bench/report.py)")


def start_one_thread() -> RunInfo:
    """One torch thread, as each torchrun rank has, quiet libraries, and the run's hardware and load at its start."""
    import torch

    from runtime.settings import quiet_environment

    torch.set_num_threads(1)
    info = RunInfo.start()
    quiet_environment()
    return info


def main_job_inputs(root: Path, args):
    """The store, cloze task, generator description and the main job's fine-tune as one process's TrainConfig
    (``args.steps`` steps, 1 thread, no checkpoints); ``args``: :func:`add_input_arguments`' flags and ``steps``."""
    from rag_core.train.jobs import ShortRun
    from rag_core.index.encoders import default_encoder_config
    from rag_core.train.train_config import TrainConfig

    short = ShortRun()
    store, _, task, generator, described = build_inputs(root, args, default_encoder_config())
    base = TrainConfig(task="cloze", train=str(root / "train.jsonl"), generator=generator, n_docs=short.n_docs,
                       max_context_length=short.max_context_length, lr=short.lr,
                       batch_size=short.batch_size // 2,  # per process: the main job runs 2 DDP processes
                       train_generator_layers=short.train_layers, max_steps=args.steps, checkpoint_every=0,
                       threads=1, output="runs/bench")
    return store, task, described, base


def recipe_rate(config, store, label: str) -> tuple[float, int, str]:
    """The recipe's median examples/s over its steps after the first, its trainable parameters and precision."""
    from rag_core.train.recipe import run
    from rag_core.train.tracking import MemoryLogger

    logger = MemoryLogger()
    result = run(config, store, logger=logger)
    print(f"# {label} {result.examples_per_s:.3f} examples/s, precision {result.precision}", file=sys.stderr)
    return result.examples_per_s, logger.params["trainable_parameters"], result.precision


def main() -> int:
    emulate_avx2_if_asked()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_input_arguments(parser)
    parser.add_argument("--layers", type=int, help="decoder blocks trained in the partial runs (default: the "
                        "main job's, flows/pipeline.py ShortRun.train_layers)")
    add_run_arguments(parser, steps=3)
    args = parser.parse_args()
    info = start_one_thread()
    from rag_core.train.jobs import ShortRun

    short = ShortRun()
    args.layers = args.layers or short.train_layers
    rates: dict[str, list[float]] = {"all": [], "last": []}
    trainable: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="wikirag-layers-bench-") as tmp:
        store, task, described, base = main_job_inputs(Path(tmp), args)
        for repeat in range(args.repeats):
            for name, layers in (("all", None), ("last", args.layers)):
                config = base.model_copy(update={"train_generator_layers": layers, "output": f"runs/{name}-{repeat}"})
                rate, trainable[name], precision = recipe_rate(config, store, f"repeat {repeat + 1}: {name}")
                rates[name].append(rate)
        info.finish()

    ratio = [last / every for every, last in zip(rates["all"], rates["last"])]
    lines = [f"## Fine-tuning step cost: all generator blocks vs the last {args.layers}, capability "
             f"{info.hardware.capability}", "",
             *info.markdown_header(),
             (f"Generator: {described}; question encoder: the index's all-MiniLM-L6-v2 (trained in both). Index: "
              f"Flat, {args.passages} sample passages; cloze task: {len(task.train)} train examples. The main job's "
              f"fine-tune settings: RAG-Sequence, n_docs={short.n_docs}, {short.max_context_length} context tokens "
              f"per passage, {base.batch_size} examples per step (one of its 2 processes), lr {short.lr}; "
              f"{args.steps} steps per run (figure: the recipe's median over steps 2..{args.steps}), autocast "
              f"{precision}, 1 torch thread, in process; {args.repeats} repeats, interleaved."), "",
             "| generator trained | trainable parameters | training examples/s (min / median / max) |",
             "|---|---|---|",
             f"| every parameter | {trainable['all'] / 1e6:.1f}M | {spread(rates['all'])} |",
             f"| last {args.layers} decoder blocks + final norm | {trainable['last'] / 1e6:.1f}M | "
             f"{spread(rates['last'])} |", "",
             f"Speed-up of the partial fine-tune: {spread(ratio, '{:.2f}')}x (median "
             f"{statistics.median(ratio):.2f}x)."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
