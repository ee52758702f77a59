"""What every benchmark prints about its run: the machine, the load, the command, and min/median/max.

    from report import RunInfo, spread
    info = RunInfo.start()            # hardware and load at the start
    ...                               # the measurements (>= 3 repeats each)
    info.finish()                     # load at the end
    lines = info.markdown_header()    # command, date, hardware line, loads: above every table
    f"{spread(rates)}"                # "12.1 / 12.4 / 13.0" (min / median / max)

A script that takes ``--avx2`` calls :func:`emulate_avx2_if_asked` before it
imports torch: it runs again with ``rag_core.perf.cpu.AVX2_EMULATION`` set
(torch as on an AVX2-only CPU), and the header says so.

Figures in docs/benchmarks.md come only from a script's ``--markdown`` output,
under the command that made them (bench/README.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rag_core.perf.cpu import AVX2_EMULATION, Hardware, describe  # noqa: E402

MIN_REPEATS = 3
AVX2_FLAG = "--avx2"


def avx2_emulated() -> bool:
    """True when this process runs under :data:`AVX2_EMULATION` (all of its variables set)."""
    return all(os.environ.get(k) == v for k, v in AVX2_EMULATION.items())


def emulate_avx2_if_asked(argv: Sequence[str] | None = None) -> None:
    """With ``--avx2`` among the arguments, replace this process by the same command under AVX2_EMULATION.

    Call it before torch is imported: torch picks its kernels at import.
    """
    argv = list(sys.argv if argv is None else argv)
    if AVX2_FLAG in argv[1:] and not avx2_emulated():
        print(f"# re-running under {' '.join(f'{k}={v}' for k, v in AVX2_EMULATION.items())}", file=sys.stderr)
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *argv], {**os.environ, **AVX2_EMULATION})


def bench_parser(doc: str, repeats: int = MIN_REPEATS, what: str = "runs of each kind") -> argparse.ArgumentParser:
    """A benchmark's parser with the options every bench shares: ``--repeats``, ``--avx2``, ``--markdown``.

    Parse with :func:`parse_bench_args`, which refuses fewer than :data:`MIN_REPEATS` repeats.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=repeats, help=f"{what} (default {repeats})")
    parser.add_argument(AVX2_FLAG, action="store_true", help="run as on an AVX2-only CPU (bench/report.py)")
    parser.add_argument("--markdown", type=Path, help="also write the section to this file")
    return parser


def parse_bench_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.repeats < MIN_REPEATS:
        parser.error(f"--repeats: at least {MIN_REPEATS} (a figure is min / median / max)")
    return args


def alternating(kinds: Sequence[str], repeats: int) -> Iterator[tuple[int, str]]:
    """``(round, kind)`` for ``repeats`` rounds of every kind, the order reversed every other round (a machine
    that speeds up or slows down during a run then favours no kind)."""
    for r in range(repeats):
        for kind in (list(kinds) if r % 2 == 0 else list(reversed(kinds))):
            yield r, kind


def spread(values: Sequence[float], fmt: str = "{:.3g}") -> str:
    """``min / median / max`` of repeated measurements (at least :data:`MIN_REPEATS` of them)."""
    if len(values) < MIN_REPEATS:
        raise ValueError(f"{len(values)} measurements: a figure needs at least {MIN_REPEATS} repeats")
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


@dataclass
class RunInfo:
    """The run's machine, command and load at start and end."""

    hardware: Hardware
    command: str
    started: dt.datetime
    load_end: tuple[float, float, float] | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, argv: Sequence[str] | None = None) -> RunInfo:
        argv = list(sys.argv if argv is None else argv)
        script = Path(argv[0])
        try:
            script = script.resolve().relative_to(Path.cwd())
        except ValueError:
            pass
        info = cls(describe(), shlex.join(["python", str(script), *argv[1:]]),
                   dt.datetime.now(dt.timezone.utc).replace(microsecond=0))
        if avx2_emulated():
            info.notes.append("Emulated AVX2-only CPU: " + " ".join(f"{k}={v}" for k, v in AVX2_EMULATION.items())
                              + " (torch's own kernels, oneDNN, MKL and FBGEMM limited to AVX2, as on an AMD EPYC "
                              "without AVX512).")
        print(f"# {info.hardware.line()}", file=sys.stderr)
        return info

    def finish(self) -> None:
        self.load_end = os.getloadavg()

    def markdown_header(self) -> list[str]:
        """Lines above a table: the command, the date, the hardware and the load at start and end."""
        hw = self.hardware
        end = "?" if self.load_end is None else " / ".join(f"{x:.2f}" for x in self.load_end)
        return [
            f"`{self.command}` ({self.started:%Y-%m-%d %H:%M} UTC)",
            "",
            f"Hardware: {hw.cpu_model} [{' '.join(hw.cpu_flags) or 'no native bf16'}], torch CPU capability "
            f"{hw.capability}, {hw.cores} cores, {hw.threads} torch threads; load average (1/5/15 min) "
            f"{' / '.join(f'{x:.2f}' for x in hw.load)} at start, {end} at end.",
            *self.notes,
            "",
        ]


def status_bytes(key: str) -> int:
    """Bytes of one ``/proc/self/status`` line of this process (``VmRSS``, ``VmHWM``; Linux)."""
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))


def reset_peak_rss() -> None:
    """Make this process's peak RSS (``VmHWM``) its current RSS, so that a peak read later is the run's own (Linux
    ``/proc/self/clear_refs``; OSError where the kernel does not offer it)."""
    Path("/proc/self/clear_refs").write_text("5")


def publish(text: str, markdown: Path | None) -> None:
    """Print a benchmark's markdown section, and write it to ``markdown`` when given (``--markdown FILE``)."""
    print(text)
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text, encoding="utf-8")
        print(f"markdown written to {markdown}", file=sys.stderr)
