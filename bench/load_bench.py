"""Load: ``wikirag search --questions FILE --json`` with 2,000 real questions against 200, same run.

What an operator needs before pointing a batch at the CLI: time per question
and peak memory, and whether either grows with the batch. Both sides are the
real command in a fresh process (imports, index load, encoder load, all
questions, JSON lines out), on one small published index of real passages
(the sample dump's first ``--passages`` passages, the packaged
all-MiniLM-L6-v2 at dtype ``auto``, 2 Flat shards) and NQ-open dev's first
questions (../shared/data, read in place):

* **2,000 questions** and **200 questions**, alternating order per repeat;
* wall time per question (startup included, as a user pays it) and the
  child's peak RSS (``wait4``'s ``ru_maxrss``);
* the ratios 2,000 over 200: per-question time (below 1: startup amortised)
  and peak RSS (near 1: memory bounded by the batch, not the question count).

Every run's output is checked: exactly one JSON line per question, in order.

    flock /tmp/wikirag-heavy.lock python bench/load_bench.py --markdown bench/results/load.md   # ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]
from report import MIN_REPEATS, RunInfo, publish, spread

NQ_DEV = REPO.parent / "shared/data/qa/nq_open/NQ-open.dev.jsonl"
SAMPLE = REPO.parent / "shared/data/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
SIZES = (2000, 200)


def build_index(root: Path, passages: int) -> Path:
    """A published 2-shard Flat version of the sample's first ``passages`` passages; returns the store."""
    from rag_core.index.build import build_version
    from rag_core.index.embedding_files import EmbedConfig
    from rag_core.index.encoders import EncoderConfig
    from rag_core.index.faiss_index import IndexConfig
    from rag_core.storage import Store
    from rag_core.wiki.dumps import DumpSource, iter_pages
    from rag_core.wiki.passages import passages_from_pages
    from tests.helpers.passagefiles import publish_passages

    store = Store(str(root / "store"))
    table = passages_from_pages(iter_pages(DumpSource(str(SAMPLE))))[0].slice(0, passages)
    publish_passages(store, "sample", table)
    build_version(store, "sample", EmbedConfig(encoder=EncoderConfig(dtype="auto"), shards=2),
                  IndexConfig(factory="Flat"))
    return root / "store"


def run_search(store: Path, questions: list[str], path: Path, home: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one ``wikirag search --questions`` over ``questions``; checks its output."""
    path.write_text("\n".join(questions) + "\n", encoding="utf-8")
    env = {**os.environ, "WIKIRAG_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    out = path.with_suffix(".out")
    started = time.perf_counter()
    with out.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "cli.wikirag", "search", "--questions", str(path), "--json",
                                 "--store", str(store)], cwd=REPO, env=env, stdout=sink, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"search failed: {stderr[-2000:]}")
    lines = out.read_text(encoding="utf-8").splitlines()
    if [json.loads(line)["question"] for line in lines] != questions:
        raise SystemExit(f"search answered {len(lines)} lines for {len(questions)} questions, or out of order")
    return seconds, usage.ru_maxrss / 1024  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS)
    parser.add_argument("--passages", type=int, default=2000, help="passages in the index (default 2000)")
    parser.add_argument("--markdown", type=Path, help="write the table here too")
    args = parser.parse_args()
    if not NQ_DEV.exists() or not SAMPLE.exists():
        raise SystemExit(f"needs ../shared/data ({NQ_DEV}, {SAMPLE})")
    with NQ_DEV.open(encoding="utf-8") as f:
        questions = [json.loads(line)["question"].strip() for line, _ in zip(f, range(max(SIZES)))]

    info = RunInfo.start()
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    rss: dict[int, list[float]] = {n: [] for n in SIZES}
    with tempfile.TemporaryDirectory(prefix="load-bench-") as tmp:
        root = Path(tmp)
        store = build_index(root, args.passages)
        for repeat in range(args.repeats):
            for n in SIZES if repeat % 2 == 0 else SIZES[::-1]:
                seconds, peak = run_search(store, questions[:n], root / f"q{n}.txt", root / "home")
                times[n].append(seconds / n)
                rss[n].append(peak)
                print(f"# repeat {repeat}: {n} questions in {seconds:.1f} s, peak RSS {peak:.0f} MiB", file=sys.stderr)
    info.finish()

    big, small = SIZES
    time_ratio = [a / b for a, b in zip(times[big], times[small])]
    rss_ratio = [a / b for a, b in zip(rss[big], rss[small])]
    lines = [
        f"### Load: `search --questions FILE --json`, {big:,} against {small:,} real questions", "",
        *info.markdown_header(),
        (f"Index: {args.passages:,} real passages (sample dump), packaged all-MiniLM-L6-v2 (dtype auto), 2 Flat "
         f"shards; questions: NQ-open dev, first {big:,}; each run a fresh process, checked for one JSON line per "
         f"question in input order; {args.repeats} repeats, min / median / max."),
        "",
        "| questions | s per question (startup included) | wall s | peak RSS (MiB) |",
        "|---|---|---|---|",
        *(f"| {n:,} | {spread(times[n], '{:.4f}')} | {spread([t * n for t in times[n]], '{:.1f}')} | "
          f"{spread(rss[n], '{:.0f}')} |" for n in SIZES),
        f"| ratio {big:,} / {small:,} | {spread(time_ratio, '{:.2f}')} | | {spread(rss_ratio, '{:.2f}')} |",
        "",
    ]
    publish("\n".join(lines), args.markdown)


if __name__ == "__main__":
    main()
