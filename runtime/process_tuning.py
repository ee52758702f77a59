"""Process-level tuning: what a wikirag process sets about itself, and the Prefect database template.

One switch turns all of it off: ``WIKIRAG_PROCESS_TUNING=off``
(:class:`runtime.settings.Switches`); the process then runs with glibc's,
Python's, Dask's and Prefect's own defaults. bench/process_tuning_bench.py
runs real commands with the switch on and off, side by side.

- **glibc's malloc** (:func:`keep_freed_memory`): a model's forward pass
  allocates its activations anew on every batch (an encoder batch: several
  tensors of 10-25 MiB). Under glibc's adaptive thresholds many of them become
  fresh ``mmap``s whose pages fault in again on first touch, 1,500-2,000 page
  faults per passage encoded (tests/runtime/test_process_tuning.py), each a
  trip into the kernel. Fixing the mmap threshold at glibc's maximum and
  keeping up to :data:`TRIM_THRESHOLD` of freed heap brings that to a few
  hundred at most; the cost is memory a process keeps after a peak.
  A **training rank** is the exception (:func:`hand_back_freed_memory`):
  its rows change length with every retrieved passage, so freed blocks of
  one size rarely fit the next and the kept heap grows instead of being
  reused. SmolLM2 on 35 NQ dev questions, one rank, no gradients: 2.1 GB
  before the pass, 4.9 GB after it with the kept heap, 1.5 GB once
  ``malloc_trim`` returned it (the live set). So a rank maps every block of
  :data:`RANK_MMAP_THRESHOLD` or more on its own, and unmaps it when freed,
  and its environment bounds oneDNN's kernel cache (:func:`rank_environment`).
- **Dask's nanny** exports ``MALLOC_TRIM_THRESHOLD_=65536`` to every worker;
  setting any malloc threshold also pins the mmap threshold at 128 KiB, the
  same page faults again. Workers started here run without it
  (:func:`keep_glibc_malloc`, :func:`worker_environment`), and
  :func:`keep_freed_memory` does not count Dask's value as the user's.
- **Dask's background sampling** (:func:`quiet_background`): every core of a
  local cluster runs a worker, so the statistical profiler (a stack sample of
  the task thread every 10 ms) and the frequent ticks take CPU from encoding.
- **The exit** (:func:`end_command`, :func:`freeze_before_exit`): the
  interpreter's teardown collects garbage over every object the imports made
  (torch, transformers, Prefect, pydantic: ~0.5 million), ~2 s a process;
  frozen first, the objects are skipped. Objects outside reference cycles are
  still freed and atexit handlers still run.
- **The Prefect database template** (:func:`seed_prefect_database`): a fresh
  local server spends half of its boot or more migrating an empty SQLite
  database. The first server that boots on a fresh one leaves a snapshot,
  migrated and empty of runs, in the user's cache (one per Prefect version);
  later servers in a fresh ``PREFECT_HOME`` start from a copy. Prefect still
  checks the schema at each start and migrates what is missing, so a template
  can only save time; one a server fails to start from is removed.

Every Dask worker process runs :func:`start_process` as it starts and :func:`freeze_before_exit` as it closes:
a command's local cluster preloads runtime.local_cluster, and the ``dask worker`` of ``wikirag services``,
infra/*.sh, compose and Kubernetes preloads this module (``--preload runtime.process_tuning``,
runtime/service_specs.py), through Dask's preload hooks :func:`dask_setup` and :func:`dask_teardown`.

A read-only command that failed ends with ``os._exit`` after its one-line
error, whatever the switch says (:func:`end_command`): that is no tuning but
its exit status, which a native library's thread (FAISS, Arrow) could turn
into an abort during the teardown.

The switch :class:`~runtime.settings.Switches` also carries ``WIKIRAG_PERF``,
which :func:`start_process` hands to :mod:`rag_core.perf` (precision, probes,
the int8 engine): rag_core never reads the environment.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import importlib.metadata
import logging
import os
import shutil
import sqlite3
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag_core import perf
from rag_core.storage import user_cache_dir
from runtime.settings import Switches

log = logging.getLogger("wikirag")

_started: Switches | None = None


@functools.cache
def _from_environment() -> Switches:
    return Switches()


def switches() -> Switches:
    """The switches :func:`start_process` was given, else those of this process's environment (read once)."""
    return _started or _from_environment()


def tuned() -> bool:
    """Whether process-level tuning is on in this process (``WIKIRAG_PROCESS_TUNING``, default on)."""
    return switches().process_tuning


