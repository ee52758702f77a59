"""Timed probes' verdicts, kept per machine: the first process on a CPU measures, later ones read.

A probe (the bf16 matmul of :mod:`rag_core.perf.precision`, the int8 Linear of
:mod:`rag_core.perf.int8_engine`) takes up to ~0.7 s. Each Dask worker and
each ``wikirag ask`` would spend it again; :func:`cached_probe` keeps the
verdict in ``<user cache>/probes.json`` under a key of everything that makes
it hold: the CPU (model and flags), torch and the variables that limit its
kernels' instruction sets.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from rag_core.perf.cpu import AVX2_EMULATION, cpu_capability, cpuinfo

log = logging.getLogger("wikirag")

# A process held to AVX2 measures differently from one that is not.
_ISA_ENV = (*AVX2_EMULATION, "DNNL_MAX_CPU_ISA", "MKL_DEBUG_CPU_TYPE", "MKL_CBWR")
PROBE_CACHE_FORMAT = 1  # bump when a probe's measurement changes meaning: old verdicts stop matching


def probe_cache_path() -> Path:
    """``<user cache>/probes.json`` (:func:`rag_core.storage.user_cache_dir`): timed probes' verdicts by machine."""
    from rag_core.storage import user_cache_dir

    return user_cache_dir() / "probes.json"


def _probe_key(name: str, cpu_model: str, cpu_flags: set[str]) -> str:
    import torch

    # The instruction-set variables are facts of this process (inherited from whoever started it), not settings.
    facts = {"probe": name, "format": PROBE_CACHE_FORMAT, "cpu": cpu_model, "flags": sorted(cpu_flags),
             "torch": torch.__version__, "capability": cpu_capability(),
             "env": {k: os.environ.get(k) for k in _ISA_ENV}}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]


def _read_probes(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # torn or not ours: measure again and replace it
        log.debug("%s: unreadable probe cache (%s); measuring again", path, exc)
        return {}
    return entries if isinstance(entries, dict) else {}


def kept_probe(name: str) -> float | None:
    """This machine's kept verdict of the probe ``name`` (see :func:`cached_probe`); None when there is none."""
    kept = _read_probes(probe_cache_path()).get(_probe_key(name, *cpuinfo()))
    value = kept.get("value") if isinstance(kept, dict) else None
    if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def cached_probe(name: str, probe: Callable[[], float]) -> float:
    """``probe()`` for this machine, measured once and kept in :func:`probe_cache_path` under a key of the CPU
    (model and flags), torch and its instruction-set variables, so the same CPU gets the same verdict without
    timing it again. A cache that cannot be read or written costs only the measurement."""
    kept = kept_probe(name)
    if kept is not None:
        return kept
    value = probe()
    path, (model, flags) = probe_cache_path(), cpuinfo()
    entries = _read_probes(path)  # again: another process may have added its own since
    entries[_probe_key(name, model, flags)] = {"probe": name, "value": value, "cpu": model,
                                               "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    from rag_core.storage import write_aside

    try:
        write_aside(path, lambda f: f.write(json.dumps(entries, indent=1, sort_keys=True).encode()))
    except OSError as exc:  # a read-only or full home: the next process measures again
        log.debug("could not keep the %s probe in %s: %s", name, path, exc)
    return value
