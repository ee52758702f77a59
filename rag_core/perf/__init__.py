"""Performance machinery that decides how a model runs on this machine, and its one switch.

- :mod:`rag_core.perf.cpu`: the CPU's facts (model, bf16/AMX flags, torch's
  capability) and the hardware line every benchmark prints;
- :mod:`rag_core.perf.probes`: short timed probes and their per-machine cache
  (``<user cache>/probes.json``);
- :mod:`rag_core.perf.precision`: ``dtype="auto"``: bf16 where the CPU or GPU
  runs it natively and a probe confirms it, float32 elsewhere;
- :mod:`rag_core.perf.int8_engine`: ``engine="auto"``: calibrated int8 q/k/v
  and FFN inputs for the passage tower where float32 is what a CPU runs and a
  probe finds int8 faster.

The switch: :func:`set_enabled` ``(False)`` turns all of it off for the
process: ``auto`` then means float32 and the torch engine, and no probe runs.
An explicit dtype or engine still wins. ``rag_core`` never reads the
environment; the runtime reads ``WIKIRAG_PERF`` (``runtime.settings``) and
calls :func:`set_enabled` at each process's start (``runtime.process_tuning``).
"""

from __future__ import annotations

_enabled = True


def enabled() -> bool:
    """Whether ``auto`` precision and engine may choose anything but float32 and torch (and time probes for it)."""
    return _enabled


def set_enabled(on: bool) -> None:
    """Turn the machinery on or off for this process (the runtime calls it from ``WIKIRAG_PERF``)."""
    global _enabled
    _enabled = bool(on)
