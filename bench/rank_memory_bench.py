"""Memory of a training rank: the 4,391-passage sample against a 200k-passage index, retrieving through Dask or not.

Four kinds of 2-rank training run (``tasks.adapters.torchrun_launcher.launch_training``: ``torchrun --standalone``,
gloo, 1 torch thread per rank), the same recipe, examples and models in all three, only the index differing:

- **sample, shared**: the real sample's 4,391 passages, held by a local Dask cluster (1 worker) that both ranks
  retrieve through (``--dask-address``: :class:`tasks.adapters.dask_retriever.DaskRetriever`, one share name);
- **200k, shared**: ``--corpus``'s passages (default: ``bench/make_corpus.py``'s 200,000 recombined passages),
  the same way;
- **200k, in process**: the same 200k version loaded by each rank itself (``IndexRetriever``), for contrast;
- **sample, in process**: the sample loaded by each rank (against "sample, shared": what a rank's Dask client
  costs beside the small index it replaces).

Each kind runs ``--repeats`` times, interleaved (a fresh cluster per shared run). For each run the peak RSS of
each rank and of the Dask worker is sampled with psutil every 0.2 s (``train_bench.PeakRss``). The figure of
merit is the shared path's rank peak at 200k over the sample's (goal <= 1.2).

Encoder: a random-weight BERT of all-MiniLM-L6-v2's width (384, so the stored vectors and the Flat index have the
real bytes per passage), 2 layers, 32 positions, MiniLM's tokenizer: the same Encoder code path, cheap enough to
embed 200k passages in minutes. It is also the question tower being trained. Generator: a tiny random BART
(``train_bench.TINY``). The towers are the same in every run; only the index grows. Both indexes are Flat, 2 shards;
they and the encoder are built once under ``--work`` and reused.

    python bench/rank_memory_bench.py --work DIR [--corpus PASSAGES.parquet] [--repeats 3] [--markdown FILE]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo, alternating, bench_parser, parse_bench_args, publish, spread  # noqa: E402
from train_bench import TINY, PeakRss  # noqa: E402
from scale_bench import save_tiny_encoder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WIDTH = 384  # all-MiniLM-L6-v2's hidden size: the vector width of the real index
SHARDS = 2
RANKS = 2
KINDS = ("sample, shared", "200k, shared", "200k, in process", "sample, in process")
GOAL = 1.2
CLIENT_CHEAPER = "a rank with a Dask client holds less than one that loads even the sample in process"
CLIENT_COSTS = "what a Dask client costs a rank beyond the sample index it replaces"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def corpus_passages(corpus: Path | None):
    """``corpus`` (make_corpus.py's columns passage_id, title, text) in the passage schema; None: make_corpus's 200k."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rag_core.wiki.passages import PASSAGE_SCHEMA

    if corpus is None:
        from make_corpus import build_passages

        corpus = build_passages(200_000, 0, 40)
    table = pq.read_table(corpus, columns=["passage_id", "title", "text"])
    n = table.num_rows
    words = [len(t.split()) for t in table.column("text").to_pylist()]
    return pa.table({"passage_id": table.column("passage_id"), "page_id": pa.array(range(n), pa.int64()),
                     "revision_id": pa.array([1] * n, pa.int64()), "chunk": pa.array([0] * n, pa.int32()),
                     "title": table.column("title"), "text": table.column("text"),
                     "n_words": pa.array(words, pa.int32())}, schema=PASSAGE_SCHEMA)


def build_inputs(work: Path, corpus: Path | None) -> dict:
    """The store with both index versions, the encoder, the cloze train file and the generator, made once."""
    from rag_core.index.encoders import Encoder, EncoderConfig
    from rag_core.model.generators import GeneratorConfig, default_generator
    from rag_core.storage import Store
    from rag_core.train.cloze import ClozeConfig, cloze_examples
    from rag_core.train.examples import write_examples
    from tests.helpers.passagefiles import publish_small_index, sample_passages

    saved = work / "inputs.json"
    if saved.exists():
        return json.loads(saved.read_text())
    work.mkdir(parents=True, exist_ok=True)
    store = Store(str(work / "store"))
    encoder = Encoder.load(EncoderConfig(path=str(save_tiny_encoder(work / "encoder", width=WIDTH, intermediate=WIDTH)), dtype="float32"))
    sample = sample_passages()
    t0 = time.perf_counter()
    versions = {"sample": publish_small_index(store, "sample", sample, encoder, shards=SHARDS)}
    large = corpus_passages(corpus)
    versions["200k"] = publish_small_index(store, "corpus", large, encoder, shards=SHARDS)
    log(f"indexes built in {time.perf_counter() - t0:.0f} s")
    task = cloze_examples(sample.slice(0, 300), ClozeConfig(seed=0, dev_fraction=0.2))
    write_examples(task.train, str(work / "train.jsonl"))
    model, tokenizer = default_generator(GeneratorConfig(**TINY), 512)
    model.save_pretrained(work / "bart")
    tokenizer.save_pretrained(work / "bart")
    inputs = {"store": store.url, "versions": versions, "passages": {"sample": sample.num_rows, "200k": large.num_rows},
              "train": str(work / "train.jsonl"), "generator": str(work / "bart"),
              "corpus": str(corpus) if corpus else "bench/make_corpus.py's recombined sample sentences"}
    saved.write_text(json.dumps(inputs, indent=2))
    return inputs


def one_run(inputs: dict, kind: str, output: str, config) -> tuple[list[int], list[int], list[float]]:
    """(each rank's peak RSS, each Dask worker's peak RSS, the run's losses) of one RANKS-rank run of ``kind``."""
    from distributed import LocalCluster

    from tasks.adapters.torchrun_launcher import launch_training

    version = inputs["versions"]["sample" if kind.startswith("sample") else "200k"]
    run_config = config.model_copy(update={"output": output, "index_version": version})
    if kind.endswith("in process"):
        with PeakRss() as peak:
            result = launch_training(run_config, RANKS, store_url=inputs["store"], timeout=900)
    else:
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address="127.0.0.1:0") as cluster, PeakRss() as peak:
            result = launch_training(run_config, RANKS, store_url=inputs["store"], timeout=900,
                                     dask_address=cluster.scheduler_address)
    if result.index_version != version:
        raise RuntimeError(f"{kind}: trained on {result.index_version}, not {version}")
    # A process a rank starts carries the rank's command line until it execs, and psutil may sample it there (a
    # fraction of the rank's RSS, as one more "rank"): the run's ranks are its RANKS largest.
    return sorted(peak.ranks.values())[-RANKS:], list(peak.workers.values()), list(result.losses)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, what="runs of each kind, interleaved")
    parser.add_argument("--work", type=Path, required=True, help="cache folder: encoder, store and both indexes "
                        "are built there once and reused")
    parser.add_argument("--corpus", type=Path, help="passages parquet (passage_id, title, text); default: "
                        "bench/make_corpus.py's 200,000 (made if missing)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=4, help="global batch (micro-batches of 1 per rank)")
    parser.add_argument("--n-docs", type=int, default=2)
    args = parse_bench_args(parser, argv)

    import torch

    torch.set_num_threads(1)
    info = RunInfo.start(argv if argv is None else [sys.argv[0], *argv])
    from runtime.settings import quiet_environment
    from rag_core.train.train_config import TrainConfig

    quiet_environment()
    inputs = build_inputs(args.work.resolve(), args.corpus)
    config = TrainConfig(task="cloze", train=inputs["train"], generator=inputs["generator"], n_docs=args.n_docs,
                         batch_size=args.batch_size, max_steps=args.steps,
                         checkpoint_every=0, threads=1, precision="float32", schedule="constant", output="runs/x")
    ranks: dict[str, list[int]] = {k: [] for k in KINDS}
    workers: dict[str, list[int]] = {k: [] for k in KINDS}
    losses: dict[str, list[list[float]]] = {k: [] for k in KINDS}
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for repeat, kind in alternating(KINDS, args.repeats):
        r, w, lost = one_run(inputs, kind, f"runs/{stamp}-{kind.replace(', ', '-').replace(' ', '-')}-{repeat}",
                             config)
        ranks[kind] += r
        workers[kind] += w
        losses[kind].append(lost)
        log(f"# repeat {repeat + 1} {kind}: ranks {[round(b / 2**20) for b in r]} MiB, "
            f"workers {[round(b / 2**20) for b in w]} MiB, losses {lost}")
    info.finish()
    publish(render(info, inputs, args, ranks, workers, losses), args.markdown)
    return 0


def render(info: RunInfo, inputs: dict, args, ranks: dict, workers: dict, losses: dict) -> str:
    def mib(values: list[int]) -> str:
        return spread([b / 2**20 for b in values], "{:,.0f}") if len(values) >= 3 else "not seen"

    shared = {k: statistics.median(ranks[k]) for k in KINDS[:2]}
    ratio = shared["200k, shared"] / shared["sample, shared"]
    worst = max(ranks["200k, shared"]) / max(ranks["sample, shared"])
    same = {size: all(lost == losses[f"{size}, shared"][0] for lost in
                      losses[f"{size}, shared"] + losses[f"{size}, in process"]) for size in ("sample", "200k")}
    n = inputs["passages"]
    client = shared["sample, shared"] - statistics.median(ranks["sample, in process"])
    extra = (statistics.median(ranks["200k, in process"]) - shared["200k, shared"]) / n["200k"]
    lines = [f"## Memory of a training rank: {n['sample']:,} vs {n['200k']:,} passages, through Dask or in process",
             "", *info.markdown_header(),
             (f"2 ranks (`torchrun --standalone`, gloo, 1 torch thread each), {args.steps} optimizer steps of a global "
              f"batch {args.batch_size} (micro-batches of 1), RAG-Sequence n_docs={args.n_docs}, float32; the same "
              f"cloze train file (300 sample passages) in every run. Question encoder: a random 2-layer BERT of "
              f"MiniLM's width ({WIDTH}-d vectors, MiniLM's tokenizer, 32 positions), also the index's encoder; "
              f"generator: a random BART {TINY}. Indexes: Flat, {SHARDS} shards each, published with their stored "
              f"vectors: the real sample ({n['sample']:,} passages) and {inputs['corpus']} ({n['200k']:,} passages). "
              f"Shared: a fresh local Dask cluster per run (1 worker, 1 thread; scheduler in the bench process). "
              f"Peak RSS: psutil every 0.2 s, each rank of each run ({args.repeats} runs per kind, interleaved)."), "",
             "| run | index passages | peak RSS per rank, MiB (min / median / max) | Dask worker peak RSS, MiB "
             "(min / median / max) |", "|---|---:|---:|---:|",
             *(f"| {k} | {n['sample' if k.startswith('sample') else '200k']:,} | {mib(ranks[k])} | "
               f"{mib(workers[k]) if workers[k] else 'none'} |" for k in KINDS), "",
             (f"Shared path, rank peak at {n['200k']:,} / at {n['sample']:,}: {ratio:.3f} (medians), {worst:.3f} "
              f"(maxima); goal <= {GOAL}: {'PASS' if max(ratio, worst) <= GOAL else 'FAIL'}. In process at "
              f"{n['200k']:,}: {statistics.median(ranks['200k, in process']) / shared['sample, shared']:.2f}x the "
              f"shared sample's median, {extra:,.0f} B per passage above the shared 200k median (the Flat index "
              f"and the stored vectors alone are 2 x 4 x {WIDTH} = {8 * WIDTH:,} B; the rest is the Arrow columns "
              f"and the loader's copies). On the sample, shared minus in process: {client / 2**20:+,.0f} MiB per rank "
              f"(medians): {CLIENT_CHEAPER if client <= 0 else CLIENT_COSTS}."), "",
             *(f"Per-step losses on {size} ({n[size]:,} passages): {'identical' if same[size] else 'NOT identical'} in "
               f"every shared and in-process run ({', '.join(f'{x:.6f}' for x in losses[f'{size}, shared'][0])})."
               for size in ("sample", "200k")), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
