"""``wikirag``: the command line.  Results go to stdout, progress and logs to stderr.

Settings come from the environment (``WIKIRAG_*``, ``AWS_*``,
``MLFLOW_TRACKING_URI``, ``PREFECT_API_URL``); flags override them for one
command.  Heavy imports (prefect, dask) happen inside the commands, after the
environment is settled, because Prefect reads its settings when imported.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

from flows.settings import Settings, quiet_environment
from rag_core.errors import WikiragError

log = logging.getLogger("wikirag")


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(name)s | %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False


class _ExpectedErrorFilter(logging.Filter):
    """Bad input is explained by one line; its traceback would only bury that line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], WikiragError):
            record.exc_info = None
            record.exc_text = None
        return True


def _quiet_expected_tracebacks() -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.root, *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler):
                handler.addFilter(_ExpectedErrorFilter())


def _settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with this command's flags applied and exported for child processes."""
    overrides = {"home": getattr(args, "home", None), "store": getattr(args, "store", None),
                 "dask_address": getattr(args, "dask_address", None), "workers": getattr(args, "workers", None)}
    for key, value in overrides.items():
        if value is not None:
            os.environ[f"WIKIRAG_{key.upper()}"] = str(value)
    settings = Settings()
    os.environ.setdefault("PREFECT_HOME", str(settings.prefect_home))
    return settings


def _run_ingest(settings: Settings, config_kwargs: dict) -> str:
    from flows.prefect_api import prefect_api
    from rag_core.ingest import IngestConfig

    config = IngestConfig(**config_kwargs)
    log.info("ingesting %s into %s", config.dump, settings.store_url)
    with prefect_api(settings.prefect_home):
        from flows.ingest import dask_runner, ingest  # imports prefect: only once its API is known

        if not log.isEnabledFor(logging.DEBUG):
            _quiet_expected_tracebacks()
        runner = dask_runner(settings.dask_address, settings.workers)
        url = ingest.with_options(task_runner=runner)(config=config, store=settings.store_url)
    _log_counts(settings, url)
    return url


def _log_counts(settings: Settings, url: str) -> None:
    from rag_core.ingest import MANIFEST
    from rag_core.storage import Store

    manifest = Store(url, settings.storage_options(url)).read_json(MANIFEST)
    c = manifest["counts"]
    log.info(
        "%s pages: %s articles (%s disambiguation, %s empty skipped), %s redirects, %s other namespaces -> %s passages",
        f"{c['pages']:,}", f"{c['articles']:,}", f"{c['disambiguation']:,}", f"{c['empty']:,}",
        f"{c['redirects']:,}", f"{c['other_namespace']:,}", f"{c['passages']:,}",
    )


def cmd_ingest(args: argparse.Namespace) -> int:
    settings = _settings(args)
    url = _run_ingest(
        settings,
        {
            "dump": args.dump,
            "index": args.index,
            "words_per_passage": args.words,
            "skip_disambiguation": not args.keep_disambiguation,
            "shards": args.shards,
            "max_residue_rate": args.max_residue_rate,
        },
    )
    print(url)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """The main job on the embedded defaults: the real sample, end to end."""
    from flows.sample import fetch_sample

    settings = _settings(args)
    dump = fetch_sample(settings.home / "data")
    url = _run_ingest(settings, {"dump": str(dump)})
    log.info("done: passages of the Wikipedia sample are at %s", url)
    print(url)
    return 0


def cmd_data_sample(args: argparse.Namespace) -> int:
    from flows.sample import fetch_sample

    settings = _settings(args)
    print(fetch_sample(settings.home / "data"))
    return 0


