"""The main job's fine-tune settings, chosen by dev score: n_docs, batch size, steps and trained blocks.

Each candidate is a recipe run (rag_core.train.recipe.run, in this process, ``--threads`` torch
threads) on QA pairs generated from the index's own passages (rag_core.train.generated_qa, the
main job's data stage: rules, round trip, held out against the real dev and test questions), over
the published index of ``--home`` (LATEST) with the fetched SmolLM2-135M-Instruct. For each:

- **train loss**: the mean over the first and the last 5 steps (the recipe's per-step losses);
- **dev loss**: the recipe's mean NLL per example over ``--dev-examples`` generated dev pairs,
  before (step 0) and after training;
- **dev score**: the fine-tuned model on the real questions' **dev** split
  (rag_core.evaluate.real_questions: written + NQ-open/WebQuestions/CuratedTrec answerable from the
  sample; the test split is never read here), first ``--real-dev`` questions, fast decoding,
  ``--answer-tokens`` answer tokens (default: the main job's), bf16 autocast where native: EM and
  answer-in-output; the zero-shot start (no fine-tune) is the first row;
- **train pairs**: the training examples the candidate read. ``main`` is the main job's data and
  recipe: no pairs answered by their page's own subject (``GeneratedQAConfig.subject_share`` 0),
  each pair's target the generator's own reply to it cut after the answer, with the pair's answer
  in place of its own (``target="reader-lead"``), and the saved weights halfway between the start's and the
  trained ones (``weight_mix`` 0.5, WiSE-FT; the dev loss column is the weights as trained). Others differ from
  it: ``as-trained`` / ``weight-mix-0.7`` keep all or 0.7 of the trained weights; ``spans*`` train on the
  bare answer spans (``spans-every-subject-lr-2e-4``, as trained, is the main job's first recipe);
  ``every-subject`` / ``subject-0.1`` keep more subject-answered pairs; ``reader-check`` turns the
  round trip's reader half on (PAQ's consistency filter); ``self-targets`` / ``self-replies`` keep
  only the pairs the zero-shot reader answers from their best passage and train on its own words
  (its short answer, or its whole first line); ``self-form`` keeps every pair and trains on the
  reader's whole reply with the pair's answer in place of its own; ``asking-subject`` keeps only
  the pairs whose question names its page's subject;
- **train seconds**: the recipe's wall time, the cost the main job pays (it runs two processes
  of half the batch: about the same time on 2 cores).

    python bench/train_choice_bench.py --home H [--only NAME,...] [--markdown FILE] [--avx2]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo, emulate_avx2_if_asked, publish

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
QA_DIR = ROOT.parent / "shared" / "data" / "qa"
# name -> TrainConfig fields that differ from "main", the main job's ShortRun (rag_core/train/jobs.py)
# and GeneratedQAConfig fields of its data (rag_core/train/generated_qa.py, flows/pipeline.py)
MAIN = {"n_docs": 2, "batch_size": 4, "max_steps": 24, "train_generator_layers": 15, "lr": 5e-5,
        "train_question_encoder": True, "activation_checkpointing": False, "when_share": 0.2, "subject_share": 0.0,
        "target": "reader-lead", "weight_mix": 0.5}
SPANS = {"target": "answer"}  # the pair's answer span as its target
CANDIDATES = {
    "main": {},
    "as-trained": {"weight_mix": 1.0},
    "weight-mix-0.7": {"weight_mix": 0.7},
    "weight-mix-0.3": {"weight_mix": 0.3},
    "lr-2e-5": {"lr": 2e-5},
    "lr-1e-5": {"lr": 1e-5},
    "lr-1e-4": {"lr": 1e-4},
    "every-subject": {"subject_share": 1.0},
    "subject-0.1": {"subject_share": 0.1},
    "when-uncapped": {"when_share": 1.0},
    "per-passage-6": {"per_passage": 6},
    "frozen-question-encoder": {"train_question_encoder": False},
    "steps-48-batch-2": {"batch_size": 2, "max_steps": 48},
    "steps-96-batch-2": {"batch_size": 2, "max_steps": 96},
    "steps-48-batch-2-as-trained": {"batch_size": 2, "max_steps": 48, "weight_mix": 1.0},
    "lr-2e-4": {"lr": 2e-4},
    "n_docs-1-steps-48": {"n_docs": 1, "max_steps": 48},
    "blocks-8-steps-32": {"train_generator_layers": 8, "max_steps": 32},
    "blocks-all": {"train_generator_layers": None},
    # bare answer spans as targets
    "spans": SPANS,
    "spans-every-subject-lr-2e-4": {**SPANS, "subject_share": 1.0, "lr": 2e-4, "weight_mix": 1.0},
    "spans-every-subject-lr-1e-6": {**SPANS, "subject_share": 1.0, "lr": 1e-6},
    # PAQ's round trip with the reader half on: the generator must also answer the pair from its best passage
    "reader-check": {"reader": "generator"},
    # targets in the reader's own words: each pair the zero-shot reader answers from its best passage, as it said it
    "self-targets": {**SPANS, "self_targets": "answer"},
    "self-replies": {**SPANS, "self_targets": "reply"},
    # every pair, its target the zero-shot reader's whole reply with the pair's answer in place of its own
    "self-form": {**SPANS, "self_targets": "form"},
    # only the pairs shaped like real questions about a page: the question names the page's subject, the answer not
    "asking-subject": {**SPANS, "asking_subject": True},
}


def self_targets(store, version: str, urls: tuple[str, str], generator: str, mode: str) -> tuple[str, str]:
    """Targets in the zero-shot reader's own words, written beside ``urls``; it reads each pair's question with its
    best passage. ``mode``: "answer" / "reply" keep the pairs it answers (its short answer holds the pair's) with
    its short answer / its reply's first line as the target; "form" keeps every pair, with the target its reply in
    which its short answer is swapped for the pair's ("The capital of Algeria is Algiers."; the bare answer
    where the reply does not hold its short answer). The stage's own ``target="reader-lead"`` is "form" cut after
    the answer (rag_core.train.generated_qa_reader.lead_target)."""
    import json

    from rag_core.train.generated_qa_reader import generator_replies, reader_agrees
    from rag_core.train.generated_qa_store import index_search

    def form(reply: str, short: str, answer: str) -> str:
        at = reply.find(short) if short else -1
        if at < 0:
            return answer
        return reply[:at] + answer + reply[at + len(short):]

    search, replies = index_search(store, version), generator_replies(generator)
    out = []
    for url in urls:
        rows = [json.loads(line) for line in Path(url).read_text().splitlines()]
        best = [hits[0] for hits in search([r["input"] for r in rows], 1)]
        said = replies([(r["input"], title, text) for r, (_, title, text) in zip(rows, best, strict=True)])
        if mode == "form":
            kept = [{**r, "targets": [form(reply, short, r["targets"][0])]}
                    for r, (reply, short) in zip(rows, said, strict=True)]
        else:
            kept = [{**r, "targets": [reply if mode == "reply" else short]}
                    for r, (reply, short) in zip(rows, said, strict=True) if reader_agrees(r["targets"][0], short)]
        path = Path(url).with_name(f"{mode}-{Path(url).name}")
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        print(f"# self targets ({mode}): {len(kept)} of {len(rows)} pairs of {Path(url).name}", file=sys.stderr)
        for r in kept[:12]:
            print(f"#T {mode} | {r['input']} | {r['targets'][0]!r}", file=sys.stderr)
        out.append(str(path))
    return out[0], out[1]


def asking_subject(urls: tuple[str, str]) -> tuple[str, str]:
    """The pairs of ``urls`` shaped like real questions about a page: the question names its page's subject and
    the answer does not ("What is the official language of Angola?" from Angola's page), written beside them."""
    import json

    from rag_core.train.generated_qa import names_subject

    out = []
    for url in urls:
        rows = [json.loads(line) for line in Path(url).read_text().splitlines()]
        kept = [r for r in rows if (title := r["provenance"][0]["title"]) and names_subject(r["input"], title)
                and not names_subject(r["targets"][0], title)]
        path = Path(url).with_name("asking-subject-" + Path(url).name)
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        print(f"# asking the subject: {len(kept)} of {len(rows)} pairs of {Path(url).name}", file=sys.stderr)
        out.append(str(path))
    return out[0], out[1]


def generated_pairs(store, version: str, held, folder: Path, config) -> tuple[str, str, dict]:
    """Train and dev files of generated QA made with ``config`` (a GeneratedQAConfig), and its counts."""
    from rag_core.train.generated_qa import lead_targets, merge_shards, pair_examples, shard_pairs, shard_rows
    from rag_core.train.generated_qa_reader import generator_replies
    from rag_core.train.generated_qa_store import index_search
    from rag_core.index.versions import read_index_manifest
    from rag_core.train.examples import write_examples
    from rag_core.perf.precision import choose_precision
    from rag_core.wiki.ingest import read_passages

    passages = read_passages(store, read_index_manifest(store, version).dump_id)
    search = index_search(store, version)
    # the stage's reader dtype rule (tasks/generated_qa.py's plan)
    dtype = choose_precision("auto", "cpu").dtype
    replies = generator_replies(config.generator, dtype=dtype) if config.reads() else None
    parts = []
    for shard in range(config.shards):
        start, stop = shard_rows(passages.num_rows, shard, config.shards)
        parts.append(shard_pairs(passages.slice(start, stop - start), shard, search, held, config, replies))
    table, counts = merge_shards(parts, config)
    if config.target == "reader-lead":
        table = lead_targets(table, search, replies)
    folder.mkdir(parents=True, exist_ok=True)
    urls = [write_examples(pair_examples(table, split), str(folder / f"{split}.jsonl")) for split in ("train", "dev")]
    return urls[0], urls[1], dict(counts)


def real_dev(store, version: str, limit: int, qa_dir: Path):
    """The real questions' dev split (as examples) and the held-out filter of dev + test."""
    from rag_core.evaluate.real_questions import as_examples, real_questions
    from rag_core.index.versions import read_index_manifest
    from rag_core.train.generated_qa import HeldOut
    from rag_core.wiki.ingest import read_passages

    passages = read_passages(store, read_index_manifest(store, version).dump_id, columns=["title", "text"])
    texts: dict[str, list[str]] = {}
    for title, text in zip(passages.column("title").to_pylist(), passages.column("text").to_pylist(), strict=True):
        texts.setdefault(title, []).append(text or "")
    items, _ = real_questions({t: " ".join(p) for t, p in texts.items()}, qa_dir if qa_dir.is_dir() else None)
    return as_examples([i for i in items if i["split"] == "dev"][:limit]), HeldOut.of(as_examples(items))


def dev_score(model, examples, label: str, answer_tokens: int) -> tuple[float, float]:
    """EM and answer-in-output of ``model`` on ``examples`` (fast decoding, bf16 autocast where native); each
    prediction goes to stderr under ``label``."""
    import torch

    from rag_core.evaluate.predictions import evaluate_model
    from rag_core.evaluate.real_questions import answer_in_output
    from rag_core.perf.precision import choose_precision

    native = choose_precision("auto", "cpu").dtype == "bfloat16"
    with torch.autocast("cpu", dtype=torch.bfloat16) if native else torch.no_grad():
        evaluation = evaluate_model(model, examples, mode="fast", max_new_tokens=answer_tokens)
    found = [answer_in_output(r["prediction"], r["targets"]) for r in evaluation.predictions]
    for example, r in zip(examples, evaluation.predictions, strict=True):
        print(f"#P {label} | {example.input} | {r['prediction']!r} | {list(r['targets'])}", file=sys.stderr)
    return evaluation.scores["em"], sum(found) / max(1, len(found))


def main() -> int:
    emulate_avx2_if_asked()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="workspace: store/ with a LATEST index, models/")
    parser.add_argument("--only", help="comma-separated candidate names (default: all)")
    parser.add_argument("--dev-examples", type=int, default=16, help="generated dev pairs in the dev loss")
    parser.add_argument("--real-dev", type=int, default=30, help="real dev questions scored per candidate (0: none, "
                        "dev loss only)")
    parser.add_argument("--skip-zero-shot", action="store_true", help="do not score the zero-shot start")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--answer-tokens", type=int, help="answer tokens generated per dev question "
                        "(default: the main job's, ShortRun.max_new_tokens)")
    parser.add_argument("--qa-dir", type=Path, default=QA_DIR, help="public QA data (nq_open/, webquestions/, ...)")
    parser.add_argument("--markdown", type=Path, help="write the section to this file")
    parser.add_argument("--partial", type=Path, help="rewrite this file with the rows so far after each candidate")
    parser.add_argument("--avx2", action="store_true", help="emulate an AVX2-only CPU (bench/report.py)")
    args = parser.parse_args()
    import torch

    from rag_core.train.jobs import ShortRun

    if args.answer_tokens is None:
        args.answer_tokens = ShortRun().max_new_tokens

    from rag_core.index.versions import latest_version
    from rag_core.model.retriever import IndexRetriever
    from rag_core.storage import Store
    from rag_core.train.checkpoints import load_model
    from rag_core.train.generated_qa import GeneratedQAConfig
    from rag_core.train.recipe import initial_model, run
    from rag_core.train.train_config import TrainConfig, trajectory_key, warmup_steps
    from rag_core.train.tracking import MemoryLogger

    torch.set_num_threads(args.threads)
    info = RunInfo.start()
    store = Store(str(args.home / "store"))
    version = latest_version(store)
    generator = str(args.home / "models" / "SmolLM2-135M-Instruct")
    names = args.only.split(",") if args.only else list(CANDIDATES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="wikirag-choice-") as tmp:
        examples, held = real_dev(store, version, args.real_dev, args.qa_dir)
        datasets: dict[str, tuple[str, str, dict]] = {}

        def data(fields: dict) -> tuple[str, str, dict]:
            """The generated QA of the GeneratedQAConfig fields among ``fields`` (made once per config)."""
            reads = fields.get("reader") == "generator" or fields.get("target") == "reader-lead"
            fields = {**fields, "generator": generator} if reads else fields
            config = GeneratedQAConfig(**{k: v for k, v in fields.items() if k in GeneratedQAConfig.model_fields})
            key = config.model_dump_json()
            if key not in datasets:
                datasets[key] = generated_pairs(store, version, held, Path(tmp) / f"data-{len(datasets)}", config)
            return datasets[key]

        train, dev, counts = data(MAIN)
        retriever = IndexRetriever.load(store, version)
        # the untrained start as the recipe builds it (the index's own question encoder), at the main job's n_docs
        start = initial_model(TrainConfig(task="generated-qa", train=train, generator=generator, n_docs=2,
                                          max_context_length=160), retriever)
        start.eval()
        scored = examples and not args.skip_zero_shot
        em, found = dev_score(start, examples, "zero-shot", args.answer_tokens) if scored else (math.nan, math.nan)
        rows.append(("zero-shot (no fine-tune)", "", "2", "", "", "", "", "", "", f"{em:.3f}", f"{found:.3f}", ""))
        print("#", rows[-1], file=sys.stderr)
        for name in names:
            fields = {**MAIN, **CANDIDATES[name]}
            train, dev, _ = data(fields)  # the table's Data line gives MAIN's counts
            if fields.pop("asking_subject", False):
                train, dev = asking_subject((train, dev))
            if mode := fields.pop("self_targets", False):
                train, dev = self_targets(store, version, (train, dev), generator, mode)
            fields = {k: v for k, v in fields.items() if k not in GeneratedQAConfig.model_fields}
            config = TrainConfig(task="generated-qa", train=train, dev=dev, generator=generator, index_version=version,
                                 max_context_length=160, checkpoint_every=0, max_dev_examples=args.dev_examples,
                                 threads=args.threads, **fields)
            # a folder per recipe and data: a rerun of a changed candidate must not resume another's checkpoint
            config = config.model_copy(update={"output": f"runs/choice-{name}-{trajectory_key(config)}"})
            n_docs, batch, steps, blocks, lr = (fields[k] for k in ("n_docs", "batch_size", "max_steps",
                                                                     "train_generator_layers", "lr"))
            logger = MemoryLogger()
            began = time.perf_counter()
            result = run(config, store, logger=logger, retriever=retriever)
            seconds = time.perf_counter() - began
            model = load_model(Store(result.model_url, store.options), retriever, Path(tmp) / name)
            em, found = dev_score(model, examples, name, args.answer_tokens) if examples else (math.nan, math.nan)
            head, tail = result.losses[:5], result.losses[-5:]
            dev_before, dev_after = result.dev_losses[0][1], result.dev_losses[-1][1]
            pairs = len(Path(train).read_text().splitlines())
            rows.append((name, str(pairs), str(n_docs), str(batch), str(steps),
                         "all" if blocks is None else str(blocks),
                         f"{lr:g}, warm-up {warmup_steps(config)}", f"{sum(head) / len(head):.2f} → "
                         f"{sum(tail) / len(tail):.2f}", f"{dev_before:.2f} → {dev_after:.2f}", f"{em:.3f}",
                         f"{found:.3f}", f"{seconds:.0f}"))
            print("#", rows[-1], file=sys.stderr)
            if args.partial:  # rows so far, for a run that may not finish on a loaded machine
                args.partial.write_text(markdown(info, args, counts, examples, rows))
            del model
    info.finish()
    publish(markdown(info, args, counts, examples, rows), args.markdown)
    return 0


