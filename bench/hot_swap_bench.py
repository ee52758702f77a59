"""The paper's knowledge hot-swap (its Section 4.5), shown: the same registered model answers the old facts on the
old index version and the new facts after a refresh onto the new one, with no training step; and what the refresh
costs against a retrain.

Two passage sets from two dumps of real Wikipedia articles (the sample in ../shared/data) that differ in a
handful of facts: in the later one, each of ``--facts`` articles about a place was edited (a new revision) so that
its capital is another city, everywhere the article names it; the first passage of each states the capital in one
sentence in both sets. Version 1 indexes the older set (all-MiniLM-L6-v2, Flat); version 2 the newer one, reusing
every unchanged passage's vector. The model (MiniLM question encoder + the default generator, SmolLM2-135M-Instruct,
untrained: zero-shot) is registered in a SQLite MLflow registry bound to version 1, with a dev set of the fact
questions and cloze questions of the older set.

Per repetition (``--repeats``, at least 3): ``wikirag models rollback`` (from the second on) -> the ``refresh`` flow
onto version 2 (a real Prefect server; timed) -> a retrain: the cloze recipe (rag_core.train.recipe.run) on version 2
for 2 steps of 2 examples (timed; its examples/s projected to the finetune deployment's recipe, 100 steps of 8).
The champion answers the fact questions before the first refresh, after it, and after a last rollback (greedy
decoding: the same answers every time). Alongside: the incremental build of version 2 on a copy of the store
holding version 1 (timed).

    python bench/hot_swap_bench.py --markdown bench/results/hot-swap.md
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import RunInfo, bench_parser, parse_bench_args, publish, spread  # noqa: E402

SAMPLE = ROOT.parent / "shared" / "data" / "wikipedia" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
# article -> (its capital, the capital the later dump names)
FACTS = {"Alabama": ("Montgomery", "Birmingham"), "Alaska": ("Juneau", "Anchorage"), "Algeria": ("Algiers", "Oran"),
         "Angola": ("Luanda", "Benguela"), "Albania": ("Tirana", "Durres"), "Andorra": ("Andorra la Vella", "Encamp"),
         "Afghanistan": ("Kabul", "Kandahar"), "Azerbaijan": ("Baku", "Ganja")}
OTHER_PAGES = 6  # articles besides the edited ones, so that retrieval has to choose
RETRAIN_STEPS, RETRAIN_BATCH = 2, 2  # what is timed of a retrain: its examples/s comes from the steps after the first
PROJECTED_EXAMPLES = 100 * 8  # the finetune deployment's recipe (prefect.yaml: max_steps 100, batch_size 8)


def passage_sets(facts: int):
    """(older, newer) passage tables and the fact questions (title, old, new)."""
    import pyarrow as pa

    from rag_core.wiki.dumps import DumpSource, iter_pages
    from rag_core.wiki.passages import passages_from_pages

    passages = passages_from_pages(iter_pages(DumpSource(str(SAMPLE))))[0]
    chosen = dict(list(FACTS.items())[:facts])
    titles = list(dict.fromkeys(passages.column("title").to_pylist()))
    keep = set(chosen) | set([t for t in titles if t not in FACTS][:OTHER_PAGES])
    rows = [r for r in passages.to_pylist() if r["title"] in keep]
    older, newer = [], []
    for row in rows:
        old, new = dict(row), dict(row)
        if row["title"] in chosen:
            before, after = chosen[row["title"]]
            if row["chunk"] == 0:
                old["text"] = f"The capital of {row['title']} is {before}. {row['text']}"
                new["text"] = old["text"]
            new["text"] = new["text"].replace(before, after)
            new["revision_id"] = row["revision_id"] + 1
            new["passage_id"] = f"{row['page_id']}-{row['revision_id'] + 1}-{row['chunk']}"
        older.append(old)
        newer.append(new)
    schema = passages.schema
    return (pa.Table.from_pylist(older, schema=schema), pa.Table.from_pylist(newer, schema=schema),
            [(t, *v) for t, v in chosen.items()])


def publish_passages(store, dump_id: str, passages) -> None:
    """Publish a passage set as the ingest stage does: one part, manifest last."""
    import hashlib

    from rag_core.wiki.ingest import publish, stage_part
    from rag_core.wiki.passages import REDIRECT_SCHEMA, PageCounts

    counts = PageCounts(passages=passages.num_rows)
    record = stage_part(store, dump_id, "bench", 0, passages, REDIRECT_SCHEMA.empty_table(), counts)
    digest = hashlib.sha256(",".join(passages.column("passage_id").to_pylist()).encode()).hexdigest()
    publish(store, dump_id, "bench", {"parts": [record], "counts": counts.as_dict(),
                                      "dump": {"url": f"bench://{dump_id}", "sha256": digest, "bytes": 0}})


def answered(tracking_uri: str, facts: list[tuple[str, str, str]]) -> tuple[int, int, str]:
    """(old values answered, new values answered, the index version read) by the champion on the fact questions."""
    from rag_core.evaluate.normalize import normalize_answer
    from rag_core.model.answers import answer
    from tasks.evaluation import load_registered_model

    model = load_registered_model("models:/wikirag-cloze@champion", tracking_uri)
    replies = answer(model, [f"What is the capital of {title}?" for title, _, _ in facts])
    print(f"# on {model.index_version}: {[r['answer'] for r in replies]}", file=sys.stderr)
    said = [normalize_answer(r["answer"]) for r in replies]
    return (sum(normalize_answer(old) in s for s, (_, old, _) in zip(said, facts)),
            sum(normalize_answer(new) in s for s, (_, _, new) in zip(said, facts)), str(model.index_version))


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, what="refreshes, incremental builds and retrains")
    parser.add_argument("--facts", type=int, default=3, help="edited articles (default 3, at most 8)")
    parser.add_argument("--cloze", type=int, default=2, help="cloze questions in the dev set besides the facts' "
                        "(default 2)")
    args = parse_bench_args(parser, argv)
    info = RunInfo.start(argv and [sys.argv[0], *argv])

    import torch

    from rag_core.index.build import build_version
    from rag_core.index.embedding_files import EmbedConfig
    from rag_core.index.encoders import Encoder, EncoderConfig, packaged_model_path
    from rag_core.index.faiss_index import IndexConfig
    from rag_core.model.generators import GeneratorConfig
    from rag_core.model.rag_model import RagConfig, RagModel
    from rag_core.model.retriever import IndexRetriever
    from rag_core.storage import Store
    from rag_core.train.cloze import ClozeConfig, cloze_examples
    from rag_core.train.examples import Example, Provenance, write_examples
    from rag_core.train.recipe import run
    from rag_core.train.train_config import TrainConfig
    from runtime.default_generator import resolve_generator
    from runtime.prefect_server import prefect_api
    from runtime.settings import Settings, StoreAccess
    from tasks.adapters.mlflow_registry import log_rag_model, register, rollback
    from tasks.adapters.mlflow_tracking import tracked_run

    generator = resolve_generator(Settings().home, None)  # `wikirag models fetch` first
    older, newer, facts = passage_sets(args.facts)
    work = Path(tempfile.mkdtemp(prefix="wikirag-hot-swap-"))
    try:
        store = Store(str(work / "store"))
        encoder_config = EncoderConfig(path=str(packaged_model_path()), dtype="float32")
        encoder = Encoder.load(encoder_config)
        embed = EmbedConfig(encoder=encoder_config, shards=1)
        publish_passages(store, "d1", older)
        old = build_version(store, "d1", embed, IndexConfig(factory="Flat"), encoder=encoder)
        shutil.copytree(work / "store", work / "base")
        publish_passages(store, "d2", newer)
        build_s = []
        for r in range(args.repeats):  # the refresh's rebuild: version 2 on a copy of the store holding version 1
            copy = work / f"build-{r}"
            shutil.copytree(work / "base", copy)
            publish_passages(Store(str(copy)), "d2", newer)
            started = time.perf_counter()
            build_version(Store(str(copy)), "d2", embed, IndexConfig(factory="Flat"), encoder=encoder)
            build_s.append(time.perf_counter() - started)
            print(f"# build of version 2, reusing version 1's vectors: {build_s[-1]:.1f} s", file=sys.stderr)
            shutil.rmtree(copy)
        new = build_version(store, "d2", embed, IndexConfig(factory="Flat"), encoder=encoder)

        first = {r["page_id"]: r["passage_id"] for r in older.to_pylist() if r["chunk"] == 0}
        page_of = {r["title"]: r["page_id"] for r in older.to_pylist()}
        fact_questions = [Example(id=f"fact-{i}", input=f"What is the capital of {title}?", targets=(before,),
                                  kind="cloze", provenance=(Provenance(title=title,
                                                                       passage_id=first[page_of[title]]),))
                          for i, (title, before, _) in enumerate(facts)]
        dev = [*fact_questions, *cloze_examples(older, ClozeConfig(seed=0)).dev[:args.cloze]]
        dev_url = write_examples(dev, str(work / "dev.jsonl"))
        train_url = write_examples(cloze_examples(newer, ClozeConfig(seed=0)).train[:64], str(work / "train.jsonl"))
        config = RagConfig(n_docs=3, question_encoder=encoder_config, generator=GeneratorConfig(path=str(generator)))
        model_dir = RagModel.create(config, IndexRetriever.load(store, old)).save_pretrained(work / "rag")
        tracking = f"sqlite:///{work / 'mlflow.db'}"
        with tracked_run(tracking, "wikirag-cloze", "registered", {"wikirag.task": "cloze",
                                                                   "wikirag.dev": dev_url}) as logged:
            logged.log_params({"max_dev_examples": len(dev)})
            uri = log_rag_model(tracking, logged.run_id, model_dir, store_url=store.url, index_version=old)
            register(tracking, uri, "cloze", run_id=logged.run_id, metric="em", value=0.0, margin=0.0, store=store,
                     index_version=old)

        refresh_s, retrain_s, rates, answers = [], [], [], {}
        with prefect_api(work / "prefect"):
            from flows.refresh import refresh  # Prefect reads the server's URL from the environment set here

            for r in range(args.repeats):  # greedy decoding: the answers are the same each time, asked once
                if r:
                    rollback(tracking, "wikirag-cloze", lambda url: store)
                else:
                    answers["before the refresh"] = answered(tracking, facts)
                started = time.perf_counter()
                [decision] = refresh(tracking, StoreAccess(url=store.url))
                refresh_s.append(time.perf_counter() - started)
                print(f"# refresh {r + 1}: {refresh_s[-1]:.1f} s; {decision.reason}", file=sys.stderr)
                if not r:
                    answers["after the refresh"] = answered(tracking, facts)
                    outcome = ("re-bound" if decision.rebound else "kept") + ": " + decision.reason

                started = time.perf_counter()
                trained = run(TrainConfig(task="cloze", train=train_url, generator=str(generator), index_version=new,
                                          n_docs=3, max_steps=RETRAIN_STEPS, batch_size=RETRAIN_BATCH,
                                          checkpoint_every=0, eval_every=0, precision="float32",
                                          output=f"runs/retrain-{r}"), store)
                retrain_s.append(time.perf_counter() - started)
                rates.append(trained.examples_per_s or 0.0)
                print(f"# retrain {r + 1}: {retrain_s[-1]:.1f} s, {rates[-1]:.3f} examples/s", file=sys.stderr)
            rollback(tracking, "wikirag-cloze", lambda url: store)
            answers["after models rollback"] = answered(tracking, facts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info.finish()

    n = len(facts)
    projected = [PROJECTED_EXAMPLES / rate for rate in rates]
    total = [b + f for b, f in zip(build_s, refresh_s)]
    lines = ["## Knowledge hot-swap: the same registered model, two index versions, no training step", "",
             *info.markdown_header(),
             f"{n} articles edited between the dumps ({', '.join(t for t, _, _ in facts)}: each names another "
             f"capital); {older.num_rows} passages of {OTHER_PAGES + n} real articles; all-MiniLM-L6-v2, Flat; "
             "the model: MiniLM question encoder + SmolLM2-135M-Instruct, zero-shot, 3 passages; its dev set: the "
             f"{n} fact questions and {args.cloze} cloze questions.", "",
             f"Refresh: {outcome.replace('|', '/')}.", "",
             "| champion | reads | old capital answered | new capital answered |", "|---|---|---:|---:|"]
    for state, (old_n, new_n, version) in answers.items():
        lines.append(f"| {state} | `{version}` | {old_n}/{n} | {new_n}/{n} |")
    lines += ["", "| cost (seconds, min / median / max) | |", "|---|---:|",
              f"| build version 2, reusing version 1's vectors | {spread(build_s)} |",
              f"| refresh (the dev set on both versions, re-bound, registered) | {spread(refresh_s)} |",
              f"| refresh in all (build + refresh) | {spread(total)} |",
              f"| retrain: {RETRAIN_STEPS} recipe steps of {RETRAIN_BATCH} examples, set-up included | "
              f"{spread(retrain_s)} |",
              f"| retrain projected to the finetune deployment's recipe ({PROJECTED_EXAMPLES} examples: 100 steps of "
              f"8) at the measured examples/s (steps after the first) | {spread(projected, '{:,.0f}')} |", "",
              f"Median refresh in all / projected retrain: {statistics.median(total) / statistics.median(projected):.2g} "
              f"(the retrain costs {statistics.median(projected) / statistics.median(total):,.0f}x the refresh)"
              " (and a retrain alone changes no knowledge: the model still reads the index it was given)."]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
