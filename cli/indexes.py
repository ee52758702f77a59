"""``wikirag indexes ...``: list, show, verify, pin, unpin, delete and garbage-collect index versions.

Each action is one function ``cmd_*(args, settings) -> exit status`` over
``rag_core.index.versions`` and ``rag_core.index.retention``.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from cli.options import add_store
from rag_core.errors import WikiragError
from rag_core.index.retention import MIN_AGE_HOURS, CleanupConfig, Removed
from rag_core.progress import human_bytes
from runtime.settings import Settings

log = logging.getLogger("wikirag")


def freed_lines(removed: Removed) -> Iterable[str]:
    """One line per removed item (a version folder, an embedding folder, a staging folder): files and bytes."""
    groups: dict[str, list[int]] = {}
    for path, size in removed.files.items():
        parts = path.split("/")
        key = "/".join(parts[:2 if parts[0] == "indexes" else 3])
        groups.setdefault(key, []).append(size)
    for key, sizes in sorted(groups.items()):
        yield f"removed {key}: {len(sizes)} files, {human_bytes(sum(sizes))}"


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    """Published versions, oldest first (* = LATEST), with their holders."""
    from rag_core.index.retention import version_pins
    from rag_core.index.versions import latest_version, list_versions, read_index_manifest

    store = settings.open_store()
    latest, versions = latest_version(store), list_versions(store)
    if not versions:
        log.info("no published index under %s", store.url_of("indexes"))
    for version in versions:
        mark = "*" if version == latest else " "
        pins = version_pins(store, version)
        held = f"\tpinned by {', '.join(pins)}" if pins else ""
        try:
            m = read_index_manifest(store, version)
        except WikiragError as exc:
            print(f"{mark} {version}\tunreadable: {exc}{held}")
            continue
        encoder = f"{m.encoder.get('name', '?')} ({m.fingerprint_id})" if m.encoder else "-"
        print(f"{mark} {version}\t{m.count:>10,} passages\t{len(m.shards)} shards\t{m.factory}\t{encoder}\t"
              f"{m.dump_id or '-'}{held}")
    return 0


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    """One version's manifest: readable, or the stored JSON with --json."""
    from rag_core.index.retention import holders
    from rag_core.index.versions import read_index_manifest

    store = settings.open_store()
    m = read_index_manifest(store, args.version)
    if args.json:
        print(json.dumps(m.as_dict(), indent=2, sort_keys=True))
        return 0
    rows: list[tuple[str, Any]] = [
        ("version", m.version), ("schema", m.schema_version), ("created", m.created_at.isoformat()),
        ("passages", f"{m.count:,} in {len(m.shards)} shards"),
        ("index", f"{m.factory} (requested {m.factory_requested or m.factory}), metric {m.metric}, dim {m.dim}"),
        ("encoder", f"{m.encoder.get('name', '?')} ({m.fingerprint_id})" if m.encoder else "-"),
        ("passage set", f"{m.dump_id} ({m.passages})" if m.dump_id else "-"),
        ("dump", f"{m.dump.get('url')} sha256 {str(m.dump.get('sha256'))[:12]}..." if m.dump else "-"),
        ("held by", ", ".join(holders(store, m.version)) or "nobody (deletable)"),
        *((f"gate {name}", value) for name, value in _gate_lines(m.gates).items()),
    ]
    width = max(len(key) for key, _ in rows) + 2
    for key, value in rows:
        print(f"{key:<{width}}{value}")
    print(f"\n{'shard':>5} {'passages':>10} {'bytes':>12}  embeddings (rows, file)  meta")
    for e in m.shards:
        emb = f"{e.embeddings.start}..{e.embeddings.stop} {e.embeddings.vectors}" if e.embeddings else "-"
        print(f"{e.shard:>5} {e.count:>10,} {e.bytes:>12,}  {emb}  {json.dumps(e.meta, sort_keys=True)}")
    return 0


def _gate_lines(gates: dict[str, Any]) -> dict[str, str]:
    """One line per gate: its outcome, then the values it observed ("index-counts: expect_...(ntotal)": 4391)."""
    lines = {name: str(value) for name, value in gates.items() if ": " not in name}
    for name, value in gates.items():
        gate, _, check = name.partition(": ")
        if check:
            lines[gate] = f"{lines[gate]}; {check} = {value}" if gate in lines else f"{check} = {value}"
    return lines


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    """Check every file a version reads against its manifest's sha256."""
    from rag_core.index.versions import verify_version

    checked = verify_version(settings.open_store(), args.version)
    print(f"{args.version or 'LATEST'}: {checked} files match their sha256")
    return 0


