"""The ingest stage side by side: wikirag vs wikiextractor, with bz2 alone as the floor.

Every figure is repeated (``--repeats``, at least 3) and reported as
min / median / max; ratios are taken within one repetition, on the same
phase on both sides, and then summarised the same way:

* **whole run**: pages / wall time of the whole command, start-up included;
* **steady state**: the marginal rate (N - 200) / (t_N - t_200), each tool
  against its own run on the 200-page cut of the same dump in the same
  repetition: what a tool adds per page once it is running.

Rows, each a subprocess run exactly as a user runs it (fresh ``WIKIRAG_HOME``
and store per run; no ``PREFECT_API_URL``, so the CLI starts its own Prefect
server):

* ``wikirag ingest DUMP --index INDEX --workers 2`` (and ``--workers 1`` with
  ``--parts scaling``);
* wikiextractor 3.1.0, ``--processes 2``, its defaults otherwise;
* the floor: bz2 decompression alone over the multistream dump's streams, in
  ~8 MiB runs of whole streams as a worker reads them: the standard library's
  libbz2 on one process, and libbz2's Rust port (cramjam-pure-rust, what
  wikirag reads with) on one process and on two (the streams split in halves).

Wall time and peak memory (the summed RSS of the command's process tree,
sampled every 0.1 s) come from outside; wikirag's log timestamps split its
wall time into phases (server, cluster, parse, gates and publish), which are
shown for wikirag alone and never divided by a whole-run figure of another
tool.  Rows take turns within a repetition, and every other repetition runs
them in the reverse order, so that load coming and going hits both tools.

Inputs: the real 206-page sample (text quality: markup residue and words
kept, deterministic, one run), and a multistream dump with index made by
``bench/make_dump.py`` from the sample's pages (cached in ``bench/.cache/``),
with the 200-page (and, for ``memory``, 5,000-page) dumps cut from it.

    python bench/ingest_bench.py --quick                        # 1,000 pages, 3 repeats, no memory or scaling part
    python bench/ingest_bench.py --markdown bench/results/ingest.md   # 20,000 pages: floors, peer, memory, quality
    python bench/ingest_bench.py --parts scaling --markdown out.md    # 1 vs 2 workers
"""

from __future__ import annotations

