"""The ingest stage side by side: bz2 alone, wikirag (1 and 2 Dask workers), wikiextractor.

One run, same inputs, same cores:

* the floor: bz2 decompression alone (one core; and two cores over the
  multistream dump's streams, the most two ingest workers could reach);
* ``wikirag ingest`` with 1 and 2 workers, run as a subprocess exactly as a
  user runs it (fresh ``WIKIRAG_HOME`` and store per run);
* wikiextractor 3.1.0 with ``--processes 2``, its defaults otherwise.

Every subprocess is timed (wall clock) and its peak memory is the largest sum
of RSS over the process and all its descendants, sampled every 0.1 s (summed
RSS counts pages shared between forked processes more than once, so it is an
upper bound).  wikirag's wall time includes a fixed start-up (local Prefect
server, Dask cluster); each tool is therefore also run on a 200-page dump and
the *steady-state* rate is the marginal one: (N - 200) / (t_N - t_200).

Inputs: (a) the real 206-page sample (one bz2 stream, no index), also used to
compare text quality; (b) a multistream dump with index, made by
``bench/make_dump.py`` from the sample's pages and cached in ``bench/.cache/``;
(c) with ``--sizes``, wikirag (2 workers) on dumps of other sizes, to show
whether peak memory depends on the dump's size.  wikirag's log timestamps
also split its wall time into phases (server, setup, parse, gates/publish) and
give the parse phase's own rate and peak memory.

    python bench/ingest_bench.py --quick                 # smoke test: 1,000 pages, no memory run (~3-5 min)
    python bench/ingest_bench.py --markdown out.md       # 20,000 pages + memory at 5,000 (~11-13 min on 2 cores)
"""

from __future__ import annotations

