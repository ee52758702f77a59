"""``wikirag dumps check|mirror|gc``: the newest complete dated dump on a Wikimedia-style site against the dump behind
LATEST, a verified copy of it on the store for ingest to parse (the ``mirror_dump`` flow), and the removal of the
mirrors and staged pieces nothing needs any more (rag_core.wiki.dump_retention)."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable

from rag_core.wiki.dump_site import DumpSiteConfig
from runtime.settings import Settings

log = logging.getLogger("wikirag")


def site_config(args: argparse.Namespace) -> DumpSiteConfig:
    from cli.options import given

    fields = given(args, site="site", wiki="wiki", connections="connections")
    if getattr(args, "piece_mib", None) is not None:
        fields["piece_bytes"] = args.piece_mib << 20
    return DumpSiteConfig(**fields)


def cmd_check(args: argparse.Namespace, settings: Settings) -> int:
    """One line (or JSON): the newest complete dated dump, and whether it is newer than the one behind LATEST."""
    from rag_core.wiki.dump_site import check_site, dump_date_behind_latest

    config = site_config(args)
    check = check_site(config, dump_date_behind_latest(settings.open_store(), config.wiki))
    print(json.dumps(check.as_dict()) if args.json else check.describe())
    return 0


def cmd_mirror(args: argparse.Namespace, settings: Settings) -> int:
    """The ``mirror_dump`` flow: a newer complete dump copied to <store>/dumps/<wiki>/<date>/ and verified."""
    from cli.flow_runs import import_flow, quiet_expected_tracebacks
    from runtime.prefect_server import prefect_api

    config = site_config(args)
    with prefect_api(settings.prefect_home, meanwhile=import_flow("flows.dump_mirror")):
        from flows.dump_mirror import mirror_dump

        quiet_expected_tracebacks()
        mirror = mirror_dump(site=config, store=settings.store_access())
    if mirror is None:
        log.info("%s: the dump behind LATEST is the newest complete one; nothing mirrored", config.url(""))
        return 0
    log.info("%s mirrored and verified; ingest it with: wikirag index-rebuild %s --index %s", mirror.dump_id,
             mirror.dump_url, mirror.index_url)
    print(mirror.dump_url)
    print(mirror.index_url)
    return 0


def cmd_gc(args: argparse.Namespace, settings: Settings) -> int:
    """Remove the mirrors older than the ``--keep`` newest and the one behind LATEST, and stale staged pieces."""
    from rag_core.wiki.dump_retention import mirror_garbage, remove_mirror_garbage

    store = settings.open_store()
    garbage = mirror_garbage(store, args.wiki or DumpSiteConfig().wiki, args.keep)
    for parts in garbage.paths():
        print(store.url_of(*parts))
    if not args.dry_run:
        remove_mirror_garbage(store, garbage)
    log.info("dumps gc (%s): %d mirrors and %d staged dates %s; kept %s (behind LATEST: %s)", garbage.wiki,
             len(garbage.mirrors), len(garbage.staging), "would go" if args.dry_run else "removed",
             ", ".join(garbage.kept) or "none", garbage.behind_latest or "none")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cli.options import add_store, default

    from rag_core.wiki.dump_retention import KEEP_MIRRORS

    p = sub.add_parser("dumps", help="dated Wikipedia dumps: check the dump site for a newer complete one, mirror "
                       "it to the store (sha1-verified) for ingest to parse, gc the old mirrors")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, func: Callable[[argparse.Namespace, Settings], int], help: str) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help)
        a.add_argument("--site", help=f"the dump site's root URL (default {default(DumpSiteConfig, 'site')})")
        a.add_argument("--wiki", help=f"the wiki's database name (default {default(DumpSiteConfig, 'wiki')})")
        add_store(a)
        a.set_defaults(func=func)
        return a

    check = action("check", cmd_check, "the newest complete dated dump, and whether it is newer than the one behind "
                   "LATEST (one request when it is not)")
    check.add_argument("--json", action="store_true", help="one JSON object instead of the line")
    mirror = action("mirror", cmd_mirror, "copy a newer complete dump and its index to <store>/dumps/<wiki>/<date>/, "
                    "resumable, kept only when the published sha1 matches")
    mirror.add_argument("--connections", type=int, help="connections to the site at once (default "
                        f"{default(DumpSiteConfig, 'connections')}; Wikimedia allows each client few)")
    mirror.add_argument("--piece-mib", type=int, help="MiB per range request; a rerun keeps finished pieces "
                        f"(default {default(DumpSiteConfig, 'piece_bytes') >> 20})")
    gc = actions.add_parser("gc", help="remove mirrors older than the --keep newest and the one behind LATEST, and "
                            "staged pieces of dates that are complete or older")
    gc.add_argument("--wiki", help=f"the wiki's database name (default {default(DumpSiteConfig, 'wiki')})")
    gc.add_argument("--keep", type=int, default=KEEP_MIRRORS, help="newest complete mirrors kept besides the one "
                    f"behind LATEST (default {KEEP_MIRRORS})")
    gc.add_argument("--dry-run", action="store_true", help="print what would go; remove nothing")
    add_store(gc)
    gc.set_defaults(func=cmd_gc)
