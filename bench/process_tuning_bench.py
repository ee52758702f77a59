"""Process-level tuning on vs off: real commands with ``WIKIRAG_PROCESS_TUNING`` unset and ``=off``, side by side.

What the switch turns off (runtime/process_tuning.py): glibc's malloc
thresholds (each process and Dask worker), Dask's nanny malloc trim and its
background sampling in local workers, ``gc.freeze`` before each process's
exit, and the Prefect database template. Everything else is the same in both
modes: one user cache (int8 weights, probe verdicts, the template a first
untimed run leaves), dtype and engine ``auto`` (``WIKIRAG_PERF`` stays on).

Commands (``--commands``, default all three), each a fresh process as a user
runs it, in alternating order:

* ``index-rebuild`` of the first ``--articles`` articles of the real sample in
  a fresh ``WIKIRAG_HOME`` (its own Prefect server, a local Dask cluster of
  ``--workers`` workers: ingest, embed, FAISS, gates, publish);
* ``ingest`` of the same dump in a fresh ``WIKIRAG_HOME``: the Prefect
  server's boot, the cluster and the exit weigh more here than the work;
* ``search`` of one question against the index of an untimed first rebuild
  (start, encoder and index load, the exit).

Reported: wall seconds per mode (min / median / max) and the ratio off / on
within each round (> 1: tuning wins).

    python bench/process_tuning_bench.py --markdown bench/results/process-tuning.md   # ~15 min on 2 cores
"""

from __future__ import annotations

import bz2
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]
from report import RunInfo, alternating, bench_parser, emulate_avx2_if_asked, parse_bench_args, publish, spread  # noqa: E402,I001

SAMPLE = REPO.parent / "shared/data/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
QUESTION = "Who was the teacher of Alexander the Great?"
MODES = {"on": {}, "off": {"WIKIRAG_PROCESS_TUNING": "off"}}
COMMANDS = ("index-rebuild", "ingest", "search")
CLI = "cli.wikirag"  # the module `wikirag` runs, as `python -m`


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def small_dump(sample: Path, articles: int, out: Path) -> Path:
    """The sample's header, its first ``articles`` article pages (redirects and other namespaces kept in between
    are dropped), and its footer, as a .xml.bz2."""
    xml = bz2.open(sample, "rt", encoding="utf-8").read()
    head, _, rest = xml.partition("  <page>")
    pages = re.findall(r"  <page>.*?</page>\n", "  <page>" + rest, flags=re.S)
    kept = [p for p in pages if "<ns>0</ns>" in p and "<redirect" not in p][:articles]
    path = out / f"sample-{len(kept)}-articles.xml.bz2"
    path.write_bytes(bz2.compress((head + "".join(kept) + "</mediawiki>\n").encode("utf-8")))
    return path


def _env(mode: str, home: Path, cache: Path, workers: int) -> dict[str, str]:
    drop = ("PREFECT_API_URL", "WIKIRAG_STORE", "WIKIRAG_DASK_ADDRESS", "WIKIRAG_PROCESS_TUNING", "WIKIRAG_PERF")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("MALLOC_")}
    return env | MODES[mode] | {"PYTHONPATH": str(REPO), "WIKIRAG_HOME": str(home), "XDG_CACHE_HOME": str(cache),
                                "WIKIRAG_WORKERS": str(workers)}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of ``python -m <CLI> *argv`` from its start to its end as this process sees it, and its stdout."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", CLI, *argv], cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"wikirag {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__, what="runs of each command in each mode, alternating")
    parser.add_argument("--articles", type=int, default=40, help="articles of the sample to rebuild (default 40)")
    parser.add_argument("--workers", type=int, default=2, help="local Dask workers (default 2: the cores)")
    parser.add_argument("--sample", type=Path, default=SAMPLE, help="the dump (default the real sample)")
    parser.add_argument("--commands", nargs="+", choices=COMMANDS, default=list(COMMANDS),
                        help="commands to time (default all)")
    args = parse_bench_args(parser, argv)
    if not args.sample.exists():
        log(f"skipped: {args.sample} is missing (the real sample lives in ../shared/data); pass --sample PATH")
        return
    info = RunInfo.start()
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="process-tuning-bench-") as tmp:
        root = Path(tmp)
        dump, cache = small_dump(args.sample, args.articles, root), root / "cache"
        first = root / "first-home"
        seconds, out = timed(["index-rebuild", str(dump)], _env("on", first, cache, args.workers))
        log(f"untimed first rebuild (fills the user cache): {seconds:.1f} s, version {out.split()[-1]}")
        argv = {"index-rebuild": ["index-rebuild", str(dump)], "ingest": ["ingest", str(dump)],
                "search": ["search", "--json", QUESTION]}
        for r, mode in alternating(list(MODES), args.repeats):
            for command in args.commands:
                home = first if command == "search" else root / f"{mode}-{r}-{command}"
                seconds, _ = timed(argv[command], _env(mode, home, cache, args.workers))
                times.setdefault((command, mode), []).append(seconds)
                log(f"round {r + 1}: tuning {mode}: {command} {seconds:.1f} s")
    info.finish()
    lines = [
        "## Process-level tuning: real commands with WIKIRAG_PROCESS_TUNING on vs off",
        "",
        *info.markdown_header(),
        f"Each command a fresh process, {args.repeats} rounds, modes in alternating order. `index-rebuild` and "
        f"`ingest`: the first {args.articles} articles of the real sample in a fresh `WIKIRAG_HOME` (own Prefect "
        f"server, {args.workers} local Dask workers); `search`: one question against the index of an untimed first "
        "rebuild, which also filled the user cache both modes share (method in bench/README.md).",
        "",
        "| command | tuning on: wall s (min / median / max) | tuning off: wall s (min / median / max) "
        "| off / on (min / median / max) |",
        "|---|---:|---:|---:|",
    ]
    for command in args.commands:
        on, off = times[(command, "on")], times[(command, "off")]
        ratios = [b / a for a, b in zip(on, off)]
        lines.append(f"| `{command}` | {spread(on, '{:.1f}')} | {spread(off, '{:.1f}')} | {spread(ratios, '{:.2f}')}x |")
    lines.append("")
    publish("\n".join(lines), args.markdown)


if __name__ == "__main__":
    emulate_avx2_if_asked()
    main()
