"""Fine-tuning speed: training examples/s with 1 and 2 DDP processes, time per evaluation example, an H200 projection.

Side by side in one run, on a real Flat index (all-MiniLM-L6-v2) of the first ``--passages``
passages of the Wikipedia sample and the cloze task drawn from them (rag_core.train.cloze):

- **training**: ``tasks.adapters.torchrun_launcher.launch_training``, i.e. ``torchrun --standalone --nproc-per-node N``
  (gloo, 1 torch thread per process) running the recipe (rag_core.train.recipe) for ``--steps``
  optimizer steps of the same global batch with N = 1 and N = 2, interleaved, ``--repeats`` times.
  A repeat's figure is the recipe's own median examples/s over its steps after the first (the
  first warms up the kernels); the ratio 2 processes / 1 process is taken per repeat (goal >= 1.6x).
- **evaluation**: ``rag_core.evaluate.predictions.evaluate_model`` on ``--eval-examples`` cloze dev
  examples with the same generator (float32 weights, as loaded for ``wikirag evaluate``), seconds per example.
- **FLOP/s here**: 6 x trainable parameters x tokens per step / step time, tokens counted on the very
  examples the steps read (the recipe's data order): the generator's prompt and answer tokens per
  retrieved passage (padding not counted) and the question tokens of the question encoder.
- **projection** (an estimate, not a measurement): the RAG paper's NQ fine-tune on one H200 at an
  assumed utilisation of its bf16 dense peak; the assumptions are printed with the figure.
- **memory per rank**: the peak RSS of each rank (psutil, sampled) in the 2-process runs, retrieving
  in process (each rank loads the index) and, in one more 2-process run, through a local Dask
  cluster holding the index once (``--dask-address``; the worker's peak RSS beside it); and for
  21M passages what a rank holds either way, per passage bytes measured on this index and scaled
  (docs/architecture.md, "What a training rank holds").

The generator is the fetched SmolLM2-135M-Instruct (``wikirag models fetch``; ``--home`` or
``--generator DIR``); without it the bench says so and falls back to a tiny random BART
(rag_core.model.generators.default_generator with d_model 256, 2 layers), whose figures are labelled.

    python bench/train_bench.py [--home H | --generator DIR] [--quick] [--markdown FILE] [--avx2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo, emulate_avx2_if_asked, publish, spread

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FULL_WIKIPEDIA = 21_000_000  # DPR's passage count for English Wikipedia
PAPER = {"examples": 79_168, "params": 406e6, "n_docs": 10, "epochs": 10, "question_encoder": 110e6,
         "answer_tokens": 8}  # NQ-open train, BART-large, BERT-base question encoder; epochs and answer length assumed
H200_BF16_DENSE = 989e12  # FLOP/s, NVIDIA's H200 SXM bf16 Tensor Core peak without sparsity
UTILISATION = (0.4, 0.2)  # assumed fractions of that peak: a typical dense-transformer figure, and a pessimistic one
TINY = {"d_model": 256, "layers": 2, "heads": 4, "ffn_dim": 1024}


def generator_dir(args) -> tuple[str | None, str]:
    """(folder, description) of the generator; (None, why) when the fetched default is missing."""
    from runtime.default_generator import default_generator_dir, is_converted
    from runtime.settings import Settings

    if args.generator:
        return args.generator, Path(args.generator).name
    home = Path(args.home) if args.home else Settings().home
    folder = default_generator_dir(home)
    if is_converted(folder):
        return str(folder), f"{folder.name} (`wikirag models fetch`, {folder})"
    return None, f"no converted SmolLM2 under {home}/models (run `wikirag models fetch` or pass --generator)"


def build_inputs(root: Path, args, encoder):
    """The store with a Flat index of the sample's first passages, the cloze train/dev files and the generator."""
    from rag_core.index.encoders import Encoder
    from rag_core.model.generators import GeneratorConfig, default_generator
    from rag_core.storage import Store
    from rag_core.train.cloze import ClozeConfig, cloze_examples
    from rag_core.train.examples import write_examples
    from tests.helpers.passagefiles import publish_small_index, sample_passages

    store = Store(str(root / "store"))
    passages = sample_passages().slice(0, args.passages)
    version = publish_small_index(store, "sample", passages, Encoder.load(encoder), shards=2)
    task = cloze_examples(passages, ClozeConfig(seed=0, dev_fraction=0.2))
    write_examples(task.train, str(root / "train.jsonl"))
    write_examples(task.dev, str(root / "dev.jsonl"))
    generator, described = generator_dir(args)
    if generator is None:
        model, tokenizer = default_generator(GeneratorConfig(**TINY), 512)
        model.save_pretrained(root / "bart")
        tokenizer.save_pretrained(root / "bart")
        generator, described = str(root / "bart"), f"FALLBACK tiny random BART {TINY}: {described}"
    return store, version, task, generator, described


