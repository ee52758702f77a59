"""``wikirag plan DUMP``: what an index rebuild of the dump will take, before it runs (rag_core/capacity/)."""

from __future__ import annotations

import argparse
import json
import sys
import typing

from cli.options import config_option, default, given
from rag_core.capacity.dump_plan import plan_rebuild
from rag_core.capacity.plan import GB, Budget, Plan, check_budget
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from runtime.settings import Settings


BUDGET_FIELDS = ("worker_memory_gb", "disk_gb", "deadline_hours")


def budget_of(args: argparse.Namespace, settings: Settings) -> Budget:
    """The budget the flags give; a limit not given is no limit."""
    return Budget(workers=args.workers or settings.workers, **given(args, **{f: f for f in BUDGET_FIELDS}))


def add_budget_options(p: argparse.ArgumentParser) -> None:
    """--worker-memory-gb, --disk-gb, --deadline-hours: of ``wikirag plan`` and ``index-rebuild``."""
    config_option(p, "--worker-memory-gb", Budget, "worker_memory_gb", "RAM of one worker, GB (default: no limit)")
    config_option(p, "--disk-gb", Budget, "disk_gb", "disk for the dump and the store, GB (default: no limit)")
    config_option(p, "--deadline-hours", Budget, "deadline_hours", "hours the rebuild may take (default: no limit)")


def check_rebuild_fits(args: argparse.Namespace, settings: Settings, embed: EmbedConfig, index: IndexConfig) -> None:
    """``index-rebuild`` with any budget flag: the plan of that rebuild (its encoder, shards and factory) first, and
    a refusal in one line before any work."""
    if any(getattr(args, f, None) is not None for f in BUDGET_FIELDS):
        plan = check_budget(plan_rebuild(args.dump, args.index, budget_of(args, settings), embed.encoder,
                                         embed=embed, factory=index.factory))
        print(describe(plan), file=sys.stderr)  # stdout stays the version the rebuild prints


def cmd_plan(args: argparse.Namespace, settings: Settings) -> int:
    encoder = EncoderConfig(**given(args, path="encoder", dtype="encoder_dtype"))
    plan = plan_rebuild(args.dump, args.index, budget_of(args, settings), encoder, n_streams=args.sample_streams)
    print(json.dumps(plan.summary()) if args.json else describe(plan))
    check_budget(plan)  # after the figures: a refusal is one line on stderr, the plan above it shows why
    return 0


def describe(plan: Plan) -> str:
    """The plan as a short table a person reads."""
    lines = [f"{plan.dump}: {plan.pages:,} pages -> about {plan.passages:,} passages; index {plan.factory} in "
             f"{plan.shards} shards on {plan.budget.workers} workers",
             f"RAM per worker: {plan.worker_memory_bytes / GB:,.2f} GB",
             "disk: " + ", ".join(f"{k} {v / GB:,.2f} GB" for k, v in plan.disk_bytes.items())
             + f"; total {plan.disk_total / GB:,.2f} GB",
             "hours: " + ", ".join(f"{k} {v:,.2f}" for k, v in plan.hours.items()) + f"; total {plan.hours_total:,.2f}",
             "fits the budget" if not plan.over else "does NOT fit: " + "; ".join(plan.over)]
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``wikirag plan DUMP [--index FILE] [budget options] [--json]``."""
    p = sub.add_parser("plan", help="predict an index rebuild's passages, disk, RAM per worker, index type, shards "
                       "and hours from the dump's multistream index and a calibration on a few of its streams; "
                       "exit 2 when it does not fit the budget")
    p.add_argument("dump", help="multistream dump path or URL (...-pages-articles-multistream.xml.bz2)")
    p.add_argument("--index", help="its multistream index (default: ...-multistream-index.txt.bz2 beside the dump)")
    p.add_argument("--workers", type=int, help="Dask workers, one core each (default: one per core here)")
    add_budget_options(p)
    p.add_argument("--encoder", help="local encoder directory (default: the packaged all-MiniLM-L6-v2)")
    p.add_argument("--encoder-dtype", choices=typing.get_args(EncoderConfig.model_fields["dtype"].annotation),
                   help=f"weights dtype (default {default(EncoderConfig, 'dtype')})")
    p.add_argument("--sample-streams", type=int, default=8, help="streams parsed and encoded to calibrate "
                   "(default 8, spread over the dump)")
    p.add_argument("--json", action="store_true", help="the plan as one JSON object")
    p.set_defaults(func=cmd_plan)