def cmd_pin(args: argparse.Namespace, settings: Settings) -> int:
    from rag_core.index.retention import pin_version

    pin_version(settings.open_store(), args.version, args.by, note=args.note)
    log.info("pinned %s by %s: it cannot be deleted until unpinned", args.version, args.by)
    return 0


def cmd_unpin(args: argparse.Namespace, settings: Settings) -> int:
    from rag_core.index.retention import holders, unpin_version

    store = settings.open_store()
    unpin_version(store, args.version, args.by)
    log.info("unpinned %s by %s; held by: %s", args.version, args.by, ", ".join(holders(store, args.version)) or "nobody")
    return 0


def cmd_delete(args: argparse.Namespace, settings: Settings) -> int:
    from rag_core.index.retention import delete_version
    from rag_core.index.versions import latest_version

    store = settings.open_store()
    removed = delete_version(store, args.version, force=args.force)
    for line in freed_lines(removed):
        print(line)
    for note in removed.notes:
        log.warning("%s", note)
    log.info("deleted index version %s: %s freed, %d shared embedding files kept (other versions read them); "
             "LATEST is %s", args.version, human_bytes(removed.bytes), len(removed.kept), latest_version(store) or "unset")
    return 0


def cmd_gc(args: argparse.Namespace, settings: Settings) -> int:
    from rag_core.index.retention import collect_garbage

    config = CleanupConfig(**({} if args.older_than is None else {"older_than_hours": args.older_than}),
                           ignore_min_age=args.ignore_min_age)
    config.check_min_age()  # before the store is opened: a refused gc touches nothing
    removed = collect_garbage(settings.open_store(), config)
    for line in freed_lines(removed):
        print(line)
    for note in removed.notes:
        log.info("%s", note)
    log.info("gc: %d files, %s freed (leftovers idle for more than %g hours)", len(removed.files),
             human_bytes(removed.bytes), config.older_than_hours)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``indexes`` command and its actions (``indexes`` alone lists)."""
    p = sub.add_parser("indexes", help="index versions: list (* = LATEST), show, verify, pin, unpin, delete, gc")
    add_store(p)
    p.set_defaults(func=cmd_list)
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    def action(name: str, func: Callable[..., int], help: str, version: str | None = None) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help)
        if version:
            a.add_argument("version", nargs="?" if version == "optional" else None,
                           help="index version" + (" (default: LATEST)" if version == "optional" else ""))
        a.add_argument("--store", default=argparse.SUPPRESS, help="store URL (default <home>/store)")
        a.set_defaults(func=func)
        return a

    action("list", cmd_list, "published versions, oldest first (* = LATEST), with their pins")
    show = action("show", cmd_show, "one version's manifest", version="optional")
    show.add_argument("--json", action="store_true", help="the manifest as stored (JSON)")
    action("verify", cmd_verify, "check every file a version reads against its sha256", version="optional")
    pin = action("pin", cmd_pin, "record that NAME relies on a version: it cannot be deleted", version="required")
    pin.add_argument("--by", required=True, metavar="NAME", help="who holds the pin (e.g. a registered model)")
    pin.add_argument("--note", help="why, for whoever reads the pin later")
    unpin = action("unpin", cmd_unpin, "remove NAME's pin", version="required")
    unpin.add_argument("--by", required=True, metavar="NAME", help="the pin's holder")
    delete = action("delete", cmd_delete, "delete a version and the files no other version uses", version="required")
    delete.add_argument("--force", action="store_true", help="delete even the LATEST version (LATEST moves back); "
                        "a pinned version is never deleted: unpin it first")
    gc = action("gc", cmd_gc, "remove what killed runs left: unpublished versions, unreferenced embedding files, "
                "staged passage parts")
    gc.add_argument("--older-than", type=float, metavar="HOURS", help="only what nothing wrote to for this many "
                    f"hours (default {CleanupConfig.model_fields['older_than_hours'].default:g}); at least "
                    f"{MIN_AGE_HOURS:g} unless --ignore-min-age; what a running build's lease holds is always kept")
    gc.add_argument("--ignore-min-age", action="store_true", help=f"allow --older-than below {MIN_AGE_HOURS:g}: "
                    "also collects what builds without a lease stopped writing minutes ago (builds holding a live "
                    "lease are still kept)")
