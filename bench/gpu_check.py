"""Three figures on one GPU in under 5 minutes: passages/s of the encoder, training examples/s, ask latency.

Everything runs through the project's own code on the device :func:`rag_core.perf.device.choose_device`
picks, in the precision :func:`rag_core.perf.precision.choose_precision` picks there (bf16 on GPUs that
support it):

- **passages/s**: ``Encoder.encode_passages`` (the index build's encoder) over ``--passages`` synthetic
  passages of ``--words`` words, packaged all-MiniLM-L6-v2 (``dtype auto``);
- **training examples/s**: ``RagModel`` forward (retrieve, doc_scores, RAG-Sequence NLL, the default kind) + backward + AdamW
  step on a batch of ``--batch`` questions, the question tower and the generator trained, under bf16
  autocast where the precision rule chooses bf16, as the training recipe does;
- **ask latency**: ``rag_core.model.answers.answer`` for one question (encode, search, generate up to
  ``--max-new-tokens`` tokens from ``--n-docs`` passages): what ``wikirag ask`` does once loaded.

The report ends with the whole run's wall time (loading included); the defaults keep it under 5 minutes
on one GPU.

Retrieval is an exact FAISS inner-product index over the passages encoded in the first step, held in
process, so no store or published index is needed. The generator is the default one under
``--home`` (``models/SmolLM2-135M-Instruct``, from ``wikirag models fetch``). ``--tiny`` uses a 2-layer
random BERT and Llama instead (the same code paths, seconds on a CPU).

Without CUDA it prints one line and exits 2; ``--allow-cpu`` runs the same code on the CPU (with
``--tiny``: a few seconds), so that CI and users can check it works before a GPU is at hand.

    python bench/gpu_check.py [--home ~/.wikirag] [--repeats 3] [--markdown F]
    python bench/gpu_check.py --allow-cpu --tiny
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo, bench_parser, parse_bench_args, publish, spread  # noqa: E402

DEFAULT_GENERATOR = "models/SmolLM2-135M-Instruct"
WORDS = ("river city history war king music science island church school language football film station "
         "population century government university album north south species village army").split()


def synthetic_passages(n: int, words: int = 100) -> tuple[list[str], list[str]]:
    """``n`` deterministic (title, text) pairs of ``words`` words each, from a fixed vocabulary."""
    titles = [f"{WORDS[i % len(WORDS)].title()} {i}" for i in range(n)]
    texts = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words)) for i in range(n)]
    return titles, texts


class InMemoryRetriever:
    """An exact FAISS inner-product index over vectors in memory, with the retriever interface RagModel uses."""

    def __init__(self, fingerprint: dict[str, Any], titles: list[str], texts: list[str], vectors) -> None:
        import faiss

        self.vectors = vectors
        self.titles, self.texts = titles, texts
        self.flat = faiss.IndexFlatIP(vectors.shape[1])
        self.flat.add(vectors)
        self.index = SimpleNamespace(manifest={"encoder": fingerprint}, version="gpu-check", ntotal=len(texts))

    @property
    def version(self) -> str:
        return self.index.version

    @property
    def fingerprint(self) -> dict[str, Any]:
        return self.index.manifest["encoder"]

    def retrieve(self, question_vectors, n_docs: int):
        import numpy as np

        from rag_core.model.retriever import assemble, check_n_docs

        n_docs = check_n_docs(self.version, self.index.ntotal, n_docs)
        scores, rows = self.flat.search(np.ascontiguousarray(question_vectors, dtype=np.float32), n_docs)
        return assemble(self.version, scores, np.zeros_like(rows), rows, self.vectors.shape[1],
                        lambda _s, r: (f"p{r}", self.titles[r], self.texts[r]), lambda _s, r: self.vectors[r])


def model_paths(args: argparse.Namespace, scratch: Path) -> tuple[str | None, Path]:
    """(encoder dir, None = packaged MiniLM; generator dir)."""
    if args.tiny:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.helpers.encoderfiles import save_tiny_bert
        from tests.helpers.generatorfiles import save_tiny_llama

        return (str(save_tiny_bert(scratch / "encoder")), save_tiny_llama(scratch / "generator", init=0.02))
    generator = Path(args.home).expanduser() / DEFAULT_GENERATOR
    if not (generator / "config.json").is_file():
        raise SystemExit(f"gpu_check: no generator at {generator}; run `wikirag models fetch` first, or use --tiny")
    return None, generator


def timed(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def measure(args: argparse.Namespace, device: str, scratch: Path) -> dict[str, Any]:
    import torch

    from rag_core.index.encoders import Encoder, EncoderConfig
    from rag_core.model.answers import answer
    from rag_core.model.generators import GeneratorConfig
    from rag_core.model.rag_model import RagConfig, RagModel
    from rag_core.perf.precision import choose_precision

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    encoder_path, generator_path = model_paths(args, scratch)
    encoder_config = EncoderConfig(path=encoder_path, device=device, batch_size=args.encode_batch)
    encoder = Encoder.load(encoder_config)
    titles, texts = synthetic_passages(args.passages, args.words)
    encoder.encode_passages(titles[:64], texts[:64])  # warm-up: kernels, allocator, autotuning
    rates = []
    for _ in range(args.repeats):
        rates.append(len(texts) / timed(lambda: encoder.encode_passages(titles, texts), sync))
    vectors = encoder.encode_passages(titles, texts)
    precision = choose_precision("auto", device)

    retriever = InMemoryRetriever(encoder.fingerprint, titles, texts, vectors)
    config = RagConfig(question_encoder=encoder_config, n_docs=args.n_docs, device=device, max_context_length=128,
                       generator=GeneratorConfig(path=str(generator_path), dtype="float32"))
    model = RagModel.create(config, retriever)
    questions = [f"what is the {WORDS[i % len(WORDS)]} of {titles[i]}?" for i in range(args.batch)]
    answers = [WORDS[(i + 5) % len(WORDS)] for i in range(args.batch)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    autocast = (torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if precision.dtype == "bfloat16"
                else torch.autocast(torch.device(device).type, enabled=False))

    def train_step() -> None:
        model.train()
        with autocast:
            loss = model(model.retrieve(questions), answers).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    train_step()  # warm-up
    steps = args.train_steps
    train_rates = [steps * args.batch / timed(lambda: [train_step() for _ in range(steps)], sync)
                   for _ in range(args.repeats)]

    model.eval()
    ask = lambda: answer(model, [questions[0]], n_docs=args.n_docs, max_new_tokens=args.max_new_tokens)  # noqa: E731
    with autocast:
        ask()  # warm-up
        latencies = [statistics.median(timed(ask, sync) for _ in range(args.asks)) for _ in range(args.repeats)]
    return {"passages_per_s": rates, "train_examples_per_s": train_rates, "ask_s": latencies,
            "precision": precision, "generator": generator_path.name if not args.tiny else "tiny random Llama",
            "encoder": "tiny random BERT" if args.tiny else "all-MiniLM-L6-v2 (packaged)"}


def report(info: RunInfo, device_line: str, device: str, args: argparse.Namespace, got: dict[str, Any]) -> str:
    precision = got["precision"]
    lines = [f"## GPU check on {device_line}", "", *info.markdown_header(),
             f"Device {device}: {device_line}; precision {precision.dtype} ({precision.reason}). "
             f"Encoder {got['encoder']}, generator {got['generator']}, n_docs {args.n_docs}.", "",
             "| figure | min / median / max | what is timed |", "|---|---|---|",
             f"| passages/s | {spread(got['passages_per_s'])} | encode_passages, {args.passages} passages of {args.words} "
             f"words, batch {args.encode_batch} |",
             f"| training examples/s | {spread(got['train_examples_per_s'])} | RagModel forward + backward + AdamW, "
             f"batch {args.batch}, {args.train_steps} steps per repeat |",
             f"| ask latency (s) | {spread(got['ask_s'])} | answer() for one question, up to "
             f"{args.max_new_tokens} new tokens (median of {args.asks} per repeat) |", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, what="repeats of each figure")
    parser.add_argument("--home", default="~/.wikirag", help="wikirag home holding the default generator")
    parser.add_argument("--tiny", action="store_true", help="tiny random encoder and generator (seconds on a CPU)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU where there is no CUDA")
    parser.add_argument("--passages", type=int, help="passages encoded per repeat (default 20000; 64 with --tiny)")
    parser.add_argument("--encode-batch", type=int, default=256, help="encoder batch size (default 256)")
    parser.add_argument("--batch", type=int, help="training questions per step (default 8; 2 with --tiny)")
    parser.add_argument("--train-steps", type=int, help="training steps per repeat (default 10; 2 with --tiny)")
    parser.add_argument("--n-docs", type=int, help="passages per question (default 5; 2 with --tiny)")
    parser.add_argument("--words", type=int, help="words per passage (default 100; 20 with --tiny)")
    parser.add_argument("--asks", type=int, help="asks per repeat, their median counts (default 3; 1 with --tiny)")
    parser.add_argument("--max-new-tokens", type=int, help="answer tokens (default 32; 4 with --tiny)")
    args = parse_bench_args(parser, argv)
    for name, full, tiny in (("passages", 20000, 64), ("batch", 8, 2), ("train_steps", 10, 2), ("n_docs", 5, 2),
                             ("words", 100, 20), ("asks", 3, 1), ("max_new_tokens", 32, 4)):
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)

    from rag_core.perf.device import choose_device, cuda_available, describe_device

    if not cuda_available() and not args.allow_cpu:
        print("gpu_check: no CUDA device here (torch sees none); run it on a machine with a GPU and a CUDA build "
              "of torch, or pass --allow-cpu to check it works on the CPU")
        return 2
    device = choose_device("auto")
    info = RunInfo.start(None if argv is None else [sys.argv[0], *argv])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wikirag-gpu-check-") as scratch:
        got = measure(args, device, Path(scratch))
    info.finish()
    info.notes.append(f"Whole run {time.perf_counter() - started:.0f} s, models loaded and warm-ups included.")
    line = describe_device(device) if device.startswith("cuda") else f"CPU ({info.hardware.cpu_model})"
    publish(report(info, line, device, args, got), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
