"""Every stage of the data path as the corpus grows: wall, CPU and peak memory per stage, growth exponents, 21M.

For each size (passages, default 30,000 / 100,000 / 300,000) the benchmark
makes a Wikimedia multistream dump with bench/make_dump.py (the real
sample's pages, byte for byte, with new ids and titles; smaller dumps are
prefixes cut from the largest without recompressing) and runs the real
commands on it, each a fresh process with a fresh ``WIKIRAG_HOME`` and its own
Prefect server and Dask cluster, as a user runs them:

* ``wikirag index-rebuild DUMP --index INDEX --encoder TINY --encoder-dtype float32``:
  ingest (parse + passage gates + publish), embed, embeddings gate, FAISS
  (factory ``auto``), index gate (counts + recall), publish;
* ``wikirag search --questions FILE --json`` (200 questions from ../shared/data/qa);
* ``wikirag indexes gc --older-than 0 --ignore-min-age`` (the whole store listed).

TINY is a random-weight BERT with MiniLM's vocabulary and tokenizer (2 layers,
32 wide, 32 positions): the same Encoder code path as all-MiniLM-L6-v2, so
orchestration, parsing, I/O and FAISS dominate. The real encoder's cost per
passage (and TINY's) is measured apart on the same passages in one process;
the 21M projection adds the difference. TINY's vectors are 32-d, so FAISS and
vector storage are measured at 32-d and the projection scales them by 384/32
(flat and HNSW cost and bytes are linear in d).

Stages come from the command's own log lines (Prefect's task-run timestamps);
CPU time and RSS from sampling the command's process tree every 0.25 s
(psutil): CPU is the tree's CPU seconds within the stage's window, peak RSS
the largest process of each role (main, Prefect server, Dask worker) within
it. The growth exponent is the least-squares slope of log(wall) on
log(passages) over the sizes; a stage above 1.1 is flagged.

    nice -n 5 python bench/scale_bench.py --work /work/helpers/h-scale/bench --markdown bench/results/scale.md
    python bench/scale_bench.py --work DIR --report-only --markdown bench/results/scale.md   # from saved runs

Each size's run is saved as DIR/run-<passages>.json; ``--report-only`` writes the
table from those.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]
from make_dump import cut_dump, dump_paths, make_dump  # noqa: E402
from report import RunInfo, publish  # noqa: E402

QA = REPO.parent / "shared/data/qa/nq_open/NQ-open.dev.jsonl"
PASSAGES_PER_PAGE = 21.4  # the sample's pages (redirects included) yield 4,391 passages from 206 pages
TARGET = 21_000_000
REAL_DIM, TINY_DIM = 384, 32
EXPONENT_FLAG = 1.1
STAGES = ("start-up", "ingest", "passage gates", "embed", "embeddings gate", "index", "index gate", "publish",
          "search", "gc")
_LOG_TIME = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}) \| INFO\s+\| (.*)$")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- inputs ---------------------------------------------------------------------------------


def save_tiny_encoder(directory: Path, width: int = TINY_DIM, intermediate: int = 2 * TINY_DIM) -> Path:
    """A random 2-layer BERT (32 wide unless told) with MiniLM's tokenizer files (the packaged model's)."""
    import torch
    from transformers import BertConfig, BertModel

    from rag_core.index.encoders import packaged_model_path

    if (directory / "config.json").exists():
        return directory
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=width, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=intermediate, max_position_embeddings=32)
    directory.mkdir(parents=True, exist_ok=True)
    BertModel(config).eval().save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(packaged_model_path() / name, directory / name)
    return directory


def pages_for(passages: int) -> int:
    return max(100, math.ceil(passages / PASSAGES_PER_PAGE / 100) * 100)


def make_dumps(sizes: list[int], work: Path) -> dict[int, tuple[Path, Path]]:
    """One dump per size: the largest made once, the others cut from it (same first pages)."""
    largest = max(sizes)
    big, big_index = dump_paths(work / "dumps", f"enwiki-scale{pages_for(largest)}")
    if not big.exists():
        log(f"making a {pages_for(largest):,}-page dump")
        make_dump(pages_for(largest), work / "dumps", name=big.name.split("-pages")[0], jobs=2)
    dumps = {}
    for n in sizes:
        if n == largest:
            dumps[n] = (big, big_index)
            continue
        name = f"enwiki-scale{pages_for(n)}"
        dump, index = dump_paths(work / "dumps", name)
        if not dump.exists():
            cut_dump(big, big_index, pages_for(n), work / "dumps", name)
        dumps[n] = (dump, index)
    return dumps


def question_file(work: Path, n: int = 200) -> Path:
    path = work / "questions.txt"
    if not path.exists():
        with QA.open() as f:
            path.write_text("".join(json.loads(line)["question"] + "\n" for _, line in zip(range(n), f)))
    return path


# -- one command, watched -------------------------------------------------------------------


def _role(proc) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except Exception:  # noqa: BLE001 - the process ended between listing and reading
        return "other"
    if "prefect" in cmd and "server" in cmd:
        return "prefect server"
    if "multiprocessing" in cmd or "dask" in cmd or "spawn_main" in cmd:
        return "dask worker"
    return "other"


def watched(argv: list[str], env: dict[str, str], log_file: Path) -> dict:
    """Run ``argv`` and sample its process tree; returns wall, samples [(t, cpu_s, {role: max rss})], exit code."""
    import psutil

    started = time.time()
    with log_file.open("w") as err:
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
    root = psutil.Process(proc.pid)
    samples, finished_cpu, stop = [], {}, threading.Event()

    def sample() -> None:
        while not stop.is_set():
            cpu, rss = 0.0, {}
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    with p.oneshot():
                        t = p.cpu_times()  # its own threads only: a reaped child's time is counted as its own
                        finished_cpu[p.pid] = t.user + t.system
                        role = "main" if p.pid == root.pid else _role(p)
                        rss[role] = max(rss.get(role, 0), p.memory_info().rss)
                except psutil.NoSuchProcess:
                    pass
            cpu = sum(finished_cpu.values())  # ended processes keep their last reading
            samples.append((time.time(), cpu, rss))
            stop.wait(0.25)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, _ = proc.communicate()
    stop.set()
    thread.join()
    return {"argv": argv, "started": started, "ended": time.time(), "rc": proc.returncode, "stdout": out,
            "samples": samples}


def _log_events(log_file: Path, day: dt.date) -> list[tuple[float, str]]:
    events = []
    for line in log_file.read_text(errors="replace").splitlines():
        if m := _LOG_TIME.match(line):
            t = dt.datetime.combine(day, dt.time.fromisoformat(m[1])).astimezone()
            events.append((t.timestamp(), m[2]))
    return events


def rebuild_stages(run: dict, log_file: Path) -> dict[str, tuple[float, float]]:
    """Stage windows of an index-rebuild from its log: {stage: (start, end)} in epoch seconds."""
    events = _log_events(log_file, dt.date.fromtimestamp(run["started"]))

    def last(pattern: str) -> float:
        hits = [t for t, msg in events if re.search(pattern, msg)]
        if not hits:
            raise SystemExit(f"{log_file}: no log line matches {pattern!r}; the run failed or its logging changed")
        return hits[-1]

    def first(pattern: str) -> float:
        return min(t for t, msg in events if re.search(pattern, msg))

    marks = [run["started"], first(r"Beginning subflow run"), last(r"Task run 'ingest_shard-.*Finished"),
             last(r"Task run 'summarize_ingest"),
             last(r"Task run 'embed_passages-.*Finished"), first(r"Task run 'enforce_index_gate-.*Finished"),
             last(r"Task run 'build_index_shard-.*Finished"), last(r"Task run 'enforce_index_gate-.*Finished"),
             run["ended"]]
    names = ("start-up", "ingest", "passage gates", "embed", "embeddings gate", "index", "index gate", "publish")
    return {name: (a, b) for name, a, b in zip(names, marks, marks[1:])}


def stage_figures(run: dict, window: tuple[float, float]) -> dict:
    """Wall, tree CPU seconds and per-role peak RSS (MB) of one stage window."""
    a, b = window
    inside = [s for s in run["samples"] if a - 0.25 <= s[0] <= b + 0.25] or run["samples"][-1:]
    before = [s for s in run["samples"] if s[0] <= a] or run["samples"][:1]
    after = [s for s in run["samples"] if s[0] <= b] or run["samples"][-1:]
    peaks: dict[str, float] = {}
    for _, _, rss in inside:
        for role, value in rss.items():
            peaks[role] = max(peaks.get(role, 0.0), value / 2**20)
    return {"wall": b - a, "cpu": max(0.0, after[-1][1] - before[-1][1]), "rss": peaks}


def run_size(n: int, dump: Path, index: Path, encoder: Path, questions: Path, work: Path, workers: int) -> dict:
    """The three commands on one dump; figures per stage."""
    home = work / f"home-{n}"
    shutil.rmtree(home, ignore_errors=True)
    store = home / "store"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"WIKIRAG_HOME": str(home)}
    wikirag = [sys.executable, "-m", "cli.wikirag"]
    home.mkdir(parents=True)
    started, load_before = dt.datetime.now(dt.timezone.utc), os.getloadavg()
    log(f"{n:,} passages: index-rebuild")
    rebuild = watched([*wikirag, "index-rebuild", str(dump), "--index", str(index), "--store", str(store),
                       "--encoder", str(encoder), "--encoder-dtype", "float32", "--workers", str(workers)],
                      env, home / "rebuild.log")
    if rebuild["rc"] != 0:
        raise SystemExit(f"index-rebuild of {dump} failed ({rebuild['rc']}); see {home / 'rebuild.log'}")
    stages = {name: stage_figures(rebuild, w) for name, w in rebuild_stages(rebuild, home / "rebuild.log").items()}
    log(f"{n:,} passages: search, gc")
    search = watched([*wikirag, "search", "--store", str(store), "--questions", str(questions), "--json"],
                     env, home / "search.log")
    gc = watched([*wikirag, "indexes", "gc", "--store", str(store), "--older-than", "0", "--ignore-min-age"],
                 env, home / "gc.log")
    for name, run in (("search", search), ("gc", gc)):
        if run["rc"] != 0:
            raise SystemExit(f"{name} on {store} failed ({run['rc']}); see {home / (name + '.log')}")
        stages[name] = stage_figures(run, (run["started"], run["ended"]))
    manifest = json.loads(next((store / "passages").glob("*/manifest.json")).read_text())
    version = rebuild["stdout"].strip().splitlines()[-1]
    index = json.loads((store / "indexes" / version / "manifest.json").read_text())
    store_bytes = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in store.iterdir()}
    return {"target": n, "passages": manifest["counts"]["passages"], "pages": pages_for(n),
            "dump_bytes": dump.stat().st_size, "version": version, "stages": stages, "store_bytes": store_bytes,
            "index": {"factory": index["factory"], "shards": len(index["shards"])},
            "workers": workers, "cpu": "own threads", "started": started.strftime("%Y-%m-%d %H:%M UTC"),
            "load": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}


# -- the real encoder's cost, apart -----------------------------------------------------------


def encoder_rates(store: Path, tiny: Path, n: int = 1000) -> dict[str, float]:
    """Passages per CPU second and per wall second of the real encoder (dtype auto) and TINY (float32)."""
    import pyarrow.parquet as pq

    from rag_core.index.encoders import Encoder, EncoderConfig

    import torch

    torch.set_num_threads(1)  # as in a Dask worker of one core; idle threads would spin and count as CPU
    part = sorted((store / "passages").glob("*/part-*.parquet"))[0]
    table = pq.read_table(part, columns=["title", "text"]).slice(0, n)
    titles, texts = table.column("title").to_pylist(), table.column("text").to_pylist()
    rates = {}
    for name, config in (("real", EncoderConfig()), ("tiny", EncoderConfig(path=str(tiny), dtype="float32"))):
        encoder = Encoder.load(config)
        encoder.encode_passages(titles[:32], texts[:32])
        t0, c0 = time.perf_counter(), time.process_time()
        encoder.encode_passages(titles, texts)
        rates[f"{name}_per_cpu_s"] = len(texts) / (time.process_time() - c0)
        rates[f"{name}_per_wall_s"] = len(texts) / (time.perf_counter() - t0)
    return rates


# -- fit, projection, report --------------------------------------------------------------------


def exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x); None with fewer than two sizes or a zero figure."""
    if len(xs) < 2 or not min(ys) > 0:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def project(ns: list[int], ys: list[float], target: int) -> float:
    """The larger of the power law through the fit and the marginal (linear) cost of the two largest sizes."""
    b = exponent(ns, ys)
    power = ys[-1] * (target / ns[-1]) ** b if b is not None else ys[-1] * target / ns[-1]
    slope = (ys[-1] - ys[-2]) / (ns[-1] - ns[-2]) if len(ns) >= 2 else ys[-1] / ns[-1]
    return max(power, ys[-1] + max(slope, 0.0) * (target - ns[-1]))