def step_tokens(model, config, examples) -> tuple[float, float, float]:
    """Mean (generator tokens, question tokens, passage+question tokens per document) per example over
    ``examples``, as the recipe feeds them (padding excluded)."""
    gen = question = context = 0
    for start in range(0, len(examples), 8):
        chunk = examples[start:start + 8]
        found = model.search([e.input for e in chunk])
        labels = model.answer_labels([e.targets[0] for e in chunk])
        answer = int((labels != model.pad_token_id).sum())  # pad_token_id: what marks label padding
        gen += int(found.context_attention_mask.sum()) + answer * config.n_docs
        question += int(model.question_encoder.tokenizer([e.input for e in chunk], truncation=True,
                                                         padding=True, return_tensors="pt")["attention_mask"].sum())
        tok = model.generator_tokenizer
        context += sum(len(tok(f"{t} / {x} // {q}", add_special_tokens=False)["input_ids"][:300])
                       for q, ts, xs in zip(found.questions, found.titles, found.texts) for t, x in zip(ts, xs))
    n = len(examples)
    return gen / n, question / n, context / (n * config.n_docs)


def stream(config, train_examples, steps: int):
    """The examples the recipe's first ``steps`` steps read (Recipe._example's order for epoch 0 and on)."""
    import numpy as np

    n = len(train_examples)
    orders = {}
    for position in range(steps * config.batch_size):
        epoch = position // n
        if epoch not in orders:
            orders[epoch] = np.random.default_rng([config.seed, epoch]).permutation(n)
    return [train_examples[int(orders[p // n][p % n])] for p in range(steps * config.batch_size)]


class PeakRss:
    """Peak resident memory of this process's descendants while a job runs: torchrun's ranks and Dask workers."""

    def __init__(self, every: float = 0.2) -> None:
        self.every, self.ranks, self.workers = every, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(self.every):
            for child in me.children(recursive=True):
                try:
                    line, rss = " ".join(child.cmdline()), child.memory_info().rss
                except psutil.Error:  # ended between the listing and the reading
                    continue
                kind = (self.ranks if "tasks.adapters.torchrun_launcher" in line and "torch.distributed.run" not in line else
                        self.workers if "spawn_main" in line else None)
                if kind is not None:
                    kind[child.pid] = max(kind.get(child.pid, 0), rss)


def rank_memory(retriever, parameters: int, per_rank_batch: int, n_docs: int) -> list[tuple[str, float, float, str]]:
    """(what, bytes held by one rank for 21M passages when it loads its own IndexRetriever, bytes when it retrieves
    through the Dask-held index, how)."""
    from rag_core.capacity.plan import index_bytes_per_vector
    from rag_core.index.embedding_files import EmbedConfig
    from rag_core.index.faiss_index import IndexConfig

    dim, rows = retriever.index.dim, retriever.index.ntotal
    columns = sum(col.nbytes for shard in retriever.index._columns for col in shard.values()) / rows
    # the index a default rebuild of 21M passages plans (rag_core.index.plan), not a hypothetical single shard
    shards = EmbedConfig().num_shards(FULL_WIKIPEDIA)
    factory = IndexConfig().resolve_factory(FULL_WIKIPEDIA, dim, total_vectors=FULL_WIKIPEDIA, shards=shards)
    faiss_bytes = index_bytes_per_vector(factory, dim)
    n, found = FULL_WIKIPEDIA, per_rank_batch * n_docs
    return [("FAISS shards (`ShardedIndex.shards`)", n * faiss_bytes, 0, (f"{factory}, {shards} shards (the auto rule "
             f"for a default rebuild of 21M, no budget): {faiss_bytes:.0f} B/passage at d={dim}; with Dask: on the "
             "workers")),
            ("passage ids, titles, texts (`ShardedIndex._columns`, Arrow)", n * columns, found * columns,
             (f"{columns:.0f} B/passage, measured on these {rows} sample passages; with Dask: the {found} passages "
              f"of a micro-batch ({per_rank_batch} questions x {n_docs})")),
            ("stored vectors (`IndexRetriever.vectors`, float32)", n * 4 * dim, found * 4 * dim,
             f"4 x {dim} B/passage; with Dask: those of the micro-batch's passages"),
            ("question encoder + generator: float32 weights, gradients, Adam m and v", 16 * parameters,
             16 * parameters, f"16 B x {parameters / 1e6:.1f}M parameters (independent of the index)")]


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags :func:`build_inputs` reads: where the generator is, and how many passages the index holds."""
    parser.add_argument("--home", help="wikirag workspace holding models/SmolLM2-135M-Instruct")
    parser.add_argument("--generator", help="generator folder (overrides --home)")
    parser.add_argument("--passages", type=int, default=300, help="sample passages in the index")


def main() -> int:
    emulate_avx2_if_asked()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_input_arguments(parser)
    parser.add_argument("--n-docs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch (the same for 1 and 2 processes; "
                        "the paper: 128; at 8 a step's fixed cost, the all-reduce of every gradient and the optimizer "
                        "step on each rank, weighs twice as much per example)")
    parser.add_argument("--micro-batch", type=int, default=1, help="examples per micro-batch on each rank, the same "
                        "for 1 and 2 processes (grad_accum = batch / (processes x micro-batch); 1 is the recipe's "
                        "default, the least memory per rank)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per training run; the first warms up "
                        "(SmolLM2 with 1 thread, batch 16: ~40 s a step on 1 process, so 2 keeps the run near 12 minutes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eval-examples", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=8, help="answer tokens in evaluation (cloze spans are short)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the evaluation (training: 1 per rank)")
    parser.add_argument("--quick", action="store_true", help="200 passages, 2 evaluation examples (a smoke run)")
    parser.add_argument("--markdown", type=Path, help="write the section to this file")
    parser.add_argument("--avx2", action="store_true", help="emulate an AVX2-only CPU (bench/report.py)")
    args = parser.parse_args()
    if args.quick:
        args.passages, args.eval_examples = 200, 2

    import torch

    torch.set_num_threads(args.threads)
    info = RunInfo.start()
    from runtime.settings import quiet_environment
    from rag_core.evaluate.predictions import evaluate_model
    from rag_core.index.encoders import default_encoder_config
    from rag_core.model.generators import GeneratorConfig
    from rag_core.model.rag_model import RagConfig, RagModel
    from rag_core.model.retriever import IndexRetriever
    from rag_core.train.train_config import TrainConfig
    from tasks.adapters.torchrun_launcher import launch_training

    quiet_environment()
    with tempfile.TemporaryDirectory(prefix="wikirag-train-bench-") as tmp:
        root = Path(tmp)
        store, version, task, generator, described = build_inputs(root, args, default_encoder_config())
        config = TrainConfig(task="cloze", train=str(root / "train.jsonl"), generator=generator, n_docs=args.n_docs,
                             batch_size=args.batch_size, max_steps=args.steps, checkpoint_every=0, threads=1,
                             schedule="constant", output="runs/bench")
        rates: dict[int, list[float]] = {1: [], 2: []}
        rss: dict[str, list[int]] = {"in process": [], "dask": [], "dask worker": []}
        rank_peaks: dict[int, list[int]] = {1: [], 2: []}  # every rank's peak RSS, by process count

        def train(nproc: int, output: str, **launch):
            accum = args.batch_size // (nproc * args.micro_batch)
            run_config = config.model_copy(update={"output": output, "grad_accum": accum})
            with PeakRss() as peak:
                result = launch_training(run_config, nproc, store_url=store.url, timeout=600, **launch)
            return result, peak

        for repeat in range(args.repeats):
            for nproc in (1, 2):
                result, peak = train(nproc, f"runs/r{repeat}-p{nproc}")
                rates[nproc].append(result.examples_per_s)
                rank_peaks[nproc] += peak.ranks.values()
                if nproc == 2:
                    rss["in process"] += peak.ranks.values()
                print(f"# repeat {repeat + 1}: {nproc} process(es) {result.examples_per_s:.3f} examples/s, "
                      f"precision {result.precision}", file=sys.stderr)
        precision = result.precision
        from distributed import LocalCluster

        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address="127.0.0.1:0") as cluster:
            dask_result, peak = train(2, "runs/dask-p2", dask_address=cluster.scheduler_address)
        rss["dask"], rss["dask worker"] = list(peak.ranks.values()), list(peak.workers.values())

        retriever = IndexRetriever.load(store, version)
        from rag_core.index.encoders import EncoderConfig
        from rag_core.index.manifest import IndexManifest

        encoder = EncoderConfig(**(IndexManifest.model_validate(retriever.manifest).encoder_config or {}))
        model = RagModel.create(RagConfig(kind="sequence", n_docs=args.n_docs, question_encoder=encoder,
                                          generator=GeneratorConfig(path=generator, dtype="float32")), retriever)
        gen_params = sum(p.numel() for p in model.generator.parameters())
        enc_params = sum(p.numel() for p in model.question_encoder.parameters())
        gen_tokens, q_tokens, context_tokens = step_tokens(model, config, stream(config, task.train, args.steps))
        flops_per_example = 6 * (gen_params * gen_tokens + enc_params * q_tokens)
        eval_seconds = []
        dev = task.dev[: args.eval_examples]
        evaluate_model(model, dev[:1], batch_size=len(dev), max_new_tokens=args.max_new_tokens)  # warm-up
        for _ in range(args.repeats):
            eval_seconds.append(evaluate_model(model, dev, batch_size=len(dev),
                                                   max_new_tokens=args.max_new_tokens).seconds_per_example)
        memory = rank_memory(retriever, gen_params + enc_params, args.micro_batch, args.n_docs)
        from rag_core.index.versions import read_index_manifest
        from rag_core.train.memory_plan import check_training_memory

        planned = {n: check_training_memory(config.model_copy(update={"grad_accum": args.batch_size // (
            n * args.micro_batch)}), n, read_index_manifest(store, version), available=float("inf")) for n in (1, 2)}
        info.finish()

    ratio = [two / one for one, two in zip(rates[1], rates[2])]

    def mib(values: list[int]) -> str:  # one run's processes: listed, not a min/median/max
        return ", ".join(f"{b / 2**20:.0f}" for b in sorted(values)) or "not seen"

    flops = {n: [r * flops_per_example for r in rates[n]] for n in (1, 2)}
    p = PAPER
    paper_tokens = p["n_docs"] * (context_tokens + p["answer_tokens"])
    paper_flops = p["examples"] * p["epochs"] * 6 * (p["params"] / 2 * paper_tokens + p["question_encoder"] * q_tokens)
    lines = [f"## Fine-tuning: examples/s with 1 and 2 DDP processes, capability {info.hardware.capability}", "",
             *info.markdown_header(),
             (f"Generator: {described}; question encoder: the index's all-MiniLM-L6-v2. Index: Flat, "
             f"{args.passages} sample passages (2 shards); cloze task: {len(task.train)} train / {len(task.dev)} dev "
             f"examples. RAG-Sequence, n_docs={args.n_docs}, global batch {args.batch_size} (micro-batches of {args.micro_batch} "
             f"per rank, accumulated: {args.batch_size // args.micro_batch} per step on 1 process, "
             f"{args.batch_size // (2 * args.micro_batch)} on each of 2), {args.steps} optimizer "
             f"steps per run (figure: the recipe's median over steps 2..{args.steps}), autocast {precision}, "
             f"`torchrun --standalone` (gloo), 1 torch thread per process; {args.repeats} repeats, interleaved."), "",
             ("| processes | training examples/s (min / median / max) | achieved FLOP/s, all processes | "
              "peak RSS per rank, MiB (min / median / max) | memory plan per rank (rag_core.train.memory_plan) |"),
             "|---|---|---|---|---|",
             *(f"| {n} | {spread(rates[n])} | {spread([f / 1e9 for f in flops[n]])} G | "
               f"{spread([b / 2**20 for b in rank_peaks[n]], '{:.0f}') if rank_peaks[n] else 'not seen'} | "
               f"{planned[n].per_rank / 2**20:.0f} MiB (+ {planned[n].checkpoint / 2**20:.0f} rank 0) |"
               for n in (1, 2)), "",
             (f"Peak RSS: psutil every 0.2 s, each rank of every run (rank 0 also writes the final checkpoint); "
              f"activation checkpointing {'on' if config.activation_checkpointing else 'off'}."), "",
             (f"Scaling 2 processes / 1: {spread(ratio, '{:.2f}')}x (goal >= 1.6x: "
             f"{'PASS' if statistics.median(ratio) >= 1.6 else 'FAIL'})."), "",
             (f"FLOP/s = 6 x {(gen_params + enc_params) / 1e6:.1f}M parameters x tokens / time: "
             f"{gen_tokens:.0f} generator tokens per example (prompt and answer, {args.n_docs} passages, padding "
             f"excluded) through {gen_params / 1e6:.1f}M parameters and {q_tokens:.1f} question tokens through "
             f"{enc_params / 1e6:.1f}M: {flops_per_example / 1e12:.3f} TFLOP per training example."), "",
             (f"Evaluation (`evaluate_model`, {len(dev)} cloze dev examples in one batch, float32 weights, "
             f"{args.threads} threads, greedy RAG-Sequence, <= {args.max_new_tokens} new tokens): {spread(eval_seconds, '{:.2f}')} s per example."), "",
             "### Projection (an estimate, not a measurement): the RAG paper's NQ fine-tune on one H200", "",
             (f"Assumed: {p['examples']:,} NQ training examples x {p['epochs']} epochs (epoch count assumed), "
             f"BART-large ({p['params'] / 1e6:.0f}M parameters; each token passes through about half: encoder or "
             f"decoder), n_docs={p['n_docs']}, {context_tokens:.0f} passage+question tokens per document (measured "
             f"here with this generator's tokenizer, cut at 300) + {p['answer_tokens']} answer tokens, the "
             f"{p['question_encoder'] / 1e6:.0f}M-parameter BERT-base question encoder on {q_tokens:.1f} tokens: "
             f"6 x params x tokens = {paper_flops / 1e18:.1f} EFLOP in all. H200 bf16 dense peak "
             f"{H200_BF16_DENSE / 1e12:.0f} TFLOP/s."), "",
             "| utilisation of the peak (assumed) | projected hours on one H200 |", "|---|---|",
             *(f"| {u:.0%} | {paper_flops / (H200_BF16_DENSE * u) / 3600:.2f} |" for u in UTILISATION), "",
             (f"At this machine's median rate with 2 processes ({statistics.median(flops[2]) / 1e9:.0f} GFLOP/s) the "
             f"same work would take {paper_flops / statistics.median(flops[2]) / 86400:,.0f} days."), "",
             "### Memory of a training rank: measured here, and for 21M passages", "",
             (f"Peak RSS of each rank of the 2-process runs (psutil, every 0.2 s): retrieving in process (each rank "
             f"loads this {args.passages}-passage index; {len(rss['in process'])} ranks over {args.repeats} runs): "
             f"{spread([b / 2**20 for b in rss['in process']], '{:.0f}') if len(rss['in process']) >= 3 else mib(rss['in process'])} MiB; through a local Dask cluster holding "
             f"it once (`--dask-address`, 1 worker; one run, {dask_result.examples_per_s:.3f} examples/s): "
             f"{mib(rss['dask'])} MiB (rank by rank), the worker {mib(rss['dask worker'])} MiB (the scheduler runs "
             "in the bench process)."), "",
             "| held by one rank, 21M passages | each rank loads the index | ranks share the Dask-held index | how |",
             "|---|---|---|---|",
             *(f"| {what} | {a / 1e9:.1f} GB | {b / 1e9:.3g} GB | {how} |" for what, a, b, how in memory),
             (f"| total per rank | {sum(a for _, a, _, _ in memory) / 1e9:.1f} GB | "
              f"{sum(b for _, _, b, _ in memory) / 1e9:.3g} GB | |"), ""]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
