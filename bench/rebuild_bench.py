"""A whole index rebuild of the real sample: ``wikirag index-rebuild`` against the obvious script, same run.

The question a new user asks: is wikirag's pipeline (gates, shards, Prefect,
Dask) faster or slower than the script anyone would write first? Both sides
are whole runs from a cold start, each a fresh process (imports, model load,
engines and all), on the same dump, cores and model:

* **wikirag**: ``python -m cli.wikirag index-rebuild SAMPLE --store <fresh>``
  with a fresh ``WIKIRAG_HOME`` and no ``PREFECT_API_URL`` (so it starts its
  own Prefect server and a local Dask cluster of ``--workers`` workers, as
  README's first command does): ingest, gates, embed (dtype ``auto``), FAISS,
  recall gate, publish;
* **the obvious script** (:func:`obvious_script`, run as
  ``python bench/rebuild_bench.py --obvious OUT``): stream the dump's pages
  with ``xml.etree.ElementTree.iterparse``, ``mwparserfromhell``'s
  ``strip_code()`` on every article, 100-word windows, the same
  all-MiniLM-L6-v2 through ``SentenceTransformer.encode`` (its defaults:
  float32, batch 32, normalised), one flat inner-product FAISS index written
  to disk. torch uses every core (its default).

Repeats alternate the order (wikirag first, then the script first, ...); the
ratio is the script's wall time over wikirag's within each repeat, reported
as min / median / max with both sides' times. ``--avx2`` runs everything as
on an AVX2-only CPU (rag_core.perf.cpu.AVX2_EMULATION, inherited by every
child process, Dask workers included).

    python bench/rebuild_bench.py --markdown bench/results/rebuild-native.md        # ~15 min on 2 cores
    python bench/rebuild_bench.py --avx2 --markdown bench/results/rebuild-avx2.md   # ~25 min on 2 cores
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]
from report import RunInfo, emulate_avx2_if_asked, publish, spread  # noqa: E402

SAMPLE = REPO.parent / "shared/data/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
GOAL_RATIO = 2.0  # the obvious script's wall time over wikirag's (median)
WORDS = 100
QUESTION = "Who was the teacher of Alexander the Great?"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the obvious script (runs in its own process) ---------------------------------------------------


def obvious_script(dump: Path, out: Path) -> dict:
    """What one writes first: mwparserfromhell + SentenceTransformer.encode + a flat FAISS index."""
    import xml.etree.ElementTree as ET

    import faiss
    import mwparserfromhell
    from sentence_transformers import SentenceTransformer

    from rag_core.index.encoders import packaged_model_path

    started = time.perf_counter()
    strings = []
    with bz2.open(dump, "rb") as f:
        for _, elem in ET.iterparse(f):
            if not elem.tag.endswith("}page"):
                continue
            ns_tag = elem.tag[: -len("page")]
            title, ns = elem.findtext(f"{ns_tag}title"), elem.findtext(f"{ns_tag}ns")
            text = elem.findtext(f"{ns_tag}revision/{ns_tag}text") or ""
            if ns == "0" and elem.find(f"{ns_tag}redirect") is None:
                words = mwparserfromhell.parse(text).strip_code().split()
                strings += [f"{title}. {' '.join(words[i:i + WORDS])}" for i in range(0, len(words), WORDS)]
            elem.clear()
    parsed = time.perf_counter()
    model = SentenceTransformer(str(packaged_model_path()), device="cpu")
    vectors = model.encode(strings, normalize_embeddings=True, convert_to_numpy=True)
    encoded = time.perf_counter()
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(out / "index.faiss"))
    (out / "passages.json").write_text(json.dumps(strings))
    top = index.search(model.encode([QUESTION], normalize_embeddings=True), 1)[1][0][0]
    return {"passages": len(strings), "parse_s": parsed - started, "encode_s": encoded - parsed,
            "top": strings[top][:60]}


# -- one timed run of each side ------------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    drop = ("PREFECT_API_URL", "WIKIRAG_STORE", "WIKIRAG_DASK_ADDRESS", "WIKIRAG_HOME", "WIKIRAG_WORKERS")
    return {k: v for k, v in os.environ.items() if k not in drop} | {"PYTHONPATH": str(REPO)}


def run_wikirag(dump: Path, work: Path, workers: int) -> tuple[float, dict]:
    env = _clean_env() | {"WIKIRAG_HOME": str(work / "home"), "WIKIRAG_WORKERS": str(workers)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cli.wikirag", "index-rebuild", str(dump)], cwd=REPO, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"wikirag index-rebuild failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    version = proc.stdout.strip().splitlines()[-1]
    manifest = json.loads((work / "home" / "store" / "indexes" / version / "manifest.json").read_text())
    encoder = manifest["encoder"]
    return seconds, {"passages": manifest["count"], "dtype": encoder.get("dtype"), "engine": encoder.get("engine"),
                     "version": version}


def run_obvious(dump: Path, work: Path) -> tuple[float, dict]:
    out = work / "obvious"
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--obvious", str(out), "--sample", str(dump)], cwd=REPO,
                          env=_clean_env(), capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the obvious script failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, json.loads(proc.stdout.strip().splitlines()[-1])


# -- report ------------------------------------------------------------------------------------


def report(info: RunInfo, args: argparse.Namespace, ours: list[tuple[float, dict]],
           theirs: list[tuple[float, dict]]) -> str:
    ratios = [t[0] / o[0] for o, t in zip(ours, theirs)]
    median_ratio = sorted(ratios)[len(ratios) // 2]
    ok = median_ratio >= GOAL_RATIO
    o_meta, t_meta = ours[-1][1], theirs[-1][1]
    lines = [
        "## Index rebuild of the real sample: `wikirag index-rebuild` vs the obvious script",
        "",
        *info.markdown_header(),
        f"Both sides from a cold start in fresh processes, {args.repeats} repeats in alternating order; "
        f"wikirag with a fresh `WIKIRAG_HOME`, its own Prefect server and a {args.workers}-worker Dask cluster; "
        "the script: `iterparse` + `mwparserfromhell.strip_code()` + `SentenceTransformer.encode()` (float32, "
        "batch 32) + `faiss.IndexFlatIP`, torch on every core (method in bench/README.md).",
        "",
        "| side | passages | wall s (min / median / max) | notes |",
        "|---|---:|---:|---|",
        f"| wikirag index-rebuild | {o_meta['passages']:,} | {spread([o[0] for o in ours], '{:.1f}')} "
        f"| encoder dtype {o_meta['dtype']}, engine {o_meta['engine']} (both auto), gates, {args.workers} workers |",
        f"| obvious script | {t_meta['passages']:,} | {spread([t[0] for t in theirs], '{:.1f}')} "
        f"| parse {spread([t[1]['parse_s'] for t in theirs], '{:.1f}')} s, encode "
        f"{spread([t[1]['encode_s'] for t in theirs], '{:.1f}')} s |",
        "",
        "| goal | measured (min / median / max) | verdict |",
        "|---|---:|---|",
        f"| script wall time / wikirag wall time >= {GOAL_RATIO}x (median) | {spread(ratios, '{:.2f}')} "
        f"| {'PASS' if ok else 'FAIL'} |",
        "",
        f"Top passage for \"{QUESTION}\" from the script's index: \"{t_meta['top']}...\".",
        "",
        f"Prefect database template (runtime/process_tuning.py): {args.template_note}. wikirag's local server starts "
        "from it in a fresh home; without one, the first server on a machine migrates its own (bench/process_tuning_bench.py).",
        "",
        f"Cached int8 weights (rag_core/perf/int8_engine.py, `~/.cache/wikirag/int8/`): {args.int8_note}. Where the "
        "int8 engine runs, each Dask worker reads them instead of quantizing at its start.",
        "",
        f"This CPU's int8 probe verdict (rag_core/perf/probes.py, `~/.cache/wikirag/probes.json`): {args.probe_note}. "
        "Each process of a rebuild (the command, each Dask worker) reads it instead of timing the probe (~0.5 s).",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each side, alternating (default 3)")
    p.add_argument("--workers", type=int, default=2, help="wikirag's local Dask workers (default 2: the cores)")
    p.add_argument("--sample", type=Path, default=SAMPLE, help="the dump (default the real sample)")
    p.add_argument("--avx2", action="store_true", help="run as on an AVX2-only CPU (re-runs itself)")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    p.add_argument("--obvious", type=Path, help=argparse.SUPPRESS)  # internal: run the script side into this dir
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.obvious:
        print(json.dumps(obvious_script(args.sample, args.obvious)))
        return
    if not args.sample.exists():
        log(f"skipped: {args.sample} is missing (the real sample lives in ../shared/data); pass --sample PATH")
        return
    from runtime.process_tuning import prefect_template_path
    from rag_core.perf.int8_engine import cache_folder

    args.template_note = ("present at start" if prefect_template_path().is_file()
                          else "none at start (the first run made it)")
    kept = sorted(cache_folder().glob("*.pt"))
    args.int8_note = (f"{len(kept)} file(s) present at start" if kept
                      else "none at start (the first run that ran int8 made them)")
    from rag_core.perf.probes import kept_probe
    from rag_core.perf.int8_engine import PROBE_NAME

    verdict = kept_probe(PROBE_NAME)
    args.probe_note = (f"present at start ({verdict:.2f}x)" if verdict is not None
                       else "none at start (the first run's command timed it)")
    info = RunInfo.start()
    ours, theirs = [], []
    for rep in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="rebuild-bench-") as tmp:
            work = Path(tmp)
            sides = [("wikirag", lambda: run_wikirag(args.sample, work / "w", args.workers)),
                     ("obvious", lambda: run_obvious(args.sample, work / "o"))]
            for name, run in sides if rep % 2 == 0 else sides[::-1]:
                seconds, meta = run()
                (ours if name == "wikirag" else theirs).append((seconds, meta))
                log(f"repeat {rep + 1}/{args.repeats}: {name} {seconds:.1f} s, {meta}")
    info.finish()
    text = report(info, args, ours, theirs)
    publish(text, args.markdown)


if __name__ == "__main__":
    emulate_avx2_if_asked()
    main()