def cmd_passages(args: argparse.Namespace) -> int:
    """List the published passage sets of a store."""
    from rag_core.ingest import PASSAGES_DIR, published_manifest
    from rag_core.storage import Store

    settings = _settings(args)
    store = Store(settings.store_url, settings.storage_options())
    names = [n for n in store.list(PASSAGES_DIR) if not n.startswith("_")]
    rows = [(n, published_manifest(store, n)) for n in names]
    rows = [(n, m) for n, m in rows if m is not None]
    if not rows:
        log.info("no published passages under %s", store.url_of(PASSAGES_DIR))
        return 0
    for name, manifest in rows:
        c = manifest["counts"]
        print(f"{name}\t{c['passages']:>10,} passages\t{c['articles']:>8,} articles\t{manifest['created_at']}\t{manifest['dump']['url']}")
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    """A persistent Prefect server for this workspace: commands then skip starting their own."""
    from flows.prefect_api import start_workspace_server, stop_workspace_server, workspace_server

    settings = _settings(args)
    home = settings.prefect_home
    if args.action == "start":
        url = start_workspace_server(home, port=args.port)
        log.info("Prefect server for %s at %s (UI at %s); stop it with `wikirag server stop`",
                 settings.home, url, url.removesuffix("/api"))
        print(url)
    elif args.action == "stop":
        log.info("stopped" if stop_workspace_server(home) else "no server was running for this workspace")
    else:
        url = workspace_server(home)
        print(url or "not running")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wikirag",
        description="Retrieval-augmented generation over Wikipedia: ingest, index, train, evaluate.",
        epilog="Settings: WIKIRAG_HOME, WIKIRAG_STORE, WIKIRAG_DASK_ADDRESS, WIKIRAG_WORKERS, AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, PREFECT_API_URL, MLFLOW_TRACKING_URI (docs/operations.md).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs and full tracebacks")
    parser.add_argument("--home", help="workspace directory (default $WIKIRAG_HOME or ~/.wikirag)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_engine(p: argparse.ArgumentParser) -> None:
        p.add_argument("--store", help="store URL: a path, file://..., or s3://bucket/prefix (default <home>/store)")
        p.add_argument("--dask-address", help="scheduler of an existing Dask cluster (default: a local cluster)")
        p.add_argument("--workers", type=int, help="workers of the local Dask cluster (default: one per core)")

    run = sub.add_parser("run", help="the main job on the embedded defaults (fetches the real sample dump)")
    with_engine(run)
    run.set_defaults(func=cmd_run)

    ingest = sub.add_parser("ingest", help="a Wikipedia dump to 100-word passages on the store")
    ingest.add_argument("dump", help="dump path or URL (.xml, .xml.bz2, multistream .xml.bz2; file://, s3://, https://)")
    ingest.add_argument("--index", help="multistream index (offset:page_id:title, .txt or .txt.bz2): parallel parsing")
    with_engine(ingest)
    ingest.add_argument("--words", type=int, default=100, help="words per passage (default 100, as DPR)")
    ingest.add_argument("--shards", type=int, default=0, help="multistream shards (default: one per 4 MiB of dump, at least 4)")
    ingest.add_argument("--keep-disambiguation", action="store_true", help="chunk disambiguation pages too")
    ingest.add_argument("--max-residue-rate", type=float, default=0.01,
                        help="gate: largest share of passages that may keep wiki markup (default 0.01)")
    ingest.set_defaults(func=cmd_ingest)

    data = sub.add_parser("data", help="sample data")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="WHAT")
    sample = data_sub.add_parser("sample", help="download and verify the real Wikipedia sample into <home>/data")
    sample.set_defaults(func=cmd_data_sample)

    server = sub.add_parser("server", help="a persistent local Prefect server (and UI) for this workspace")
    server.add_argument("action", choices=["start", "stop", "status"])
    server.add_argument("--port", type=int, default=4200, help="port on 127.0.0.1 (default 4200; 0 picks a free one)")
    server.set_defaults(func=cmd_server)

    passages = sub.add_parser("passages", help="list the published passage sets of a store")
    passages.add_argument("--store", help="store URL (default <home>/store)")
    passages.set_defaults(func=cmd_passages)
    return parser


def _exit_on_signal(signum: int, _frame: object) -> None:
    # SIGTERM and SIGHUP end the command through its finally blocks, which stop what it started.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    quiet_environment()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    try:
        return args.func(args)
    except WikiragError as exc:
        if args.verbose:
            log.exception("failed")
        print(f"wikirag: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("wikirag: interrupted; staged parts are kept and a rerun resumes", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