import argparse
import bz2
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_dump import PAGES_PER_STREAM, SAMPLE, check_dump, cut_dump, dump_paths, make_dump  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(__file__).resolve().parent / ".cache"
TINY_PAGES = 200
MARKERS = ("{{", "}}", "[[", "]]", "<ref", "{|", "|}", "&amp;", "&nbsp;", "<!--")
GOAL_VS_PEER = 2.0  # wikirag (2 workers) pages/s over wikiextractor's
GOAL_SCALING = 1.7  # wikirag 2 workers over 1 worker, multistream dump
GOAL_MEMORY = 1.25  # peak RSS at the largest size over the smallest: "roughly independent"
# Removed from the children's environment so that every run starts its own services.
ISOLATE = (
    "PREFECT_API_URL", "PREFECT_HOME", "WIKIRAG_HOME", "WIKIRAG_STORE", "WIKIRAG_DASK_ADDRESS", "WIKIRAG_WORKERS",
)
QUIET = {"DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "AWS_EC2_METADATA_DISABLED": "true"}


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
    wall_s: float
    peak_rss_mb: float
    returncode: int
    output_tail: str = ""
    out_dir: Path | None = None  # the store (wikirag) or output folder (wikiextractor)
    steady_pages_s: float | None = None  # marginal rate over the 200-page run
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
        """Pages over the parse phase alone (wikirag, from its log)."""
        secs = self.phases.get("parse")
        return self.dump.pages / secs if secs else None


@dataclass
class Results:
    """Everything measured in one run of the benchmark, for the report."""

    floors: list[tuple[str, Dump, float, int]] = field(default_factory=list)  # (label, dump, seconds, cores)
    runs: list[Run] = field(default_factory=list)
    memory: list[Run] = field(default_factory=list)
    quality: list[dict] = field(default_factory=list)


# -- inputs ---------------------------------------------------------------------------------


def prepare_dumps(main_pages: int, sizes: list[int], cache: Path, seed: int = 0) -> dict[int, Dump]:
    """Multistream dumps of each size, cut from one generated dump of the largest size (cached)."""
    cache.mkdir(parents=True, exist_ok=True)
    wanted = sorted({TINY_PAGES, main_pages, *sizes})
    for n in wanted:
        if n % PAGES_PER_STREAM:
            raise SystemExit(f"dump sizes must be multiples of {PAGES_PER_STREAM}; got {n}")
    largest = wanted[-1]
    dumps = {}
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


def bz2_floor(dump: Dump) -> float:
    """Seconds to decompress the whole file with the ``bz2`` module on one core."""
    t0 = time.perf_counter()
    with bz2.open(dump.path, "rb") as f:
        while f.read(8 << 20):
            pass
    return time.perf_counter() - t0


def _decompress_range(path: str, start: int, end: int) -> int:
    """Decompress the bz2 streams in bytes [start, end) of a file; returns decompressed bytes."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    total = 0
    while data:
        d = bz2.BZ2Decompressor()
        total += len(d.decompress(data))
        data = d.unused_data
    return total


def bz2_floor_parallel(dump: Dump, procs: int) -> float:
    """Seconds to decompress a multistream dump's streams split into ``procs`` contiguous byte ranges."""
    lines = bz2.decompress(dump.index.read_bytes()).decode("utf-8").splitlines()
    offsets = sorted({int(line.split(":", 1)[0]) for line in lines})
    size = dump.path.stat().st_size
    cuts = [0] + [offsets[len(offsets) * k // procs] for k in range(1, procs)] + [size]
    with ProcessPoolExecutor(procs) as pool:
        pool.submit(int, 0).result()  # processes up before the clock starts
        t0 = time.perf_counter()
        list(pool.map(_decompress_range, [str(dump.path)] * procs, cuts[:-1], cuts[1:]))
        return time.perf_counter() - t0


def wikirag_command() -> list[str]:
    """``wikirag`` when installed, else the CLI module from the repository."""
    exe = shutil.which("wikirag")
    if exe:
        return [exe]
    if not (REPO / "flows" / "cli.py").exists():
        raise SystemExit(f"no `wikirag` on PATH and no {REPO / 'flows/cli.py'}; run `pip install -e {REPO}`")
    return [sys.executable, "-m", "flows.cli"]


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


def run_wikirag(dump: Dump, workers: int, work: Path) -> Run:
    """``wikirag ingest`` on ``dump`` in a fresh home and store; the store is kept for reading."""
    label = f"wikirag-{workers}w-{dump.pages}-{dump.path.stem[:20]}"
    home, store = work / f"{label}-home", work / f"{label}-store"
    cmd = [*wikirag_command(), "ingest", str(dump.path), "--store", str(store), "--workers", str(workers)]
    if dump.index:
        cmd += ["--index", str(dump.index)]
    log_path = work / f"{label}.log"
    log(f"  wikirag {workers} worker(s), {dump.label} ...")
    m = measure(cmd, child_env(WIKIRAG_HOME=str(home)), REPO, log_path)
    output = log_path.read_text(encoding="utf-8", errors="replace")
    run = Run(f"wikirag, {workers} worker{'s' if workers > 1 else ''}", dump, m.wall_s, m.peak_rss_mb, m.returncode,
              output[-3000:], store, peak_by_role=m.peak_by_role, phases=wikirag_phases(output),
              phase_peak_mb=phase_peaks(output, m.timeline))
    report(run, cmd)
    return run


def run_wikiextractor(dump: Dump, processes: int, work: Path) -> Run:
    """wikiextractor 3.1.0 with ``--processes``; its output folder is kept for reading."""
    label = f"wikiextractor-{dump.pages}-{dump.path.stem[:20]}"
    out = work / f"{label}-out"
    cmd = [sys.executable, "-m", "wikiextractor.WikiExtractor", str(dump.path), "-o", str(out),
           "--processes", str(processes), "-q"]
    log_path = work / f"{label}.log"
    log(f"  wikiextractor --processes {processes}, {dump.label} ...")
    m = measure(cmd, child_env(), work, log_path)
    run = Run(f"wikiextractor, {processes} processes", dump, m.wall_s, m.peak_rss_mb, m.returncode,
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


def with_steady_rate(run: Run, tiny: Run) -> Run:
    """Set the marginal pages/s of ``run`` over the same tool's 200-page run."""
    if run.ok and tiny.ok and run.wall_s > tiny.wall_s and run.dump.pages > tiny.dump.pages:
        run.steady_pages_s = (run.dump.pages - tiny.dump.pages) / (run.wall_s - tiny.wall_s)
    return run


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
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
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


def speed_table(res: Results) -> list[str]:
    """Every floor and run: time, the three rates, peak memory."""
    lines = [
        "| input | what | pages | MB (bz2) | wall s | pages/s raw | pages/s steady-state | pages/s parse phase "
        "| peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, dump, secs, cores in res.floors:
        lines.append(f"| {dump.label} | {label} ({cores} core{'s' if cores > 1 else ''}) | {dump.pages:,} | "
                     f"{dump.mb:.1f} | {secs:.1f} | {dump.pages / secs:,.0f} | - | - | - |")
    for r in res.runs + res.memory:
        if not r.ok:
            lines.append(f"| {r.dump.label} | {r.tool} | {r.dump.pages:,} | {r.dump.mb:.1f} | "
                         f"FAILED (exit {r.returncode}) | | | | |")
            continue
        lines.append(f"| {r.dump.label} | {r.tool} | {r.dump.pages:,} | {r.dump.mb:.1f} | {r.wall_s:.1f} | "
                     f"{r.pages_s:,.0f} | {fmt(r.steady_pages_s)} | {fmt(r.parse_pages_s)} | {r.peak_rss_mb:,.0f} |")
    return lines


def phase_table(res: Results) -> list[str]:
    """Where wikirag's wall time goes, per run (from its log's timestamps)."""
    runs = [r for r in res.runs + res.memory if r.ok and r.phases]
    if not runs:
        return []
    lines = [
        "| input | what | wall s | Prefect server up | flow + Dask cluster up "
        "| parse (decompress, clean, chunk, stage) "
        "| gates, publish, shutdown | outside the flow (imports, exit) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        ph = r.phases
        known = sum(ph.get(k, 0.0) for k in ("server", "setup", "parse", "finish"))
        lines.append(f"| {r.dump.label} | {r.tool} | {r.wall_s:.1f} | {fmt(ph.get('server'), '.1f')} | "
                     f"{fmt(ph.get('setup'), '.1f')} | {fmt(ph.get('parse'), '.1f')} | "
                     f"{fmt(ph.get('finish'), '.1f')} | "
                     f"{r.wall_s - known:.1f} |")
    return lines


def memory_table(res: Results) -> list[str]:
    """Peak summed RSS split by process role, for the runs on generated dumps."""
    runs = [r for r in res.runs + res.memory if r.ok and r.peak_by_role and r.dump.index is not None
            and r.dump.pages > TINY_PAGES]
    roles = ["main process", "Prefect server", "spawned workers", "other processes"]
    lines = [
        "| input | what | peak RSS MB | " + " | ".join(roles) + " | peak in parse phase | peak in gates/publish |",
        "|---|---|---:|" + "---:|" * (len(roles) + 2),
    ]
    for r in runs:
        cells = []
        for role in roles:
            n, mb = r.peak_by_role.get(role, (0, 0.0))
            cells.append(f"{mb:,.0f}" + (f" ({n})" if n > 1 else "") if n else "-")
        cells += [fmt(r.phase_peak_mb.get("parse")), fmt(r.phase_peak_mb.get("finish"))]
        lines.append(f"| {r.dump.label} | {r.tool} | {r.peak_rss_mb:,.0f} | " + " | ".join(cells) + " |")
    return lines


def find(runs: list[Run], tool_prefix: str, label: str) -> Run | None:
    for r in runs:
        if r.tool.startswith(tool_prefix) and r.dump.label == label and r.ok:
            return r
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def goals(res: Results, main_label: str) -> list[str]:
    """The three goals, on raw, steady-state and parse-phase rates where each applies."""
    rag2 = find(res.runs, "wikirag, 2", main_label)
    rag1 = find(res.runs, "wikirag, 1", main_label)
    wx = find(res.runs, "wikiextractor", main_label)
    lines = [
        "| goal | raw (wall clock) | steady-state (start-up removed) | parse phase only |",
        "|---|---|---|---|",
    ]

    def cell(v: float | None, goal: float) -> str:
        return f"{fmt(v, '.2f')}x {verdict(None if v is None else v >= goal)}"

    def rate(r: Run | None, attr: str) -> float | None:
        return getattr(r, attr) if r else None

    lines.append(
        f"| wikirag 2 workers / wikiextractor, {main_label} (>= {GOAL_VS_PEER}x) "
        f"| {cell(ratio(rate(rag2, 'pages_s'), rate(wx, 'pages_s')), GOAL_VS_PEER)} "
        f"| {cell(ratio(rate(rag2, 'steady_pages_s'), rate(wx, 'steady_pages_s')), GOAL_VS_PEER)} "
        f"| {cell(ratio(rate(rag2, 'parse_pages_s'), rate(wx, 'steady_pages_s')), GOAL_VS_PEER)} |"
    )
    lines.append(
        f"| wikirag 2 workers / 1 worker, {main_label} (>= {GOAL_SCALING}x) "
        f"| {cell(ratio(rate(rag2, 'pages_s'), rate(rag1, 'pages_s')), GOAL_SCALING)} "
        f"| {cell(ratio(rate(rag2, 'steady_pages_s'), rate(rag1, 'steady_pages_s')), GOAL_SCALING)} "
        f"| {cell(ratio(rate(rag2, 'parse_pages_s'), rate(rag1, 'parse_pages_s')), GOAL_SCALING)} |"
    )
    mem = sorted({r.dump.pages: r for r in res.memory + ([rag2] if rag2 else []) if r.ok}.values(),
                 key=lambda r: r.dump.pages)
    if len(mem) >= 2:
        growth = mem[-1].peak_rss_mb / mem[0].peak_rss_mb
        sizes = ", ".join(f"{r.dump.pages:,} pages {r.peak_rss_mb:,.0f} MB" for r in mem)
        lines.append(f"| peak RSS, largest / smallest dump, 2 workers (<= {GOAL_MEMORY}x; {sizes}) "
                     f"| {growth:.2f}x {verdict(growth <= GOAL_MEMORY)} | | {parse_growth(mem[0], mem[-1])} |")
    return lines


def parse_growth(small: Run, large: Run) -> str:
    """Growth of the parse phase's peak RSS from the smallest to the largest dump, with its verdict."""
    a, b = small.phase_peak_mb.get("parse"), large.phase_peak_mb.get("parse")
    if not a or not b:
        return "n/a"
    return f"{b / a:.2f}x {verdict(b / a <= GOAL_MEMORY)} ({a:,.0f} -> {b:,.0f} MB)"


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
                 "HTML-escaped by default and is unescaped once before counting.")
    return lines


def render(res: Results, main_label: str, started: str, took: float) -> str:
    """The markdown section for docs/benchmarks.md."""
    cpu = f"{psutil.cpu_count(logical=True)} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    out = [
        "## Ingest: wikirag vs wikiextractor vs bz2 alone",
        "",
        f"`python bench/ingest_bench.py` on {started} ({cpu}, Python {sys.version.split()[0]}); "
        f"the benchmark took {took / 60:.1f} min. wikiextractor 3.1.0 with `--processes 2` and its defaults "
        "(including its template pre-pass). \"pages\" are all pages of the dump, articles and redirects "
        "alike. Raw pages/s is N / wall time. Steady-state pages/s is marginal, "
        f"(N - {TINY_PAGES}) / (t_N - t_{TINY_PAGES}) against the same tool on a {TINY_PAGES}-page dump, "
        "which removes fixed start-up. Parse phase (wikirag only) is N over the time from the Dask cluster "
        "being up to the last parsing task done, read from wikirag's log. Peak RSS is summed over the "
        "command's whole process tree (Prefect server and Dask workers included), sampled every 0.1 s; "
        "pages shared between processes count more than once.",
        "",
        *speed_table(res),
        "",
        *goals(res, main_label),
    ]
    startup = [r for r in res.runs if r.dump.pages == TINY_PAGES and r.ok]
    if startup:
        out += ["", f"Start-up (wall time on the {TINY_PAGES}-page dump): "
                + ", ".join(f"{r.tool} {r.wall_s:.1f} s" for r in startup) + "."]
    if phases := phase_table(res):
        out += ["", "### Where wikirag's time goes (seconds)", "", *phases]
    if memory := memory_table(res):
        out += ["", "### Peak memory by process (MB; process count in brackets)", "", *memory]
    if res.quality:
        out += ["", "### Text quality on the real sample (206 pages)", "", *quality_table(res.quality)]
    return "\n".join(out) + "\n"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the run --------------------------------------------------------------------------------


def bench_sample(res: Results, sample: Dump, work: Path) -> None:
    """Speed and text quality on the real single-stream sample."""
    log(f"{sample.label}: {sample.pages} pages, {sample.mb:.1f} MB")
    res.floors.append(("bz2 decompression", sample, bz2_floor(sample), 1))
    rag = run_wikirag(sample, 2, work)
    wx = run_wikiextractor(sample, 2, work)
    res.runs += [rag, wx]
    if rag.ok and wx.ok:
        res.quality = compare_quality(rag.out_dir, wx.out_dir)


def bench_multistream(res: Results, main: Dump, tiny: Dump, work: Path) -> None:
    """Floors, wikirag 1 and 2 workers, wikiextractor, each also on the 200-page dump for start-up."""
    log(f"{main.label}: {main.mb:.1f} MB")
    res.floors.append(("bz2 decompression", main, bz2_floor(main), 1))
    res.floors.append(("bz2 decompression, streams split", main, bz2_floor_parallel(main, 2), 2))
    for workers in (1, 2):
        t = run_wikirag(tiny, workers, work)
        res.runs += [t, with_steady_rate(run_wikirag(main, workers, work), t)]
    t = run_wikiextractor(tiny, 2, work)
    res.runs += [t, with_steady_rate(run_wikiextractor(main, 2, work), t)]


def bench_memory(res: Results, dumps: list[Dump], work: Path) -> None:
    """wikirag (2 workers) at each size, for peak memory against dump size."""
    for dump in dumps:
        res.memory.append(run_wikirag(dump, 2, work))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, help="pages of the multistream dump (default 20000; --quick 1000)")
    p.add_argument("--sizes", default="5000,20000",
                   help="dump sizes for the memory run (2 workers), comma-separated; a size equal to --pages "
                        "reuses that run; '' skips (default 5000,20000)")
    p.add_argument("--quick", action="store_true", help="a 1,000-page dump and no memory run (smoke test)")
    p.add_argument("--sample", type=Path, default=SAMPLE, help="the real single-stream export")
    p.add_argument("--cache", type=Path, default=CACHE, help="where generated dumps are kept (default bench/.cache)")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    p.add_argument("--keep", action="store_true", help="keep the stores, outputs and logs (path printed)")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = ""
    args.pages = args.pages or (1_000 if args.quick else 20_000)
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started, t0 = time.strftime("%Y-%m-%d"), time.perf_counter()
    wikirag_command()  # fail early when the CLI is missing
    dumps = prepare_dumps(args.pages, args.sizes, args.cache)
    main_dump, tiny = dumps[args.pages], dumps[TINY_PAGES]
    res = Results()
    work = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    try:
        bench_sample(res, sample_dump(args.sample), work)
        bench_multistream(res, main_dump, tiny, work)
        bench_memory(res, [dumps[n] for n in args.sizes if n != args.pages], work)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    text = render(res, main_dump.label, started, time.perf_counter() - t0)
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    failed = [r for r in res.runs + res.memory if not r.ok]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