def start_process(given: Switches | None = None, *, training_rank: bool = False) -> Switches:
    """What every wikirag process does first (the CLI, each Dask worker, each training rank): the performance
    machinery on or off (:mod:`rag_core.perf`), and glibc's malloc tuned unless process tuning is off: kept for
    reuse (:func:`keep_freed_memory`), or in a training rank handed back (:func:`hand_back_freed_memory`)."""
    global _started
    _started = given or _from_environment()
    perf.set_enabled(_started.perf)
    if _started.process_tuning:
        (hand_back_freed_memory if training_rank else keep_freed_memory)()
    return _started


# -- glibc's malloc ----------------------------------------------------------------------------------------------
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's maximum: blocks below it come from the heap and are reused
TRIM_THRESHOLD = 512 << 20  # freed heap kept for reuse before any goes back to the OS
# A training rank's: its activations (a 256-token row's hidden states, MLP widths, attention scores: 0.3-2.4 MB)
# are mappings of their own (bench/rank_malloc_bench.py measures the choice).
RANK_MMAP_THRESHOLD = 256 << 10
RANK_TRIM_THRESHOLD = 128 << 10  # glibc's default: the heap's free top goes back at once
# oneDNN's kernels kept by a rank (its default: 1,024). Each row length makes new ones, so the cache fills over
# the first steps: in a one-rank probe (SmolLM2) RSS rose 2.70 -> 3.22 GB over steps 1-6 with 1,024 and 2.60 ->
# 2.90 GB with 256 (memory probes; the step-time cost is inside bench/rank_malloc_bench.py's lean ranks). Far
# smaller caps re-make kernels within every forward pass.
RANK_ONEDNN_CACHE = "256"
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
DASK_TRIM_DEFAULT = "65536"  # what a plain Dask nanny exports as MALLOC_TRIM_THRESHOLD_; not a user's choice
# Dask reads this at import; a value of None removes the variable from what the nanny sets (its other defaults,
# one OpenMP/MKL/OpenBLAS thread, stay). For workers started by `dask worker` (services, infra/).
NANNY_ENVIRONMENT = {"DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON": "{'MALLOC_TRIM_THRESHOLD_': None}"}


@functools.cache
def keep_freed_memory() -> bool:
    """Let glibc reuse the heap that a model's forward pass frees, instead of unmapping it; once per process.

    Returns whether the thresholds were set: not with process tuning off, not on a libc without ``mallopt``
    (musl, macOS), nor where the environment sets a malloc threshold (a user's tuning wins; Dask's nanny
    default does not count).
    """
    return _mallopt(MMAP_THRESHOLD, TRIM_THRESHOLD)


@functools.cache
def hand_back_freed_memory() -> bool:
    """A training rank's malloc: blocks of :data:`RANK_MMAP_THRESHOLD` or more are mapped on their own and unmapped
    when freed, so a rank holds its live set, not its peaks plus a heap that grows with each new row length; once
    per process. Returns whether the thresholds were set (as :func:`keep_freed_memory`)."""
    return _mallopt(RANK_MMAP_THRESHOLD, RANK_TRIM_THRESHOLD)


