"""RAG training step and generation side by side: wikirag's RagModel vs transformers' RAG classes.

One run, the same modules for both engines: a ``RagModel.create`` model (the packaged
all-MiniLM-L6-v2 as question encoder, the default generator: a seeded 2 + 2-layer,
d_model 128 BART over the MiniLM vocabulary, ~5M parameters) over a small real index
(the first ``--passages`` DPR-style passages of the Wikipedia sample, embedded by the
same MiniLM; cached in ``bench/.cache/rag_bench/``), and transformers'
``RagSequenceForGeneration`` / ``RagTokenForGeneration(question_encoder=...,
generator=...)`` wrapped around those very modules. Questions and answers: the first
``--batch`` of NQ-open dev. Retrieval (FAISS search + context tokenization) happens
once, before timing, and is not timed; both engines get its ``context_input_ids`` and
mask, padded to the longest row (``max_context_length`` 300).

* Training step, per kind (``sequence``, ``token``): question encoder forward on the
  questions -> ``doc_scores`` = <q, stored passage vectors> (so gradients reach the
  encoder the same way on both sides) -> then wikirag: ``RagModel.forward`` (generator
  on ``[start, y[:-1]]`` + ``rag_core.model.marginalize``), ``.sum()``; transformers:
  ``RagXForGeneration(context_input_ids, context_attention_mask, doc_scores,
  labels=[start, y], n_docs, reduce_loss=True)`` -> ``backward()``. Train mode
  (dropout on). ``--warmup`` steps each, then ``--steps`` steps each, interleaved
  (AB, BA, AB, ...) so that machine noise hits both; median s/step and the ratio
  transformers / wikirag (> 1: wikirag faster). The losses and d loss / d question
  vector are compared in eval mode first (max abs diff).
* Peak memory of a training step: one child process per (engine, kind), run one after
  another: build the model, retrieve, read RSS, reset the peak (``/proc/self/clear_refs``),
  run ``--memory-steps`` steps (the first is the warm-up), report peak RSS (VmHWM)
  minus the RSS after the build.
* Generation, on the first ``--gen-batch`` questions' contexts cut to the shortest
  row (so no row is padded: transformers' RagSequenceForGeneration.generate drops the
  mask), with the generator's weights re-drawn at init_std 0.5 and pad never emitted
  (as ``decoding_bench.py``, so that the documents change the answer): RAG-Token greedy
  and RAG-Sequence thorough (``--beams``), ``rag_core.model.decoding`` vs transformers'
  ``generate`` (same outputs expected), and RAG-Sequence fast vs thorough. Rows take
  turns ``--reps`` times (at least 3).

Every figure is min / median / max over at least 3 measurements, and every ratio is
taken within one measurement (the two steps of one interleaved turn, the two memory
children of one repetition, the two calls of one generation turn) and then summarised
the same way. Goals, printed with PASS/FAIL on the median: training step >= 1.0x
transformers' speed and peak memory <= 1.0x transformers', for each kind. The machine
is shared: the load average is recorded at start and end (bench/report.py);
interleaving shares the noise but does not remove it.

    python bench/rag_bench.py --quick                       # 3 steps, batch 4 generation, 3 repetitions (~3-4 min)
    python bench/rag_bench.py --markdown bench/results/rag.md   # 10 steps, batch 8 generation, 3 repetitions (~6-9 min)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.decoding_bench import strip  # noqa: E402
from bench.report import MIN_REPEATS, RunInfo, reset_peak_rss, spread, status_bytes  # noqa: E402
from rag_core.model.decoding import rag_sequence_generate, rag_token_generate  # noqa: E402
from rag_core.model.rag_model import RagConfig, RagModel  # noqa: E402

SAMPLE = REPO.parent / "shared/data/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
NQ_DEV = REPO.parent / "shared/data/qa/nq_open/NQ-open.dev.jsonl"
CACHE = REPO / "bench/.cache/rag_bench"
KINDS = ("sequence", "token")
ENGINES = ("wikirag", "transformers")


# ----------------------------------------------------------------------------- set-up


def quiet() -> None:
    from transformers.utils import logging

    warnings.filterwarnings("ignore")
    logging.set_verbosity_error()
    logging.disable_progress_bar()


def index_version(passages: int):
    """(store, version) of a Flat index over the sample's first ``passages`` passages; built once, then cached."""
    from rag_core.storage import Store

    root = CACHE / f"p{passages}"
    store, marker = Store(str(root / "store")), root / "version.txt"
    if marker.is_file():
        return store, marker.read_text().strip()
    from rag_core.index.build import build_version
    from rag_core.index.embedding_files import EmbedConfig
    from rag_core.index.faiss_index import IndexConfig
    from tests.helpers.passagefiles import publish_passages, sample_passages

    publish_passages(store, "sample", sample_passages().slice(0, passages))
    version = build_version(store, "sample", EmbedConfig(shards=1), IndexConfig(factory="Flat"))
    marker.write_text(version)
    return store, version