def _provenance(runs: list[dict]) -> list[str]:
    """When each size ran and the 1-minute load before and after it (a --report-only header has its own)."""
    known = [r for r in runs if "started" in r]
    if not known:
        return []
    return ["Runs: " + "; ".join(f"{r['passages']:,} passages at {r['started']}, load {r['load'][0]:.2f} before and "
                                 f"{r['load'][1]:.2f} after" for r in known) + ".", ""]


def _peak(stage: dict, role: str) -> float:
    return stage["rss"].get(role, 0.0)


def report(info: RunInfo, runs: list[dict], rates: dict[str, float], plans: list[dict]) -> str:
    runs = sorted(runs, key=lambda r: r["passages"])
    ns = [r["passages"] for r in runs]
    workers = runs[-1]["workers"]
    page_counts = ", ".join(f"{r['pages']:,}" for r in runs)
    lines = ["## Scale: every stage of the data path from "
             f"{ns[0]:,} to {ns[-1]:,} passages, projected to {TARGET / 1e6:g}M", "", *info.markdown_header()]
    lines += [
        f"Dumps made by bench/make_dump.py from the real sample's pages ({page_counts} "
        f"pages); each size a fresh `WIKIRAG_HOME` (own Prefect server, local Dask cluster of {workers} workers). "
        f"Encoder: a random 2-layer, {TINY_DIM}-wide BERT with MiniLM's tokenizer, float32 (the same code path); "
        "FAISS factory `auto`. Wall and CPU seconds per stage; CPU is the whole process tree's. Peak RSS in MB of "
        "the largest process of each role within the stage: main / Prefect server / Dask worker. Other jobs on the "
        "machine show in the load average above.", "",
        *_provenance(runs),
        "| stage | " + " | ".join(f"{n:,}: wall s / CPU s / peak RSS main, server, worker" for n in ns)
        + " | exponent (wall) | exponent (CPU) | flag |",
        "|---|" + "---:|" * len(ns) + "---:|---:|---|"]
    exponents = {}
    for stage in STAGES:
        figs = [r["stages"][stage] for r in runs]
        cells = [f"{f['wall']:.1f} / {f['cpu']:.1f} / {_peak(f, 'main'):,.0f}, {_peak(f, 'prefect server'):,.0f}, "
                 f"{_peak(f, 'dask worker'):,.0f}" for f in figs]
        if stage == "publish" and any(r.get("cpu") != "own threads" for r in runs):
            for f in figs:  # the workers' CPU counted twice as they exited: see the note below the table
                f["cpu"] = math.nan
        bw, bc = exponent(ns, [f["wall"] for f in figs]), exponent(ns, [f["cpu"] for f in figs])
        exponents[stage] = bw
        flag = "**above 1.1**" if (bw or 0) > EXPONENT_FLAG or (bc or 0) > EXPONENT_FLAG else ""
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {_fmt(bw)} | {_fmt(bc)} | {flag} |")
    totals = [sum(r["stages"][s]["wall"] for s in STAGES) for r in runs]
    lines.append("| **all** | " + " | ".join(f"{t:.0f}" for t in totals) + f" | {_fmt(exponent(ns, totals))} | | |")
    if any(r.get("cpu") != "own threads" for r in runs):
        lines += ["", "Publish CPU is left out (nan): these runs' sampler added each process's reaped children's CPU "
                  "to it, so the Dask workers' CPU was counted again when they exited at the end of the rebuild."]
    worker_peaks = [max(_peak(f, "dask worker") for f in r["stages"].values()) for r in runs]
    base = next((i for i, r in enumerate(runs) if r["target"] >= 100_000), 0)  # the goal's baseline: 100,000
    lines += ["", f"Peak RSS of one Dask worker over the whole rebuild: "
              + ", ".join(f"{p:,.0f} MB at {n:,}" for p, n in zip(worker_peaks, ns))
              + f" ({worker_peaks[-1] / worker_peaks[base]:.2f}x from {ns[base]:,} to {ns[-1]:,}; goal: within 1.2x). "
              "A worker holds one shard at a time, and shards hold at most EmbedConfig.passages_per_shard "
              "(20,000) passages: below 80,000 passages (4 shards at least) they are smaller, so is the peak."]
    lines += ["", "Store bytes per passage at the largest size: " + ", ".join(
        f"{k} {v / ns[-1]:,.0f}" for k, v in sorted(runs[-1]["store_bytes"].items()) if v)]
    lines += _projection(runs, ns, rates, workers)
    if plans:
        lines += _planner_rows(runs, plans)
    return "\n".join(lines) + "\n"