def _mallopt(mmap_threshold: int, trim_threshold: int) -> bool:
    """glibc's two thresholds, unless process tuning is off, the libc has no ``mallopt`` (musl, macOS) or the
    environment sets a malloc threshold (a user's tuning wins; Dask's nanny default does not count)."""
    user_set = [k for k in _MALLOC_ENV if k in os.environ
                and not (k == "MALLOC_TRIM_THRESHOLD_" and os.environ[k] == DASK_TRIM_DEFAULT)]
    if not tuned() or user_set or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold) and mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def rank_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of training ranks: :func:`without_dask_trim`'s, with :data:`RANK_ONEDNN_CACHE` unless the
    environment sets oneDNN's cache itself; as is with process tuning off."""
    if not tuned():
        return dict(environ)
    return {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": RANK_ONEDNN_CACHE, **without_dask_trim(environ)}


def without_dask_trim(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` less a MALLOC_TRIM_THRESHOLD_ of Dask's own value (a user's other value stays); as is with
    process tuning off.

    A nanny exports its pre-spawn variables into its own process's environment and leaves them there, and the
    configured None of :data:`NANNY_ENVIRONMENT` cannot remove a variable the environment already has: after
    any plain Dask cluster in a process, every later worker or child of it would inherit Dask's value.
    """
    if not tuned():
        return dict(environ)
    return {k: v for k, v in environ.items() if not (k == "MALLOC_TRIM_THRESHOLD_" and v == DASK_TRIM_DEFAULT)}


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for ``dask worker`` processes: without Dask's malloc trim, unless process tuning is off."""
    return {**without_dask_trim(environ), **(NANNY_ENVIRONMENT if tuned() else {})}


def keep_glibc_malloc() -> None:
    """Workers this process's nannies start from now on run without Dask's MALLOC_TRIM_THRESHOLD_."""
    if not tuned():
        return
    import dask

    dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None})
    if os.environ.get("MALLOC_TRIM_THRESHOLD_") == DASK_TRIM_DEFAULT:
        del os.environ["MALLOC_TRIM_THRESHOLD_"]  # left by an earlier nanny of this process (without_dask_trim)


# -- Dask's background sampling ------------------------------------------------------------------------------------
QUIET_SETTINGS = {
    "distributed.worker.profile.enabled": False,  # the dashboard's Profile page stays empty
    "distributed.admin.tick.interval": "1s",  # event-loop health check; still warns of a blocked loop
    "distributed.admin.system-monitor.interval": "5s",  # the dashboard's CPU/memory plots refresh every 5 s
}


def quiet_background() -> None:
    """Dask's background sampling, in this process and the workers its nannies start: :data:`QUIET_SETTINGS`,
    except where the user chose a value: in a Dask YAML file or ``DASK_*`` variable (any value), or with
    ``dask.config.set`` (a value other than Dask's default: one equal to it cannot be told from it)."""
    if not tuned():
        return
    import dask

    users, defaults = dask.config.collect(), dask.config.merge(*dask.config.defaults)
    for key, value in QUIET_SETTINGS.items():
        set_by_user = dask.config.get(key, default=None, config=users) is not None
        if not set_by_user and dask.config.get(key) == dask.config.get(key, config=defaults):
            dask.config.set({key: value})


# -- the exit --------------------------------------------------------------------------------------------------------
def freeze_before_exit() -> None:
    """Let the interpreter's teardown skip collecting the objects made so far (module docstring)."""
    if tuned():
        gc.freeze()


def end_command(code: int, *, skip_teardown: bool = False) -> None:
    """End the process with ``code``: after :func:`freeze_before_exit`, through ``sys.exit``; with
    ``skip_teardown``, by ``os._exit`` once the output is flushed (module docstring: an exit status, not tuning)."""
    freeze_before_exit()
    if skip_teardown:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


# -- the Prefect database template ---------------------------------------------------------------------------------
_DATABASE_SETTINGS = ("PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")


def prefect_template_path() -> Path:
    """Where a migrated, empty Prefect database for this Prefect version is kept (the user's cache)."""
    return user_cache_dir() / f"prefect-{importlib.metadata.version('prefect')}.db"


def _prefect_database(prefect_home: Path) -> Path | None:
    """The server's SQLite file in ``prefect_home``; None where a database URL is configured (e.g. Postgres)."""
    if any(os.environ.get(k) for k in _DATABASE_SETTINGS):
        return None
    return prefect_home / "prefect.db"


def seed_prefect_database(prefect_home: Path) -> bool:
    """Copy the template into a home that has no database yet; whether it did (never with process tuning off)."""
    database, template = _prefect_database(prefect_home), prefect_template_path()
    if not tuned() or database is None or database.exists() or not template.is_file():
        return False
    partial = database.with_name(f".{database.name}.{os.getpid()}.part")
    try:
        shutil.copyfile(template, partial)
        os.replace(partial, database)
    except OSError as exc:  # an unreadable cache costs the migration, nothing else
        partial.unlink(missing_ok=True)
        log.debug("Prefect database template %s not used: %s", template, exc)
        return False
    return True


def keep_prefect_template(prefect_home: Path) -> None:
    """Snapshot the database of a server that just booted on a fresh one, unless a template exists already."""
    database, template = _prefect_database(prefect_home), prefect_template_path()
    if not tuned() or database is None or not database.is_file() or template.exists():
        return
    partial = template.with_name(f".{template.name}.{os.getpid()}.part")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        # SQLite's backup API: a consistent copy of a database the server has open (WAL and all).
        with contextlib.closing(sqlite3.connect(database)) as src, contextlib.closing(sqlite3.connect(partial)) as dst:
            src.backup(dst)
        os.replace(partial, template)  # whole or not at all, whoever else writes one at the same moment
    except (OSError, sqlite3.Error) as exc:
        partial.unlink(missing_ok=True)
        log.debug("Prefect database template %s not written: %s", template, exc)


def drop_prefect_template() -> None:
    """Remove the template after a server failed to start from a copy: the next start migrates afresh."""
    prefect_template_path().unlink(missing_ok=True)


def dask_setup(worker: Any) -> None:
    """Dask's preload hook (``dask worker --preload runtime.process_tuning``): :func:`start_process` in the worker."""
    start_process()


def dask_teardown(worker: Any) -> None:
    """Dask's preload hook at a worker's close: :func:`freeze_before_exit` (the cluster's close waits for it)."""
    freeze_before_exit()