import argparse
import bz2
import html
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_dump import PAGES_PER_STREAM, SAMPLE, check_dump, cut_dump, dump_paths, make_dump
from report import MIN_REPEATS, RunInfo, spread

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(__file__).resolve().parent / ".cache"
TINY_PAGES = 200
MEMORY_PAGES = 5_000
PARTS = ("floors", "peer", "memory", "quality", "scaling")
DEFAULT_PARTS = ("floors", "peer", "memory", "quality")
MARKERS = ("{{", "}}", "[[", "]]", "<ref", "{|", "|}", "&amp;", "&nbsp;", "<!--")
GOAL_VS_PEER = 2.0  # wikirag (2 workers) steady-state pages/s over wikiextractor's, median of the repeats
GOAL_SCALING = 1.7  # wikirag 2 workers over 1 worker, steady state
GOAL_MEMORY = 1.25  # peak RSS on the largest dump over the 5,000-page one: "roughly independent of size"
# Removed from the children's environment so that every run starts its own services.
ISOLATE = (
    "PREFECT_API_URL", "PREFECT_HOME", "WIKIRAG_HOME", "WIKIRAG_STORE", "WIKIRAG_DASK_ADDRESS", "WIKIRAG_WORKERS",
)
QUIET = {"DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "AWS_EC2_METADATA_DISABLED": "true"}
WIKIRAG_2, WIKIRAG_1, WIKIEXTRACTOR = "wikirag, 2 workers", "wikirag, 1 worker", "wikiextractor, 2 processes"


@dataclass(frozen=True)
class Dump:
    """A benchmark input: the file, its index (multistream only) and how many pages it holds."""

    label: str
    path: Path
    index: Path | None
    pages: int

    @property
    def mb(self) -> float:
        return self.path.stat().st_size / 1e6


@dataclass
class Run:
    """One measured command."""

    tool: str
    dump: Dump
    rep: int
    wall_s: float
    peak_rss_mb: float
    returncode: int
    output_tail: str = ""
    out_dir: Path | None = None  # the store (wikirag) or output folder (wikiextractor)
    peak_by_role: dict[str, tuple[int, float]] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # wikirag: seconds per phase, from its log
    phase_peak_mb: dict[str, float] = field(default_factory=dict)  # wikirag: peak RSS in the parse/finish phases

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def pages_s(self) -> float:
        return self.dump.pages / self.wall_s

    @property
    def parse_pages_s(self) -> float | None:
        """Pages over wikirag's own parse phase (from its log): a wikirag-only figure, never a ratio's term."""
        secs = self.phases.get("parse")
        return self.dump.pages / secs if secs else None


@dataclass
class Results:
    """Everything measured in one run of the benchmark, for the report."""

    floors: dict[str, list[float]] = field(default_factory=dict)  # label -> seconds per repetition
    runs: list[Run] = field(default_factory=list)
    quality: list[dict] = field(default_factory=list)

    def find(self, tool: str, pages: int, rep: int) -> Run | None:
        for r in self.runs:
            if r.tool == tool and r.dump.pages == pages and r.rep == rep and r.ok and r.dump.index is not None:
                return r
        return None


# -- inputs ---------------------------------------------------------------------------------


def prepare_dumps(main_pages: int, sizes: list[int], cache: Path, seed: int = 0) -> dict[int, Dump]:
    """Multistream dumps of each size, cut from one generated dump of the largest size (cached)."""
    cache.mkdir(parents=True, exist_ok=True)
    wanted = sorted({TINY_PAGES, main_pages, *sizes})
    for n in wanted:
        if n % PAGES_PER_STREAM:
            raise SystemExit(f"dump sizes must be multiples of {PAGES_PER_STREAM}; got {n}")
    largest = wanted[-1]
    dumps: dict[int, Dump] = {}
    for n in reversed(wanted):
        name = f"enwiki-bench{n}-s{seed}"
        path, index = dump_paths(cache, name)
        if not (path.exists() and index.exists()):
            if n == largest:
                t0 = time.perf_counter()
                log(f"generating {n:,} pages into {cache} (once; cached for later runs) ...")
                make_dump(n, cache, name=name, seed=seed)
                log(f"  done in {time.perf_counter() - t0:.0f} s")
            else:  # the first n pages of the largest dump are exactly the n-page dump
                big = dumps[largest]
                cut_dump(big.path, big.index, n, cache, name)
        dumps[n] = Dump(f"multistream {n:,}", path, index, n)
    return dumps


def sample_dump(sample: Path) -> Dump:
    """The real export (one bz2 stream), with its page count."""
    if not sample.exists():
        raise SystemExit(f"{sample}: the real sample is missing; pass --sample")
    return Dump("real sample", sample, None, check_dump(sample))


# -- measuring ------------------------------------------------------------------------------


@dataclass
class Measurement:
    """Wall time and peak memory of one command's process tree."""

    wall_s: float
    peak_rss_mb: float
    returncode: int
    peak_by_role: dict[str, tuple[int, float]]  # role -> (processes, MB) at the peak sample
    timeline: list[tuple[float, float]]  # (seconds since local midnight, summed RSS MB), every sample


def measure(cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path, interval: float = 0.1) -> Measurement:
    """Run ``cmd`` with output to ``log_path``; sample the summed RSS of its process tree every ``interval`` s."""
    peak, peak_roles, timeline = 0, {}, []
    with log_path.open("wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            total, roles = tree_rss(root)
            timeline.append((seconds_of_day(time.time()), total / 1e6))
            if total > peak:
                peak, peak_roles = total, roles
            time.sleep(interval)
        wall = time.perf_counter() - t0
    return Measurement(wall, peak / 1e6, proc.returncode, peak_roles, timeline)


def seconds_of_day(epoch: float) -> float:
    """Local time of day in seconds, the clock wikirag's log lines are stamped with."""
    t = time.localtime(epoch)
    return t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec + epoch % 1


def tree_rss(root: psutil.Process) -> tuple[int, dict[str, tuple[int, float]]]:
    """Summed RSS (bytes) of ``root`` and all its descendants, and how it splits by role."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, {}
    total, roles = 0, {}
    for p in procs:
        try:
            rss = p.memory_info().rss
            role = process_role(p, root)
        except psutil.Error:  # gone between listing and reading
            continue
        total += rss
        n, mb = roles.get(role, (0, 0.0))
        roles[role] = (n + 1, mb + rss / 1e6)
    return total, roles


def process_role(p: psutil.Process, root: psutil.Process) -> str:
    """A short name for what a process in the tree is."""
    if p.pid == root.pid:
        return "main process"
    cmdline = " ".join(p.cmdline())
    if "prefect" in cmdline and "server" in cmdline:
        return "Prefect server"
    if "spawn_main" in cmdline:  # Dask's nanny spawns its worker processes
        return "spawned workers"
    return "other processes"  # forked children (wikiextractor), multiprocessing's resource tracker


def tail(path: Path, n_chars: int = 3000) -> str:
    data = path.read_bytes()[-n_chars:]
    return data.decode("utf-8", errors="replace")


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without any service address, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ISOLATE}
    env.update(QUIET)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _decompress_range(path: str, start: int, end: int, rust: bool) -> int:
    """Decompress the bz2 streams in bytes [start, end) of a file, as wikirag's shards do; returns bytes out."""
    from rag_core.wiki.multistream import decompress_streams

    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return len(decompress_streams(data, path, start, use_rust=rust))


def bz2_floor(dump: Dump, procs: int, rust: bool) -> float:
    """Seconds to decompress a multistream dump cut into ``procs`` contiguous runs of whole streams, one process each.

    Each process reads its run in ~8 MiB pieces that end on a stream boundary, as a worker reads a shard.
    """
    lines = bz2.decompress(dump.index.read_bytes()).decode("utf-8").splitlines()
    offsets = sorted({int(line.split(":", 1)[0]) for line in lines})
    size = dump.path.stat().st_size
    bounds = [0]
    for off in offsets:
        if off - bounds[-1] >= 8 << 20:
            bounds.append(off)
    bounds.append(size)
    pieces = list(zip(bounds[:-1], bounds[1:]))
    runs = [pieces[len(pieces) * k // procs : len(pieces) * (k + 1) // procs] for k in range(procs)]
    with ProcessPoolExecutor(procs) as pool:
        pool.submit(int, 0).result()  # processes up before the clock starts
        t0 = time.perf_counter()
        futures = [pool.submit(_decompress_run, str(dump.path), run, rust) for run in runs]
        for f in futures:
            f.result()
        return time.perf_counter() - t0


def _decompress_run(path: str, run: list[tuple[int, int]], rust: bool) -> int:
    return sum(_decompress_range(path, a, b, rust) for a, b in run)


def rust_bz2_available() -> bool:
    from rag_core.wiki import multistream

    return multistream._rust_bz2 is not None


def wikirag_command() -> list[str]:
    """``wikirag`` when installed, else the CLI module from the repository."""
    exe = shutil.which("wikirag")
    if exe:
        return [exe]
    if not (REPO / "flows" / "cli.py").exists():
        raise SystemExit(f"no `wikirag` on PATH and no {REPO / 'cli/wikirag.py'}; run `pip install -e {REPO}`")
    return [sys.executable, "-m", "cli.wikirag"]


_STAMP_RE = re.compile(r"^(\d\d):(\d\d):(\d\d(?:\.\d+)?) \|", re.MULTILINE)
_MARKS = {  # phase boundary -> a line of wikirag's log (its own logger and Prefect's)
    "cli_start": r"\| wikirag \| ingesting ",
    "server_ready": r"\| wikirag\.prefect \| local Prefect server at ",
    "flow_begin": r"Beginning flow run ",
    "dask_ready": r"The Dask dashboard is available",
    "parse_end": r"Task run 'ingest_(?:shard|stream)-[^']*' - Finished in state",
    "flow_end": r"Flow run '[^']*' - Finished in state",
}


def log_times(output: str) -> dict[str, float]:
    """Seconds since midnight of the first (last, for ``parse_end``) log line matching each mark."""
    times: dict[str, float] = {}
    for line in output.splitlines():
        stamp = _STAMP_RE.match(line)
        if not stamp:
            continue
        h, m, sec = stamp.groups()
        t = int(h) * 3600 + int(m) * 60 + float(sec)
        for mark, pattern in _MARKS.items():
            if re.search(pattern, line) and (mark == "parse_end" or mark not in times):
                times[mark] = t
    return times


def phase_peaks(output: str, timeline: list[tuple[float, float]]) -> dict[str, float]:
    """Peak summed RSS (MB) during wikirag's parse phase and during its finish (gates, publish)."""
    t = log_times(output)
    t.setdefault("dask_ready", t.get("flow_begin"))
    windows = {"parse": ("dask_ready", "parse_end"), "finish": ("parse_end", "flow_end")}
    peaks = {}
    for name, (a, b) in windows.items():
        if t.get(a) is not None and t.get(b) is not None:
            inside = [mb for ts, mb in timeline if t[a] <= ts <= t[b] + 1]  # log stamps lag by < 1 s
            if inside:
                peaks[name] = max(inside)
    return peaks


def wikirag_phases(output: str) -> dict[str, float]:
    """Where a wikirag run's wall time went, read from the timestamps of its log.

    server: CLI start to a healthy local Prefect server; setup: server to the
    Dask cluster being up (flow run created, cluster started); parse: cluster
    up to the last parsing task done (decompress, parse, clean, chunk, stage);
    finish: the rest of the flow (gates, publish, cluster shutdown); flow: the
    flow run from begin to end.  Missing log lines leave phases out.
    """
    t = log_times(output)
    if "dask_ready" not in t and "flow_begin" in t:
        t["dask_ready"] = t["flow_begin"]

    def span(a: str, b: str) -> float | None:
        if a in t and b in t:
            return (t[b] - t[a]) % 86400  # a run may cross midnight
        return None

    phases = {
        "server": span("cli_start", "server_ready"),
        "setup": span("server_ready", "dask_ready"),
        "parse": span("dask_ready", "parse_end"),
        "finish": span("parse_end", "flow_end"),
        "flow": span("flow_begin", "flow_end"),
    }
    return {k: v for k, v in phases.items() if v is not None}


def run_wikirag(dump: Dump, workers: int, work: Path, rep: int = 0) -> Run:
    """``wikirag ingest`` on ``dump`` in a fresh home and store; the store is kept for reading."""
    label = f"wikirag-{workers}w-{dump.pages}-{dump.path.stem[:20]}-r{rep}"
    home, store = work / f"{label}-home", work / f"{label}-store"
    cmd = [*wikirag_command(), "ingest", str(dump.path), "--store", str(store), "--workers", str(workers)]
    if dump.index:
        cmd += ["--index", str(dump.index)]
    log_path = work / f"{label}.log"
    log(f"  wikirag {workers} worker(s), {dump.label} ...")
    m = measure(cmd, child_env(WIKIRAG_HOME=str(home)), REPO, log_path)
    output = log_path.read_text(encoding="utf-8", errors="replace")
    run = Run(WIKIRAG_2 if workers == 2 else f"wikirag, {workers} worker{'s' if workers > 1 else ''}", dump, rep,
              m.wall_s, m.peak_rss_mb, m.returncode,
              output[-3000:], store, peak_by_role=m.peak_by_role, phases=wikirag_phases(output),
              phase_peak_mb=phase_peaks(output, m.timeline))
    report(run, cmd)
    return run


def run_wikiextractor(dump: Dump, processes: int, work: Path, rep: int = 0) -> Run:
    """wikiextractor 3.1.0 with ``--processes``; its output folder is kept for reading."""
    label = f"wikiextractor-{dump.pages}-{dump.path.stem[:20]}-r{rep}"
    out = work / f"{label}-out"
    cmd = [sys.executable, "-m", "wikiextractor.WikiExtractor", str(dump.path), "-o", str(out),
           "--processes", str(processes), "-q"]
    log_path = work / f"{label}.log"
    log(f"  wikiextractor --processes {processes}, {dump.label} ...")
    m = measure(cmd, child_env(), work, log_path)
    run = Run(f"wikiextractor, {processes} processes", dump, rep, m.wall_s, m.peak_rss_mb, m.returncode,
              tail(log_path), out, peak_by_role=m.peak_by_role)
    report(run, cmd)
    return run


def report(run: Run, cmd: list[str]) -> None:
    """One progress line per run on stderr; the command and its output's tail when it failed."""
    if not run.ok:
        log(f"  FAILED (exit {run.returncode}): {' '.join(cmd)}\n{run.output_tail}")
        return
    phases = ", ".join(f"{k} {v:.1f}" for k, v in run.phases.items())
    passages = passage_count(run.out_dir) if run.tool.startswith("wikirag") else None
    log(f"    {run.wall_s:.1f} s, peak {run.peak_rss_mb:,.0f} MB"
        + (f", {passages:,} passages" if passages is not None else "")
        + (f" (phases s: {phases})" if phases else ""))


# -- text quality ---------------------------------------------------------------------------


def wikirag_passages(store: Path) -> list[tuple[str, str, int]]:
    """(title, text, n_words) of every published passage under ``STORE/passages/<dump_id>/``."""
    parts = sorted(p for p in (store / "passages").glob("*/part-*.parquet") if not p.parent.name.startswith("_"))
    rows = []
    for part in parts:
        table = pq.read_table(part, columns=["title", "text", "n_words"]).to_pydict()
        rows.extend(zip(table["title"], table["text"], table["n_words"]))
    return rows


DOC_RE = re.compile(r'<doc id="[^"]*" url="[^"]*" title="([^"]*)">\n(.*?)</doc>', re.DOTALL)


def wikiextractor_docs(out: Path) -> dict[str, str]:
    """title -> body text (title line dropped) from wikiextractor's ``<doc>`` files.

    Its output is HTML-escaped by default (``--html-safe``), so it is unescaped
    once: a literal ``&amp;`` left in the text shows up as ``&amp;`` again.
    """
    docs = {}
    for path in sorted(p for p in out.rglob("wiki_*") if p.is_file()):
        for title, body in DOC_RE.findall(path.read_text(encoding="utf-8")):
            title = html.unescape(title)
            lines = body.split("\n")
            if lines and lines[0].strip() == title:
                lines = lines[1:]
            docs[title] = html.unescape("\n".join(lines))
    return docs


def has_residue(text: str) -> bool:
    return any(m in text for m in MARKERS)


def residue_rate(texts: Iterable[str]) -> tuple[float, int]:
    """(fraction of texts holding any markup marker, number of texts)."""
    texts = list(texts)
    return (sum(map(has_residue, texts)) / len(texts) if texts else float("nan")), len(texts)


def word_windows(text: str, size: int = 100) -> list[str]:
    words = text.split()
    return [" ".join(words[i : i + size]) for i in range(0, len(words), size)]


def compare_quality(wikirag_store: Path, wx_out: Path) -> list[dict]:
    """Residue rates and words kept per article, for both tools on the same pages."""
    passages = wikirag_passages(wikirag_store)
    docs = {t: d for t, d in wikiextractor_docs(wx_out).items() if d.strip()}
    rag_words: dict[str, int] = defaultdict(int)
    for title, _, n in passages:
        rag_words[title] += n
    common = sorted(set(rag_words) & set(docs))
    wx_words = {t: len(docs[t].split()) for t in common}
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    rag_rate, rag_n = residue_rate(text for _, text, _ in passages)
    wx_win_rate, wx_win_n = residue_rate(w for d in docs.values() for w in word_windows(d))
    wx_par_rate, wx_par_n = residue_rate(p for d in docs.values() for p in d.split("\n") if p.strip())
    return [
        {"tool": "wikirag", "articles": len(rag_words), "unit": "100-word passages", "n": rag_n,
         "residue": rag_rate, "words": mean([rag_words[t] for t in common]), "common": len(common)},
        {"tool": "wikiextractor", "articles": len(docs), "unit": "100-word windows", "n": wx_win_n,
         "residue": wx_win_rate, "words": mean([wx_words[t] for t in common]), "common": len(common)},
        {"tool": "wikiextractor", "articles": len(docs), "unit": "paragraphs", "n": wx_par_n,
         "residue": wx_par_rate, "words": None, "common": len(common)},
    ]


def passage_count(store: Path) -> int | None:
    """Rows of the published passage set, from its manifest."""
    manifests = [p for p in (store / "passages").glob("*/manifest.json") if not p.parent.name.startswith("_")]
    if not manifests:
        return None
    return sum(part["rows"] for part in json.loads(manifests[0].read_text())["parts"])


# -- report ---------------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ",.0f") -> str:
    return "n/a" if x is None else format(x, spec)


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def spread_or_na(values: list[float], fmt_: str = "{:,.0f}") -> str:
    return spread(values, fmt_) if len(values) >= MIN_REPEATS else "n/a"


def steady(res: Results, tool: str, pages: int, rep: int) -> float | None:
    """(N - 200) / (t_N - t_200) for one tool within one repetition."""
    big, tiny = res.find(tool, pages, rep), res.find(tool, TINY_PAGES, rep)
    if big is None or tiny is None or big.wall_s <= tiny.wall_s:
        return None
    return (big.dump.pages - tiny.dump.pages) / (big.wall_s - tiny.wall_s)


def per_rep(res: Results, reps: int, value: Callable[[int], float | None]) -> list[float]:
    """``value(rep)`` for every repetition where it exists."""
    return [v for k in range(reps) if (v := value(k)) is not None]


def floors_table(res: Results, dump: Dump) -> list[str]:
    lines = ["| floor: bz2 decompression alone | input | seconds | pages/s |", "|---|---|---:|---:|"]
    for label, secs in res.floors.items():
        lines.append(f"| {label} | {dump.label} | {spread_or_na(secs, '{:.1f}')} | "
                     f"{spread_or_na([dump.pages / s for s in secs])} |")
    return lines


def speed_table(res: Results, reps: int, main_pages: int) -> list[str]:
    """Every tool on every dump: wall time, whole-run and steady-state rates, peak memory."""
    lines = [
        ("| input | tool | pages | MB (bz2) | wall s | pages/s, whole run | pages/s, steady state "
        "| wikirag's parse phase, pages/s | peak RSS MB |"),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[int, str], list[Run]] = defaultdict(list)
    for r in res.runs:
        if r.dump.index is not None:
            groups[(r.dump.pages, r.tool)].append(r)
    for (pages, tool), runs in sorted(groups.items()):
        ok = [r for r in runs if r.ok]
        if len(ok) < len(runs):
            lines.append(f"| {runs[0].dump.label} | {tool} | {pages:,} | {runs[0].dump.mb:.1f} | "
                         f"{len(runs) - len(ok)} of {len(runs)} runs FAILED | | | | |")
            continue
        st = per_rep(res, reps, lambda k, t=tool, n=pages: steady(res, t, n, k)) if pages == main_pages else []
        parse = [r.parse_pages_s for r in ok if r.parse_pages_s]
        lines.append(
            f"| {ok[0].dump.label} | {tool} | {pages:,} | {ok[0].dump.mb:.1f} | "
            f"{spread_or_na([r.wall_s for r in ok], '{:.1f}')} | {spread_or_na([r.pages_s for r in ok])} | "
            f"{spread_or_na(st) if st else '-'} | {spread_or_na(parse) if parse else '-'} | "
            f"{spread_or_na([r.peak_rss_mb for r in ok])} |")
    return lines


def goal_rows(res: Results, reps: int, main: Dump, parts: set[str]) -> list[str]:
    """Each goal as a per-repetition ratio (same phase on both sides), min / median / max, verdict on the median."""
    n = main.pages
    rows = ["| goal | ratio per repetition, min / median / max | verdict (median) |", "|---|---:|---|"]

    def row(text: str, values: list[float], goal: float, higher_is_better: bool = True) -> None:
        if len(values) < MIN_REPEATS:
            rows.append(f"| {text} | {len(values)} repetitions measured | n/a |")
            return
        med = statistics.median(values)
        ok = med >= goal if higher_is_better else med <= goal
        rows.append(f"| {text} | {spread(values, '{:.2f}x')} | {verdict(ok)} |")

    def whole(tool: str, k: int) -> float | None:
        r = res.find(tool, n, k)
        return r.pages_s if r else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    if "peer" in parts:
        row(f"steady state: wikirag 2 workers / wikiextractor, {main.label} (goal >= {GOAL_VS_PEER}x)",
            per_rep(res, reps, lambda k: ratio(steady(res, WIKIRAG_2, n, k), steady(res, WIKIEXTRACTOR, n, k))),
            GOAL_VS_PEER)
        row(f"whole run: wikirag 2 workers / wikiextractor, {main.label} (no goal; start-up included)",
            per_rep(res, reps, lambda k: ratio(whole(WIKIRAG_2, k), whole(WIKIEXTRACTOR, k))), 0.0)
    if "scaling" in parts:
        row(f"steady state: wikirag 2 workers / 1 worker, {main.label} (goal >= {GOAL_SCALING}x)",
            per_rep(res, reps, lambda k: ratio(steady(res, WIKIRAG_2, n, k), steady(res, WIKIRAG_1, n, k))),
            GOAL_SCALING)
        row(f"whole run: wikirag 2 workers / 1 worker, {main.label} (no goal)",
            per_rep(res, reps, lambda k: ratio(whole(WIKIRAG_2, k), whole(WIKIRAG_1, k))), 0.0)
    if "memory" in parts:

        def growth(k: int) -> float | None:
            big, small = res.find(WIKIRAG_2, n, k), res.find(WIKIRAG_2, MEMORY_PAGES, k)
            return big.peak_rss_mb / small.peak_rss_mb if big and small else None

        row(f"peak RSS, wikirag 2 workers, {main.label} / multistream {MEMORY_PAGES:,} (goal <= {GOAL_MEMORY}x)",
            per_rep(res, reps, growth), GOAL_MEMORY, higher_is_better=False)
    return [r if "(no goal" not in r else r.rsplit("|", 2)[0] + "| - |" for r in rows]


def phase_table(res: Results) -> list[str]:
    """Where wikirag's wall time goes (medians over repetitions, from its log's timestamps)."""
    groups: dict[tuple[int, str], list[Run]] = defaultdict(list)
    for r in res.runs:
        if r.ok and r.phases and r.dump.index is not None:
            groups[(r.dump.pages, r.tool)].append(r)
    if not groups:
        return []
    lines = [
        ("| input | tool | wall s | Prefect server up | flow + Dask cluster up | parse (decompress, clean, chunk, stage) "
        "| gates, publish, shutdown | outside the flow (imports, exit) |"),
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (_, tool), runs in sorted(groups.items()):
        def med(key: str, runs: list[Run] = runs) -> float:
            return statistics.median([r.phases.get(key, 0.0) for r in runs])

        rest = statistics.median([r.wall_s - sum(r.phases.get(k, 0.0) for k in ("server", "setup", "parse", "finish"))
                                  for r in runs])
        lines.append(f"| {runs[0].dump.label} | {tool} | {statistics.median([r.wall_s for r in runs]):.1f} | "
                     f"{med('server'):.1f} | {med('setup'):.1f} | {med('parse'):.1f} | {med('finish'):.1f} | {rest:.1f} |")
    return lines


def memory_table(res: Results, main_pages: int) -> list[str]:
    """Peak summed RSS split by process role, for the run with the median peak of each tool on the main dump."""
    roles = ["main process", "Prefect server", "spawned workers", "other processes"]
    lines = ["| input | tool | peak RSS MB | " + " | ".join(roles) + " | peak in parse phase | peak in gates/publish |",
             "|---|---|---:|" + "---:|" * (len(roles) + 2)]
    groups: dict[tuple[int, str], list[Run]] = defaultdict(list)
    for r in res.runs:
        if r.ok and r.peak_by_role and r.dump.index is not None and r.dump.pages > TINY_PAGES:
            groups[(r.dump.pages, r.tool)].append(r)
    for (_, tool), runs in sorted(groups.items()):
        r = sorted(runs, key=lambda x: x.peak_rss_mb)[len(runs) // 2]
        cells = []
        for role in roles:
            count, mb = r.peak_by_role.get(role, (0, 0.0))
            cells.append(f"{mb:,.0f}" + (f" ({count})" if count > 1 else "") if count else "-")
        cells += [fmt(r.phase_peak_mb.get("parse")), fmt(r.phase_peak_mb.get("finish"))]
        lines.append(f"| {r.dump.label} | {tool} | {r.peak_rss_mb:,.0f} | " + " | ".join(cells) + " |")
    return lines


def quality_table(rows: list[dict]) -> list[str]:
    """Residue rates and words per article of both tools on the real sample."""
    if not rows:
        return []
    lines = [
        "| tool | articles out | unit | units | markup residue rate | mean words/article (common titles) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for q in rows:
        lines.append(f"| {q['tool']} | {q['articles']} | {q['unit']} | {q['n']:,} | {q['residue']:.2%} | "
                     f"{fmt(q['words'], ',.0f')} |")
    lines.append(f"\nArticles present in both outputs (matched by title): {rows[0]['common']}. "
                 f"Residue markers: {', '.join(f'`{m}`' for m in MARKERS)}. wikiextractor's output is "
                 "HTML-escaped by default and is unescaped once before counting. Counts, not timings: one run.")
    return lines


def render(res: Results, info: RunInfo, main: Dump, parts: set[str], reps: int, took: float) -> str:
    """The markdown section for bench/results/ingest.md."""
    out = [
        "## Ingest: wikirag vs wikiextractor (bz2 alone as the floor)",
        "",
        *info.markdown_header(),
        (f"Parts: {', '.join(p for p in PARTS if p in parts)}; {reps} repetitions, rows interleaved (every other "
        f"repetition in reverse order); the benchmark took {took / 60:.1f} min. Figures are min / median / max over "
        "the repetitions. wikiextractor 3.1.0 with `--processes 2` and its defaults (including its template "
        "pre-pass); wikirag as `wikirag ingest DUMP --index INDEX --workers N` with no Prefect server running (the "
        "CLI starts one). \"pages\" are all pages of the dump, articles and redirects alike. Whole run = N / wall "
        f"time. Steady state = (N - {TINY_PAGES}) / (t_N - t_{TINY_PAGES}), each tool against its own run on the "
        f"{TINY_PAGES}-page cut in the same repetition. wikirag's parse phase (cluster up to the last shard staged, "
        "from its log) is wikirag's alone and enters no ratio. Peak RSS is summed over the command's process tree "
        "(Prefect server and Dask workers included), sampled every 0.1 s."),
        "",
    ]
    if res.floors:
        out += [*floors_table(res, main), ""]
    if any(r.dump.index is not None for r in res.runs):
        out += [*speed_table(res, reps, main.pages), "", *goal_rows(res, reps, main, parts)]
    if phases := phase_table(res):
        out += ["", "### Where wikirag's time goes (seconds, median of the repetitions)", "", *phases]
    if (memory := memory_table(res, main.pages)) and len(memory) > 2:
        out += ["", "### Peak memory by process (MB; process count in brackets; the run with the median peak)",
                "", *memory]
    if res.quality:
        out += ["", "### Text quality on the real sample (206 pages)", "", *quality_table(res.quality)]
    return "\n".join(out) + "\n"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the run --------------------------------------------------------------------------------


def drop_outputs(run: Run, keep: bool) -> None:
    """A 20,000-page run leaves hundreds of MB; only the sample's outputs are read again."""
    if not keep and run.out_dir is not None:
        shutil.rmtree(run.out_dir, ignore_errors=True)
        shutil.rmtree(run.out_dir.with_name(run.out_dir.name.replace("-store", "-home")), ignore_errors=True)


def bench_quality(res: Results, sample: Dump, work: Path) -> None:
    """Text quality on the real single-stream sample (counts: one run)."""
    log(f"{sample.label}: {sample.pages} pages, {sample.mb:.1f} MB")
    rag, wx = run_wikirag(sample, 2, work), run_wikiextractor(sample, 2, work)
    if rag.ok and wx.ok:
        res.quality = compare_quality(rag.out_dir, wx.out_dir)
    for r in (rag, wx):
        if not r.ok:
            res.runs.append(r)  # shows up as FAILED


def bench_floors(res: Results, main: Dump, reps: int) -> None:
    """bz2 alone over the dump's streams: the standard library's libbz2, and the Rust port wikirag reads with."""
    rows = [("stdlib bz2 (libbz2), 1 process", 1, False)]
    if rust_bz2_available():
        rows += [("libbz2-rs (cramjam-pure-rust, wikirag's reader), 1 process", 1, True),
                 ("libbz2-rs, streams split in 2 halves, 2 processes", 2, True)]
    else:
        rows += [("stdlib bz2, streams split in 2 halves, 2 processes", 2, False)]
    for k in range(reps):
        log(f"floors, repetition {k + 1}/{reps}")
        for label, procs, rust in rows if k % 2 == 0 else rows[::-1]:
            res.floors.setdefault(label, []).append(bz2_floor(main, procs, rust))


def bench_repetitions(res: Results, dumps: dict[int, Dump], main: Dump, parts: set[str], reps: int, work: Path,
                      keep: bool) -> None:
    """Per repetition: every row of the chosen parts, in turn (reversed every other repetition)."""
    tiny = dumps[TINY_PAGES]
    rows: list[tuple[str, Dump]] = []
    if "peer" in parts:
        rows += [(WIKIRAG_2, tiny), (WIKIRAG_2, main), (WIKIEXTRACTOR, tiny), (WIKIEXTRACTOR, main)]
    if "scaling" in parts:
        rows += [(WIKIRAG_1, tiny), (WIKIRAG_1, main)]
        if "peer" not in parts:
            rows += [(WIKIRAG_2, tiny), (WIKIRAG_2, main)]
    if "memory" in parts:
        rows += [(WIKIRAG_2, dumps[MEMORY_PAGES])]
        if "peer" not in parts and "scaling" not in parts:
            rows += [(WIKIRAG_2, main)]
    for k in range(reps):
        log(f"repetition {k + 1}/{reps}")
        for tool, dump in rows if k % 2 == 0 else rows[::-1]:
            if tool == WIKIEXTRACTOR:
                run = run_wikiextractor(dump, 2, work, k)
            else:
                run = run_wikirag(dump, 1 if tool == WIKIRAG_1 else 2, work, k)
            res.runs.append(run)
            drop_outputs(run, keep)


def code_version() -> str:
    """The commit measured (and whether the tree had changes), so that a table can be traced to its code."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {sha}" + (" with uncommitted changes" if dirty else "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, help="pages of the multistream dump (default 20000; --quick 1000)")
    p.add_argument("--parts", help=f"comma-separated, from {', '.join(PARTS)} (default {','.join(DEFAULT_PARTS)}; "
                                   "--quick: floors,peer,quality)")
    p.add_argument("--repeats", type=int, default=MIN_REPEATS, help=f"repetitions (default and minimum {MIN_REPEATS})")
    p.add_argument("--quick", action="store_true", help="a 1,000-page dump, no memory part (a smoke run)")
    p.add_argument("--sample", type=Path, default=SAMPLE, help="the real single-stream export")
    p.add_argument("--cache", type=Path, default=CACHE, help="where generated dumps are kept (default bench/.cache)")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    p.add_argument("--keep", action="store_true", help="keep the stores, outputs and logs (path printed)")
    args = p.parse_args(argv)
    if args.repeats < MIN_REPEATS:
        p.error(f"--repeats must be at least {MIN_REPEATS}: every figure is a min / median / max")
    args.pages = args.pages or (1_000 if args.quick else 20_000)
    parts = args.parts or ",".join(("floors", "peer", "quality") if args.quick else DEFAULT_PARTS)
    args.parts = {x.strip() for x in parts.split(",") if x.strip()}
    if unknown := args.parts - set(PARTS):
        p.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    info = RunInfo.start(argv and [sys.argv[0], *argv])
    info.notes.append(f"Code: {code_version()}.")
    t0 = time.perf_counter()
    wikirag_command()  # fail early when the CLI is missing
    sizes = [MEMORY_PAGES] if "memory" in args.parts and args.pages > MEMORY_PAGES else []
    dumps = prepare_dumps(args.pages, sizes, args.cache)
    main_dump = dumps[args.pages]
    res = Results()
    work = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    try:
        if "quality" in args.parts:
            bench_quality(res, sample_dump(args.sample), work)
        if "floors" in args.parts:
            bench_floors(res, main_dump, args.repeats)
        bench_repetitions(res, dumps, main_dump, args.parts, args.repeats, work, args.keep)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    info.finish()
    text = render(res, info, main_dump, args.parts, args.repeats, time.perf_counter() - t0)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")
    sys.exit(1 if any(not r.ok for r in res.runs) else 0)


if __name__ == "__main__":
    main()
