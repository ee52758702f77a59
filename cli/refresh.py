"""``wikirag refresh`` (the ``refresh`` flow: champions re-evaluated against a newer index and re-bound within a
tolerance, no retraining) and ``wikirag models rollback NAME`` (the champion alias moved back)."""

from __future__ import annotations

import argparse
import json
import logging

from runtime.settings import Settings

log = logging.getLogger("wikirag")


def cmd_refresh(args: argparse.Namespace, settings: Settings) -> int:
    """One line per champion (or one JSON object with --json): re-bound or kept, and why."""
    from cli.flow_runs import import_flow, quiet_expected_tracebacks
    from cli.options import given
    from runtime.prefect_server import prefect_api

    with prefect_api(settings.prefect_home, meanwhile=import_flow("flows.refresh")):
        from flows.refresh import refresh

        quiet_expected_tracebacks()
        decisions = refresh(settings.tracking_uri, settings.store_access(), args.model,
                            index_version=args.index, **given(args, tolerance="tolerance"))
    if not decisions:
        log.info("no registered wikirag model has a champion in MLflow at %s; nothing to refresh",
                 settings.tracking_uri)
    for d in decisions:
        if args.json:
            print(json.dumps(d.model_dump(), sort_keys=True))
            continue
        bound = f"v{d.new_version} is champion" if d.new_version else f"v{d.version} stays champion"
        changed = f"; {len(d.changed)} dev questions with a changed gold passage set apart" if d.changed else ""
        print(f"{d.name}: {bound}: {d.reason}{changed}")
    return 0


def cmd_rollback(args: argparse.Namespace, settings: Settings) -> int:
    """Move NAME's champion back to the version it replaced; one line saying which, and the index it reads."""
    from tasks.adapters.mlflow_registry import rollback

    done = rollback(settings.tracking_uri, args.name, settings.open_store)
    print(f"{done.name}: champion moved back from v{done.from_version} to v{done.to_version} "
          f"(index {done.index_version}, still pinned)")
    return 0


def add_rollback_parser(actions: argparse._SubParsersAction) -> None:
    """``models rollback NAME``, added to the ``models`` group's actions."""
    p = actions.add_parser("rollback", help="move a registered model's champion alias back to the version it "
                           "replaced (its index is still pinned)")
    p.add_argument("name", help="registered model, e.g. wikirag-nq")
    p.set_defaults(func=cmd_rollback)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``wikirag refresh [--model NAME] [--tolerance X] [--index VERSION]``."""
    from cli.options import add_store, config_option
    from rag_core.evaluate.refresh_policy import RefreshPolicy

    p = sub.add_parser("refresh", help="evaluate every registered champion against the newest index (no retraining) "
                       "and re-bind each whose dev metric holds within the tolerance; MLflow records both")
    p.add_argument("--model", help="only this registered model, e.g. wikirag-nq (default: every wikirag-* champion)")
    config_option(p, "--tolerance", RefreshPolicy, "tolerance", "points (hundredths) of its own dev metric a champion "
                  "may lose on the new index and still be re-bound (default {default} point)")
    p.add_argument("--index", "--version", dest="index", metavar="VERSION",
                   help="index version to refresh onto (default: the one LATEST names)")
    p.add_argument("--json", action="store_true", help="one JSON object per champion instead of the line")
    add_store(p)
    p.set_defaults(func=cmd_refresh)