def nq_pairs(count: int) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in NQ_DEV.read_text().splitlines()[:count]]
    return [r["question"] for r in rows], [r["answer"][0] for r in rows]


@dataclasses.dataclass
class Inputs:
    """What both engines are fed: retrieved once, before any timing."""

    questions: list[str]
    batch: object  # RetrievalBatch: context_input_ids, context_attention_mask [b * n_docs, L]
    doc_vectors: torch.Tensor  # float32 [b, n_docs, dim], the stored passage vectors (frozen)
    labels: torch.Tensor  # long [b, T]: wikirag's targets
    hf_labels: torch.Tensor  # long [b, 1 + T]: transformers' convention, [decoder_start, targets]


def build(kind: str, args) -> tuple[RagModel, torch.nn.Module, Inputs]:
    """RagModel (kind), transformers' RagXForGeneration around the same modules, and the inputs."""
    from transformers import RagConfig as HFRagConfig
    from transformers import RagSequenceForGeneration, RagTokenForGeneration

    from rag_core.model.retriever import IndexRetriever

    store, version = index_version(args.passages)
    model = RagModel.create(RagConfig(kind=kind, n_docs=args.n_docs), IndexRetriever.load(store, version))
    hf_config = HFRagConfig.from_question_encoder_generator_configs(
        model.question_encoder.model.config, model.generator.config, n_docs=args.n_docs)
    cls = RagSequenceForGeneration if kind == "sequence" else RagTokenForGeneration
    reference = cls(config=hf_config, question_encoder=model.question_encoder.model, generator=model.generator)
    questions, answers = nq_pairs(args.batch)
    with torch.no_grad():
        batch = model.retrieve(questions)
        found = model.retriever.retrieve(batch.question_vectors.numpy(), args.n_docs)
    labels = model.answer_labels(answers)  # [b, T]
    start = labels.new_full((labels.shape[0], 1), model.decoder_start_token_id)  # [b, 1]
    inputs = Inputs(questions, batch, torch.from_numpy(found.doc_vectors), labels, torch.cat([start, labels], 1))
    return model, reference, inputs


# ----------------------------------------------------------------------------- one training step


