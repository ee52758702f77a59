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

1. store I: rebuild from A (not timed: this is "last month's" index);
2. store I: rebuild from B, timed (incremental: reuses A's vectors);
3. store F: rebuild from B, timed (full: nothing to reuse).

Both timed runs ingest B from scratch, embed, gate, index and publish.

    python bench/incremental_bench.py --quick              # 300 pages, ~3 min
    python bench/incremental_bench.py --markdown /tmp/inc.md   # 1,000 pages
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from make_dump import SAMPLE, dump_paths, make_dump  # noqa: E402

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
    from flows.ingest import dask_runner
    from rag_core.wiki.ingest import IngestConfig

    started = time.perf_counter()
    version = index_rebuild.with_options(task_runner=dask_runner(address, 0))(
        ingest_config=IngestConfig(dump=str(dump[0]), index=str(dump[1])), store=store)
    return version, time.perf_counter() - started


def embedding_counts(store_url: str, version: str) -> dict[str, int]:
    from rag_core.index.embeddings import range_record
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
    p.add_argument("--quick", action="store_true", help="300 pages: a smoke run")
    p.add_argument("--markdown", type=Path, help="write the results section here")
    args = p.parse_args(argv)
    if not SAMPLE.exists():
        raise SystemExit(f"skipped: the real sample is not at {SAMPLE} (../shared/data beside the repository)")
    pages = 300 if args.quick else args.pages

    from distributed import LocalCluster

    from flows.prefect_api import prefect_api
    from flows.settings import quiet_environment

    quiet_environment()
    a, b = dumps(pages, args.edit_fraction)
    articles, changed = changed_articles(a[0], b[0])
    with tempfile.TemporaryDirectory(prefix="wikirag-inc-") as tmp, prefect_api(Path(tmp) / "prefect"), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address="127.0.0.1:0") as cluster:
        incremental_store, full_store = f"{tmp}/incremental", f"{tmp}/full"
        _, initial_s = rebuild(cluster.scheduler_address, a, incremental_store)
        inc_version, inc_s = rebuild(cluster.scheduler_address, b, incremental_store)
        full_version, full_s = rebuild(cluster.scheduler_address, b, full_store)
        inc = embedding_counts(incremental_store, inc_version)
        full = embedding_counts(full_store, full_version)

    share = inc["encoded"] / max(inc["passages"], 1)
    ratio = inc_s / full_s
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = [
        ("initial rebuild from A (not timed in the ratio)", "-", "-", f"{initial_s:.1f}"),
        (f"incremental rebuild from B ({changed} of {articles} articles edited)", f"{inc['encoded']:,}",
         f"{inc['reused']:,}", f"{inc_s:.1f}"),
        ("full rebuild from B (empty store)", f"{full['encoded']:,}", f"{full['reused']:,}", f"{full_s:.1f}"),
    ]
    goals = [
        (f"re-encoded share of passages about the edited share ({changed / articles:.1%} of articles)",
         f"{share:.1%}", 0.5 * changed / articles <= share <= 2 * changed / articles),
        ("incremental time <= 25% of a full rebuild", f"{ratio:.1%}", ratio <= 0.25),
    ]
    for row in rows:
        print(f"{row[0]}: encoded {row[1]}, reused {row[2]}, {row[3]} s")
    for goal, value, ok in goals:
        print(f"{'PASS' if ok else 'FAIL'} {goal}: {value}")
    print(f"passages in B: {inc['passages']:,} in {inc['shards']} shards; load average {load}")

    if args.markdown:
        lines = [
            "## Incremental rebuild", "",
            f"`python bench/incremental_bench.py{' --quick' if args.quick else ''}` on {time.strftime('%Y-%m-%d')} "
            f"({os.cpu_count()} cores, Python {platform.python_version()}, load average at the end {load}). "
            f"Dumps of {pages:,} pages from `bench/make_dump.py`; B edits {args.edit_fraction:.0%} of A's articles "
            f"(a new first sentence, so all their passages change). One Prefect server and one 2-worker Dask "
            f"cluster serve all runs; times are the flow call (ingest B, embed, gate, index, gate, publish), "
            f"default encoder (all-MiniLM-L6-v2, bf16) and factory (auto). B has {inc['passages']:,} passages "
            f"in {inc['shards']} shards.", "",
            "| run | passages encoded | vectors reused | wall s |", "|---|---:|---:|---:|",
            *(f"| {' | '.join(row)} |" for row in rows), "",
            "| goal | measured | |", "|---|---:|---|",
            *(f"| {goal} | {value} | {'PASS' if ok else 'FAIL'} |" for goal, value, ok in goals), "",
        ]
        args.markdown.write_text("\n".join(lines))
        print(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
