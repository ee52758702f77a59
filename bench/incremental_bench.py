"""Incremental index rebuild against a full one, side by side in one run.

The question: when a new dump changes a tenth of the articles, does the
``index_rebuild`` flow re-encode only about a tenth of the passages, and how
much of a full rebuild's time does it take?

Inputs come from ``bench/make_dump.py`` (real wikitext of the sample's pages
cycled with new ids and titles): dump A, and dump B, the same pages with
``--edit-fraction`` of the articles given a new revision whose text gains a
first sentence (every 100-word window of an edited article shifts, so all its
passages change; redirects are untouched). Both are cached in bench/.cache/.

One Prefect server and one 2-worker Dask cluster serve every run, so the
timings hold the flows' own work, not engine start-up:

1. store I: rebuild from A (not timed: this is "last month's" index), once;
2. per repetition (``--repeats``, at least 3), in turn (every other repetition
   in reverse order): a copy of store I rebuilt from B, timed (incremental:
   reuses A's vectors), and an empty store rebuilt from B, timed (full).

Both timed runs ingest B from scratch, embed, gate, index and publish. Times
are min / median / max over the repetitions; the incremental / full ratio is
taken within each repetition.

    python bench/incremental_bench.py --quick                                   # 300 pages, ~8-12 min
    python bench/incremental_bench.py --markdown bench/results/incremental.md   # 1,000 pages
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from make_dump import SAMPLE, dump_paths, make_dump  # noqa: E402
from report import MIN_REPEATS, RunInfo, spread  # noqa: E402

CACHE = ROOT / "bench" / ".cache"


def dumps(pages: int, edit_fraction: float) -> tuple[tuple[Path, Path], tuple[Path, Path]]:
    """(dump A, its index), (dump B, its index), generated once into the cache."""
    names = (f"enwiki-inc{pages}-a", f"enwiki-inc{pages}-b{int(edit_fraction * 100)}")
    out = []
    for name, fraction in zip(names, (0.0, edit_fraction)):
        dump, index = dump_paths(CACHE, name)
        if not (dump.exists() and index and index.exists()):
            dump, index = make_dump(pages, CACHE, name=name, edit_fraction=fraction)
        out.append((dump, index))
    return out[0], out[1]


def rebuild(address: str, dump: tuple[Path, Path], store: str) -> tuple[str, float]:
    from flows.index_rebuild import index_rebuild
    from runtime.dask_runner import dask_runner
    from rag_core.wiki.ingest import IngestConfig

    started = time.perf_counter()
    version = index_rebuild.with_options(task_runner=dask_runner(address, 0))(
        ingest_config=IngestConfig(dump=str(dump[0]), index=str(dump[1])), store=store)
    return version, time.perf_counter() - started


def embedding_counts(store_url: str, version: str) -> dict[str, int]:
    from rag_core.index.embedding_files import range_record
    from rag_core.index.versions import read_index_manifest
    from rag_core.storage import Store

    store = Store(store_url)
    m = read_index_manifest(store, version)
    records = [range_record(store, m.fingerprint_id, m.dump_id, e.embeddings.start, e.embeddings.stop)
               for e in m.shards]
    return {"passages": m.count, "encoded": sum(r["encoded"] for r in records),
            "reused": sum(r["reused"] for r in records), "shards": len(m.shards)}


def changed_articles(a: Path, b: Path) -> tuple[int, int]:
    """(articles, articles whose text differs between the dumps)."""
    from rag_core.wiki.dumps import DumpSource, iter_pages

    old = {p.page_id: p.text for p in iter_pages(DumpSource(str(a))) if p.ns == 0 and not p.redirect}
    new = {p.page_id: p.text for p in iter_pages(DumpSource(str(b))) if p.ns == 0 and not p.redirect}
    return len(new), sum(old.get(pid) != text for pid, text in new.items())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=1000, help="pages per dump (default 1000)")
    p.add_argument("--edit-fraction", type=float, default=0.1, help="share of articles edited in dump B")
    p.add_argument("--repeats", type=int, default=MIN_REPEATS, help=f"timed repetitions (default and minimum {MIN_REPEATS})")
    p.add_argument("--quick", action="store_true", help="300 pages: a smoke run")
    p.add_argument("--markdown", type=Path, help="write the results section here")
    args = p.parse_args(argv)
    if args.repeats < MIN_REPEATS:
        p.error(f"--repeats must be at least {MIN_REPEATS}: every figure is a min / median / max")
    if not SAMPLE.exists():
        raise SystemExit(f"skipped: the real sample is not at {SAMPLE} (../shared/data beside the repository)")
    pages = 300 if args.quick else args.pages
    info = RunInfo.start(argv and [sys.argv[0], *argv])

    from distributed import LocalCluster

    from runtime.prefect_server import prefect_api
    from runtime.settings import quiet_environment

    quiet_environment()
    a, b = dumps(pages, args.edit_fraction)
    articles, changed = changed_articles(a[0], b[0])
    inc_s, full_s, ratios, counts = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="wikirag-inc-") as tmp, prefect_api(Path(tmp) / "prefect"), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address="127.0.0.1:0") as cluster:
        initial_store = f"{tmp}/initial"
        _, initial_s = rebuild(cluster.scheduler_address, a, initial_store)
        for rep in range(args.repeats):
            incremental_store, full_store = f"{tmp}/incremental-{rep}", f"{tmp}/full-{rep}"
            shutil.copytree(initial_store, incremental_store)
            timed = {}
            for kind in ("incremental", "full") if rep % 2 == 0 else ("full", "incremental"):
                store = incremental_store if kind == "incremental" else full_store
                timed[kind] = rebuild(cluster.scheduler_address, b, store)
                print(f"repetition {rep + 1}: {kind} rebuild {timed[kind][1]:.1f} s", flush=True)
            inc_s.append(timed["incremental"][1])
            full_s.append(timed["full"][1])
            ratios.append(inc_s[-1] / full_s[-1])
            counts.append((embedding_counts(incremental_store, timed["incremental"][0]),
                           embedding_counts(full_store, timed["full"][0])))
            shutil.rmtree(incremental_store, ignore_errors=True)
            shutil.rmtree(full_store, ignore_errors=True)
    info.finish()

    inc, full = counts[0]
    if any(c != counts[0] for c in counts):
        raise SystemExit(f"the repetitions encoded different numbers of passages: {counts}")
    share = inc["encoded"] / max(inc["passages"], 1)
    median_ratio = statistics.median(ratios)
    rows = [
        ("initial rebuild from A (once, not timed in the ratio)", "-", "-", f"{initial_s:.1f} (one run)"),
        (f"incremental rebuild from B ({changed} of {articles} articles edited)", f"{inc['encoded']:,}",
         f"{inc['reused']:,}", spread(inc_s, "{:.1f}")),
        ("full rebuild from B (empty store)", f"{full['encoded']:,}", f"{full['reused']:,}", spread(full_s, "{:.1f}")),
    ]
    goals = [
        (f"re-encoded share of passages about the edited share ({changed / articles:.1%} of articles; "
         "0.5x to 2x of it)", f"{share:.1%} (the same in every repetition)",
         0.5 * changed / articles <= share <= 2 * changed / articles),
        ("incremental time / full rebuild time, per repetition (goal <= 25%, median)",
         spread([100 * r for r in ratios], "{:.1f}%"), median_ratio <= 0.25),
    ]
    for row in rows:
        print(f"{row[0]}: encoded {row[1]}, reused {row[2]}, {row[3]} s")
    for goal, value, ok in goals:
        print(f"{'PASS' if ok else 'FAIL'} {goal}: {value}")

    lines = [
        "## Incremental rebuild", "", *info.markdown_header(),
        f"Dumps of {pages:,} pages from `bench/make_dump.py`; B edits {args.edit_fraction:.0%} of A's articles "
        f"(a new first sentence, so all their passages change). One Prefect server and one 2-worker Dask "
        f"cluster serve all runs; times are the flow call (ingest B, embed, gate, index, gate, publish), "
        f"default encoder (all-MiniLM-L6-v2, its default dtype) and factory (auto). B has {inc['passages']:,} passages "
        f"in {inc['shards']} shards. {args.repeats} repetitions, the two timed runs taking turns; wall s is "
        "min / median / max.", "",
        "| run | passages encoded | vectors reused | wall s |", "|---|---:|---:|---:|",
        *(f"| {' | '.join(row)} |" for row in rows), "",
        "| goal | measured | |", "|---|---:|---|",
        *(f"| {goal} | {value} | {'PASS' if ok else 'FAIL'} |" for goal, value, ok in goals), "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
