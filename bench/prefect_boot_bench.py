"""A command's local Prefect server: boot on a fresh database against boot from the database template.

Each repeat starts ``prefect server start`` (through ``runtime.prefect_server``, as
every command without ``PREFECT_API_URL`` does) in a fresh ``PREFECT_HOME``
twice, in alternating order: once with an empty cache (Prefect migrates a new
SQLite database, and the template is written), once with the template in the
cache (the database is a copy of it). Reported: seconds from the start to the
first healthy answer, min / median / max, and their ratio within each repeat.

    python bench/prefect_boot_bench.py --markdown bench/results/prefect-boot.md   # ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from report import RunInfo, publish, spread  # noqa: E402

from runtime.prefect_server import _free_port, _launch, template_path  # noqa: E402
from runtime.process_groups import stop_process_group  # noqa: E402


def boot(home: Path, cache: Path) -> float:
    """Seconds until a server started in ``home`` with ``cache`` as XDG_CACHE_HOME answers; then stops it."""
    os.environ["XDG_CACHE_HOME"] = str(cache)
    started = time.perf_counter()
    proc, _ = _launch(home, _free_port(), ui=False, startup_timeout=120)
    seconds = time.perf_counter() - started
    stop_process_group(proc.pid)
    proc.wait()
    return seconds


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="boots of each kind, alternating (default 3)")
    p.add_argument("--markdown", type=Path, help="also write the markdown section to this file")
    args = p.parse_args(argv)
    os.environ.pop("PREFECT_API_URL", None)
    info = RunInfo.start()
    fresh, seeded = [], []
    with tempfile.TemporaryDirectory(prefix="prefect-boot-") as tmp:
        root = Path(tmp)
        template_cache = root / "template-cache"
        boot(root / "seed-home", template_cache)  # writes the template the seeded boots copy
        assert template_path().is_file()
        for rep in range(args.repeats):
            runs = [(fresh, lambda: boot(root / f"fresh-{rep}", root / f"empty-cache-{rep}")),
                    (seeded, lambda: boot(root / f"seeded-{rep}", template_cache))]
            for out, run in runs if rep % 2 == 0 else runs[::-1]:
                out.append(run())
            print(f"repeat {rep + 1}: fresh {fresh[-1]:.1f} s, from the template {seeded[-1]:.1f} s", file=sys.stderr)
    info.finish()
    ratios = [f / s for f, s in zip(fresh, seeded)]
    text = "\n".join([
        "## Local Prefect server boot: fresh database vs the database template",
        "",
        *info.markdown_header(),
        f"`prefect server start` through runtime.prefect_server in a fresh PREFECT_HOME, {args.repeats} repeats in "
        "alternating order; seconds from the start to the first healthy answer (method in bench/README.md).",
        "",
        "| database | boot s (min / median / max) |",
        "|---|---:|",
        f"| fresh (migrated at boot) | {spread(fresh, '{:.1f}')} |",
        f"| copy of the template | {spread(seeded, '{:.1f}')} |",
        "",
        f"fresh / template: {spread(ratios, '{:.2f}')}x.",
        "",
    ])
    publish(text, args.markdown)


if __name__ == "__main__":
    main()