def markdown(info, args, counts: dict, examples: list, rows: list[tuple[str, ...]]) -> str:
    lines = ["## The main job's fine-tune settings, by dev score", "", *info.markdown_header(),
             (f"Data: QA generated from the sample's index ({counts.get('kept', 0)} pairs kept of "
              f"{counts.get('candidates', 0)} candidates; train/dev split by page), RAG-Sequence, 160 context tokens, "
              f"SmolLM2-135M-Instruct, linear decay after warm-up, 1 process, {args.threads} torch threads. Dev "
              f"loss: {args.dev_examples} generated dev pairs. Dev score: the first {len(examples)} real dev "
              f"questions (test split untouched), fast decoding, {args.answer_tokens} answer tokens."), "",
             "| settings | train pairs | n_docs | batch | steps | blocks trained | lr | train loss (first 5 → last 5 "
             "steps) | dev loss (start → end) | dev EM | dev answer-in-output | train s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|",
             *("| " + " | ".join(r) + " |" for r in rows)]
    start, tuned = rows[0], rows[1:]
    if tuned and start[-3] != "nan":
        best = max(tuned, key=lambda r: (float(r[-3]), float(r[-2])))
        em, found = (100 * (float(best[i]) - float(start[i])) for i in (-3, -2))
        lines += ["", f"Best fine-tune against its zero-shot start: {best[0]}, EM {em:+.1f} points, "
                      f"answer-in-output {found:+.1f} points (the goal is +10 each, on test)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