# The planner's stages and the measured stages each one predicts.
PLANNED_STAGES = {"ingest": ("ingest", "passage gates"), "embed": ("embed", "embeddings gate"),
                  "index": ("index", "index gate")}


def _planner_rows(runs: list[dict], plans: list[dict]) -> list[str]:
    """Predicted against measured: passages, store bytes, and CPU seconds of the stages that scale."""
    lines = ["", "### The planner (`wikirag plan`) against these runs", "",
             "`rag_core.capacity` predicted each dump from its multistream index and a calibration on 8 of its "
             "streams (the same tiny encoder, one torch thread). Its per-stage overhead constants (STAGE_OVERHEAD, "
             "STAGE_FIXED_CPU_S in rag_core/capacity/plan.py) were fitted on runs of 30,000 and 100,000 "
             "passages; larger sizes are held-out checks. Planned: the factory and shards the plan predicts (auto "
             "decides on the calibration's vectors, as the rebuild does on its own); built: the published "
             "version's. Error = predicted / "
             "measured - 1. Stage cost is compared in CPU seconds (predicted hours x workers x 3600 against the "
             "process tree's CPU seconds in that stage): on a machine shared with other jobs, wall time measures them "
             "as much as the rebuild.", "",
             "| passages | passages: measured / predicted / error | store GB: measured / predicted / error | "
             + " | ".join(f"{s} CPU s: measured / predicted / error" for s in PLANNED_STAGES)
             + " | factory, shards: planned / built |", "|---:|---:|---:|" + "---:|" * len(PLANNED_STAGES) + "---|"]
    for run, plan in zip(runs, plans):
        store_gb = sum(run["store_bytes"].values()) / 1e9
        cells = [f"{run['passages']:,} / {plan['passages']:,} / {plan['passages'] / run['passages'] - 1:+.0%}",
                 f"{store_gb:.3f} / {plan['store_gb']:.3f} / {plan['store_gb'] / store_gb - 1:+.0%}"]
        for stage, measured_stages in PLANNED_STAGES.items():
            measured = sum(run["stages"][s]["cpu"] for s in measured_stages)
            predicted = plan["hours"][stage] * 3600 * plan["workers"]
            cells.append(f"{measured:,.0f} / {predicted:,.0f} / {predicted / measured - 1:+.0%}")
        built = run.get("index") or {}
        made = f"{built['factory']}, {built['shards']}" if built else "-"
        lines.append(f"| {run['target']:,} | " + " | ".join(cells) + f" | {plan['factory']}, {plan['shards']} / {made} |")
    return lines


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _projection(runs: list[dict], ns: list[int], rates: dict[str, float], workers: int) -> list[str]:
    cores = os.cpu_count() or 1
    parallel = max(1, min(workers, cores))
    encoder_extra = TARGET * (1 / rates["real_per_cpu_s"] - 1 / rates["tiny_per_cpu_s"]) / parallel
    lines = ["", f"### Projection to {TARGET / 1e6:g}M passages (a projection, not a measurement)", "",
             f"Each stage: the larger of its fitted power law and the marginal cost between the two largest sizes, "
             f"taken to {TARGET:,}. Embed adds the real encoder's extra cost: all-MiniLM-L6-v2 (dtype auto) encodes "
             f"{rates['real_per_cpu_s']:.0f} passages per CPU second against the tiny encoder's "
             f"{rates['tiny_per_cpu_s']:.0f} (measured apart, 1,000 passages, one process, one torch thread), over {parallel} "
             f"parallel workers: +{encoder_extra / 3600:,.1f} h. Index is scaled by {REAL_DIM}/{TINY_DIM} (the real "
             f"vectors' width; flat and graph builds are linear in it). Same machine, {workers} workers.", "",
             "Wall is projected from wall as measured here (with whatever else ran: see the load average); CPU from the process "
             f"tree's CPU seconds, and CPU / {parallel} is the wall time the same work takes on {parallel} free cores.",
             "", f"| stage | projected wall h at 21M | projected CPU h | CPU h / {parallel} |", "|---|---:|---:|---:|"]
    totals = [0.0, 0.0]
    for stage in STAGES:
        figures = []
        for key in ("wall", "cpu"):
            ys = [r["stages"][stage][key] for r in runs]
            h = math.nan if any(math.isnan(y) for y in ys) else project(ns, ys, TARGET) / 3600
            if stage == "embed":
                h += encoder_extra * (1 if key == "wall" else parallel) / 3600
            if stage == "index":
                h *= REAL_DIM / TINY_DIM
            figures.append(h)
        totals = [t + (0.0 if math.isnan(h) else h) for t, h in zip(totals, figures)]
        wall, cpu = figures
        lines.append(f"| {stage} | {wall:,.1f} | {cpu:,.1f} | {cpu / parallel:,.1f} |")
    lines.append(f"| **all** | **{totals[0]:,.1f}** | **{totals[1]:,.1f}** | **{totals[1] / parallel:,.1f}** |")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="30000,100000,300000", help="passages per run, comma-separated")
    p.add_argument("--work", type=Path, required=True, help="scratch folder (dumps, stores; outside the repository)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--report-only", action="store_true", help="the table from the runs saved in --work")
    p.add_argument("--no-plan", action="store_true", help="skip the planner comparison")
    p.add_argument("--markdown", type=Path, help="also write the section here (bench/results/scale.md)")
    args = p.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    info = RunInfo.start()
    tiny = save_tiny_encoder(work / "tiny-encoder")
    dumps = make_dumps(sizes, work)
    for n in sizes:
        saved = work / f"run-{n}.json"
        if not args.report_only and not saved.exists():
            saved.write_text(json.dumps(run_size(n, *dumps[n], tiny, question_file(work), work, args.workers)))
    runs = [json.loads((work / f"run-{n}.json").read_text()) for n in sizes if (work / f"run-{n}.json").exists()]
    if not runs:
        raise SystemExit(f"{work}: no saved runs; run without --report-only first")
    rates_file = work / "encoder-rates.json"
    if not rates_file.exists():
        rates_file.write_text(json.dumps(encoder_rates(work / f"home-{runs[0]['target']}" / "store", tiny)))
    rates = json.loads(rates_file.read_text())
    plans = [] if args.no_plan else [planned(*dumps[r["target"]], tiny, work, r["workers"]) for r in runs]
    info.finish()
    publish(report(info, runs, rates, plans), args.markdown)


def planned(dump: Path, index: Path, tiny: Path, work: Path, workers: int) -> dict:
    """The planner's prediction for one dump (its calibration cached beside the runs: it takes minutes here)."""
    from rag_core.capacity.plan import Budget, Rates, predict

    cached = work / f"calibration-{dump.name}.json"
    if not cached.exists():
        from rag_core.capacity.dump_plan import plan_rebuild
        from rag_core.index.encoders import EncoderConfig

        plan = plan_rebuild(str(dump), str(index), Budget(workers=workers),
                            EncoderConfig(path=str(tiny), dtype="float32"))
        cached.write_text(json.dumps(plan.summary()))
    saved = json.loads(cached.read_text())  # the model's constants may change: predict again from the rates
    return predict(saved["dump"], saved["pages"], saved["dump_bytes"], Rates(**saved["rates"]), Budget(workers=workers),
                   stream_bytes=saved["stream_bytes"]).summary()


if __name__ == "__main__":
    main()