def scored(model: RagModel, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Question vectors [b, dim] and doc_scores [b, n_docs], differentiable in the question encoder."""
    q = model.question_encoder(inputs.questions)  # [b, dim]
    return q, torch.bmm(q.unsqueeze(1), inputs.doc_vectors.transpose(1, 2)).squeeze(1)  # [b, 1, n] -> [b, n]


def wikirag_loss(model, reference, inputs: Inputs, reduce: bool = True):
    q, doc_scores = scored(model, inputs)
    loss = model(dataclasses.replace(inputs.batch, question_vectors=q, doc_scores=doc_scores), inputs.labels)  # [b]
    return (loss.sum() if reduce else loss), q


def transformers_loss(model, reference, inputs: Inputs, reduce: bool = True):
    q, doc_scores = scored(model, inputs)
    loss = reference(context_input_ids=inputs.batch.context_input_ids,
                     context_attention_mask=inputs.batch.context_attention_mask, doc_scores=doc_scores,
                     labels=inputs.hf_labels, n_docs=doc_scores.shape[1], reduce_loss=reduce).loss
    return loss, q


LOSSES = {"wikirag": wikirag_loss, "transformers": transformers_loss}


def train_step(engine: str, model, reference, inputs: Inputs) -> float:
    model.zero_grad(set_to_none=True)
    loss, _ = LOSSES[engine](model, reference, inputs)
    loss.backward()
    return loss.item()


def compare_losses(model, reference, inputs: Inputs) -> tuple[float, float, float]:
    """Eval mode: (max |loss diff| per example, max |d loss / d q diff|, max |loss|)."""
    model.eval()
    out = {}
    for engine, fn in LOSSES.items():
        loss, q = fn(model, reference, inputs, reduce=False)  # [b]
        (grad,) = torch.autograd.grad(loss.sum(), q)
        out[engine] = loss.detach(), grad
    (a, ga), (b, gb) = out["wikirag"], out["transformers"]
    return (a - b).abs().max().item(), (ga - gb).abs().max().item(), a.abs().max().item()


# ----------------------------------------------------------------------------- memory (child process)


def memory_child(args) -> None:
    """Build, read RSS, reset the peak, run warm-up + steps; print {"base_mb", "peak_mb", "delta_mb", "how"}."""
    engine, kind = args.memory_child.split(",")
    torch.set_num_threads(args.threads)
    quiet()
    model, reference, inputs = build(kind, args)
    model.train()
    gc.collect()
    base = status_bytes("VmRSS") / 1024
    try:
        reset_peak_rss()
        how = "VmHWM after clear_refs"
    except OSError:
        how = "ru_maxrss (peak since start: an upper bound)"
    for _ in range(args.memory_steps):
        train_step(engine, model, reference, inputs)
    peak = status_bytes("VmHWM") / 1024
    print(json.dumps({"base_mb": base / 1024, "peak_mb": peak / 1024, "delta_mb": (peak - base) / 1024, "how": how}))


def measure_memory(engine: str, kind: str, args) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--memory-child", f"{engine},{kind}",
               "--memory-steps", str(args.memory_steps), "--threads", str(args.threads),
               "--batch", str(args.batch), "--n-docs", str(args.n_docs), "--passages", str(args.passages)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory child {engine}/{kind} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- generation


def redraw(generator, std: float = 0.5, seed: int = 0) -> None:
    """Weights at ``init_std`` 0.5, pad never emitted (decoding_bench.py): documents change the answer."""
    generator.config.init_std = std
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for module in generator.modules():
            generator._init_weights(module)
        generator.final_logits_bias[0, generator.config.pad_token_id] = -1e4


def generation(model: RagModel, inputs: Inputs, args) -> tuple[dict, dict, dict]:
    from transformers import RagConfig as HFRagConfig
    from transformers import RagSequenceForGeneration, RagTokenForGeneration

    generator, n, b = model.generator, args.n_docs, args.gen_batch
    redraw(generator)
    model.eval()
    hf_config = HFRagConfig.from_question_encoder_generator_configs(
        model.question_encoder.model.config, generator.config, n_docs=n)
    parts = dict(config=hf_config, question_encoder=model.question_encoder.model, generator=generator)
    token_ref, sequence_ref = RagTokenForGeneration(**parts).eval(), RagSequenceForGeneration(**parts).eval()
    width = int(inputs.batch.context_attention_mask[: b * n].sum(dim=1).min())  # the shortest row: no padding
    ids = inputs.batch.context_input_ids[: b * n, :width].contiguous()  # [b * n_docs, width]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        doc_scores = scored(model, dataclasses.replace(inputs, questions=inputs.questions[:b],
                                                       doc_vectors=inputs.doc_vectors[:b]))[1]  # [b, n_docs]
    common = dict(context_input_ids=ids, context_attention_mask=mask, doc_scores=doc_scores, n_docs=n)
    ours = dict(max_length=args.max_length, min_length=2)
    rows = {
        "token greedy / transformers": lambda: token_ref.generate(**common, num_beams=1, **ours),
        "token greedy / wikirag": lambda: rag_token_generate(generator, ids, mask, doc_scores, n, num_beams=1, **ours),
        "sequence thorough / transformers": lambda: sequence_ref.generate(**common, num_beams=args.beams, **ours),
        "sequence thorough / wikirag": lambda: rag_sequence_generate(generator, ids, mask, doc_scores, n,
                                                                     num_beams=args.beams, **ours).sequences,
        "sequence fast / wikirag": lambda: rag_sequence_generate(generator, ids, mask, doc_scores, n, mode="fast",
                                                                 num_beams=args.beams, **ours).sequences,
    }
    times, outputs = {name: [] for name in rows}, {}
    with torch.no_grad():
        for name, call in rows.items():  # warm-up: first calls allocate and pick kernels
            outputs[name] = call()
        for _ in range(args.reps):
            for name, call in rows.items():
                t0 = time.perf_counter()
                outputs[name] = call()
                times[name].append(time.perf_counter() - t0)
    same = {}
    for kind in ("token greedy", "sequence thorough"):
        x, y = strip(outputs[f"{kind} / wikirag"]), strip(outputs[f"{kind} / transformers"])
        same[kind] = x.shape == y.shape and torch.equal(x, y)
    thorough, fast = strip(outputs["sequence thorough / wikirag"]), strip(outputs["sequence fast / wikirag"])
    w = max(thorough.shape[1], fast.shape[1])
    thorough = torch.nn.functional.pad(thorough, (0, w - thorough.shape[1]), value=generator.config.pad_token_id)
    fast = torch.nn.functional.pad(fast, (0, w - fast.shape[1]), value=generator.config.pad_token_id)
    agreement = (thorough == fast).all(dim=1).float().mean().item()
    info = {"width": width, "agreement": agreement, "answer_tokens": thorough.shape[1] - 1}
    return times, same, info


# ----------------------------------------------------------------------------- report


def _ratios(slow: list[float], fast: list[float]) -> list[float]:
    return [a / b for a, b in zip(slow, fast)]


def report(args, info: RunInfo, settings: dict, train: dict, memory: dict, gen: tuple) -> tuple[list[str], str]:
    times, same, info_gen = gen
    lines, verdicts = [], []
    lines.append("| kind | wikirag s/step | transformers s/step | speed (transformers / wikirag, per turn) | "
                 "loss max abs diff (max loss) | d loss/d q max abs diff |")
    lines.append("|---|---:|---:|---:|---|---|")
    for kind, r in train.items():
        speed = _ratios(r["transformers"], r["wikirag"])
        lines.append(f"| {kind} | {spread(r['wikirag'], '{:.3f}')} | {spread(r['transformers'], '{:.3f}')} | "
                     f"{spread(speed, '{:.2f}x')} | {r['loss_diff']:.2e} ({r['loss_max']:.1f}) | {r['grad_diff']:.2e} |")
        med = statistics.median(speed)
        verdicts.append(f"{'PASS' if med >= 1.0 else 'FAIL'}: {kind} training step {med:.2f}x transformers' speed "
                        f"(median of {len(speed)} turns; goal >= 1.0x)")
    mem = ["| kind | wikirag MB | transformers MB | ratio (wikirag / transformers, per repetition) | RSS after "
           "build, MB (wikirag / transformers, median) |", "|---|---:|---:|---:|---|"]
    for kind, r in memory.items():
        ours = [m["delta_mb"] for m in r["wikirag"]]
        theirs = [m["delta_mb"] for m in r["transformers"]]
        ratio = _ratios(ours, theirs)
        base = "/".join(f"{statistics.median(m['base_mb'] for m in r[e]):.0f}" for e in ENGINES)
        mem.append(f"| {kind} | {spread(ours, '{:.0f}')} | {spread(theirs, '{:.0f}')} | {spread(ratio, '{:.2f}x')} "
                   f"| {base} |")
        med = statistics.median(ratio)
        verdicts.append(f"{'PASS' if med <= 1.0 else 'FAIL'}: {kind} training step peak memory {med:.2f}x "
                        f"transformers' (median of {len(ratio)} repetitions; goal <= 1.0x)")
    gen_rows = ["| row | s/call | questions/s |", "|---|---:|---:|"]
    gen_rows += [f"| {name} | {spread(t, '{:.3f}')} | {spread([args.gen_batch / x for x in t], '{:.1f}')} |"
                 for name, t in times.items()]
    gen_lines = []
    for kind in ("token greedy", "sequence thorough"):
        speed = _ratios(times[f"{kind} / transformers"], times[f"{kind} / wikirag"])
        gen_lines.append(f"{kind}: wikirag {spread(speed, '{:.2f}x')} transformers' speed (per turn), same outputs: "
                         f"{same[kind]}")
    fast = _ratios(times["sequence thorough / wikirag"], times["sequence fast / wikirag"])
    gen_lines.append(f"sequence fast: {spread(fast, '{:.2f}x')} thorough's speed (per turn), top-1 agreement with "
                     f"thorough {info_gen['agreement']:.0%} "
                     f"({int(round(info_gen['agreement'] * args.gen_batch))}/{args.gen_batch})")
    setting_lines = [f"- {k}: {v}" for k, v in settings.items()]
    how = memory[KINDS[0]]["wikirag"][0]["how"]
    printed = (["Settings:", *setting_lines, "", f"Training step ({args.steps} interleaved steps each, after "
                f"{args.warmup} warm-up):", *lines, "", "Peak memory of a training step (peak RSS minus RSS "
                f"after build, over {args.memory_steps} steps of which the first is the warm-up, one child process per "
                f"row and repetition; peak = {how}):", *mem,
                "", f"Generation (batch {args.gen_batch}, {args.reps} repetitions):", *gen_rows, "", *gen_lines, "",
                *verdicts])
    md = "\n".join([
        "## RAG training step and generation: `bench/rag_bench.py`", "", *info.markdown_header(),
        "Figures are min / median / max; every ratio is taken within one turn or repetition.", "",
        *setting_lines, "", f"### Training step (forward + backward), {args.steps} interleaved steps per engine", "",
        *lines, "", "### Peak memory of a training step", "",
        f"Peak RSS minus RSS after the build, over {args.memory_steps} steps (the first is the warm-up), one child "
        f"process per row, {args.memory_reps} repetitions of all rows, one process after another; peak = {how}.", "",
        *mem, "", f"### Generation (batch {args.gen_batch}, one warm-up call, then {args.reps} repetitions)", "",
        *gen_rows, "", *[f"- {x}" for x in gen_lines], "", "### Goals", "", *[f"- {v}" for v in verdicts], ""])
    return printed, md


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 steps, batch-4 generation, best of 1")
    p.add_argument("--batch", type=int, default=8, help="questions per training step")
    p.add_argument("--n-docs", type=int, default=5)
    p.add_argument("--passages", type=int, default=200, help="passages in the (cached) index")
    p.add_argument("--steps", type=int, help="timed steps per engine and kind (default 10; --quick 3)")
    p.add_argument("--memory-reps", type=int, default=MIN_REPEATS,
                   help=f"repetitions of the memory children (default and minimum {MIN_REPEATS})")
    p.add_argument("--warmup", type=int, help="untimed steps per engine and kind first (default 2; --quick 1)")
    p.add_argument("--memory-steps", type=int, help="steps in each memory child (default 3; --quick 2)")
    p.add_argument("--gen-batch", type=int, help="questions for generation (default 8; --quick 4)")
    p.add_argument("--reps", type=int, help=f"generation repetitions per row (default and minimum {MIN_REPEATS})")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--max-length", type=int, default=20)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: these steps are small, and on a shared 2-core machine a "
                        "second thread's barriers cost more than it gains; see tests/rag_core/model/test_rag_model.py)")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick
    args.steps = args.steps or (MIN_REPEATS if q else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 2)
    args.memory_steps = args.memory_steps or (2 if q else 3)
    args.gen_batch = min(args.gen_batch or (4 if q else 8), args.batch)
    args.reps = args.reps or MIN_REPEATS
    if min(args.steps, args.reps, args.memory_reps) < MIN_REPEATS and not args.memory_child:
        p.error(f"--steps, --reps and --memory-reps must be at least {MIN_REPEATS}: every figure is a min / median / max")
    if args.memory_child:
        return memory_child(args)
    for path in (SAMPLE, NQ_DEV):
        if not path.is_file():
            sys.exit(f"{path} not found: this benchmark reads the real data in ../shared/data (see its README)")
    torch.set_num_threads(args.threads)
    quiet()
    info = RunInfo.start(argv and [sys.argv[0], *argv])
    started, load_start = time.perf_counter(), os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f} (1 min), {load_start[1]:.2f} (5 min) on "
          f"{os.cpu_count()} cores; building the index (cached) and models...", flush=True)

    train = {}
    for kind in KINDS:
        model, reference, inputs = build(kind, args)
        loss_diff, grad_diff, loss_max = compare_losses(model, reference, inputs)
        model.train()
        times = {engine: [] for engine in ENGINES}
        for _ in range(args.warmup):
            for engine in ENGINES:
                train_step(engine, model, reference, inputs)
        for step in range(args.steps):
            for engine in ENGINES if step % 2 == 0 else ENGINES[::-1]:  # AB, BA, AB, ...
                t0 = time.perf_counter()
                train_step(engine, model, reference, inputs)
                times[engine].append(time.perf_counter() - t0)
        med = {engine: statistics.median(t) for engine, t in times.items()}
        train[kind] = {**times, "ratio": med["transformers"] / med["wikirag"], "loss_diff": loss_diff,
                       "grad_diff": grad_diff, "loss_max": loss_max}
        print(f"{kind}: wikirag {med['wikirag']:.3f} s/step, transformers {med['transformers']:.3f} s/step "
              f"({train[kind]['ratio']:.2f}x); losses differ by {loss_diff:.2e}", flush=True)
        shape = (tuple(inputs.batch.context_input_ids.shape), tuple(inputs.labels.shape))
        if kind != KINDS[-1]:
            del model, reference, inputs
            gc.collect()

    memory = {kind: {engine: [] for engine in ENGINES} for kind in KINDS}
    for rep in range(args.memory_reps):
        for kind in KINDS:
            for engine in ENGINES if rep % 2 == 0 else ENGINES[::-1]:
                memory[kind][engine].append(measure_memory(engine, kind, args))
            print(f"{kind} peak memory, repetition {rep + 1}: wikirag {memory[kind]['wikirag'][-1]['delta_mb']:.0f} MB, "
                  f"transformers {memory[kind]['transformers'][-1]['delta_mb']:.0f} MB", flush=True)

    print("generation...", flush=True)
    gen = generation(model, inputs, args)
    params = lambda m: f"{sum(p.numel() for p in m.parameters()) / 1e6:.1f}M"  # noqa: E731
    import transformers

    settings = {
        "question encoder": f"packaged all-MiniLM-L6-v2 (BertModel, 6 layers, 384-d, {params(model.question_encoder)}"
                            " parameters), float32, trained",
        "generator": f"RagModel's default: BART 2 + 2 layers, d_model 128, vocab 30522 ({params(model.generator)} "
                     "parameters); generation rows: its weights re-drawn at init_std 0.5, pad never emitted",
        "index": f"Flat, first {args.passages} passages of the Wikipedia sample (MiniLM bf16 vectors)",
        "training batch": f"{args.batch} NQ-open dev questions x {args.n_docs} docs; context_input_ids "
                          f"{shape[0][0]} x {shape[0][1]} (padded to the longest row); labels {shape[1][0]} x "
                          f"{shape[1][1]} (transformers: 1 + {shape[1][1]}); loss summed over the batch "
                          "(reduce_loss=True); train mode (dropout on); retrieval not timed",
        "generation": f"{args.gen_batch} questions x {args.n_docs} docs, contexts cut to the shortest row "
                      f"({gen[2]['width']} tokens, unpadded), beams {args.beams}, max_length {args.max_length}, "
                      "min_length 2",
        "threads": f"torch.set_num_threads({args.threads})",
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}, Python "
                    f"{sys.version.split()[0]}",
        "run time": f"{time.perf_counter() - started:.0f} s",
    }
    info.finish()
    printed, md = report(args, info, settings, train, memory, gen)
    print("\n" + "\n".join(printed))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(md, encoding="utf-8")
        print(f"\nmarkdown written to {args.markdown}")


if __name__ == "__main__":
    main()
