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
    from rag_core.wiki.ingest import IngestConfig

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
    from rag_core.storage import Store
    from rag_core.wiki.ingest import MANIFEST

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


def _run_index_rebuild(settings: Settings, ingest_kwargs: dict, embed_kwargs: dict, index_kwargs: dict) -> str:
    from flows.prefect_api import prefect_api
    from rag_core.index.embeddings import EmbedConfig
    from rag_core.index.encoders import EncoderConfig
    from rag_core.index.faiss_index import IndexConfig
    from rag_core.wiki.ingest import IngestConfig

    ingest_config = IngestConfig(**ingest_kwargs)
    encoder = EncoderConfig(**embed_kwargs.pop("encoder", {}))
    embed = EmbedConfig(encoder=encoder, **embed_kwargs)
    index = IndexConfig(**index_kwargs)
    log.info("rebuilding the index of %s in %s (encoder %s, factory %s)", ingest_config.dump, settings.store_url,
             encoder.path or "all-MiniLM-L6-v2 (packaged)", index.factory)
    with prefect_api(settings.prefect_home):
        from flows.index_rebuild import index_rebuild
        from flows.ingest import dask_runner

        if not log.isEnabledFor(logging.DEBUG):
            _quiet_expected_tracebacks()
        runner = dask_runner(settings.dask_address, settings.workers)
        version = index_rebuild.with_options(task_runner=runner)(
            ingest_config=ingest_config, embed=embed, index=index, store=settings.store_url
        )
    _log_index(settings, version)
    return version


def _log_index(settings: Settings, version: str) -> None:
    from rag_core.index.versions import read_manifest
    from rag_core.storage import Store

    manifest = read_manifest(Store(settings.store_url, settings.storage_options()), version)
    recall = next((v for k, v in manifest["gates"].items() if k.startswith("recall:")), None)
    log.info("published index %s: %s passages in %d shards, %s, recall@10 %s; LATEST points at it",
             version, f"{manifest['count']:,}", len(manifest["shards"]), manifest["factory"],
             "n/a" if recall is None else f"{recall:.3f}")


def cmd_index_rebuild(args: argparse.Namespace) -> int:
    settings = _settings(args)
    encoder = {k: v for k, v in {"path": args.encoder, "question_path": args.question_encoder,
                                 "dtype": args.encoder_dtype}.items() if v is not None}
    index = {"factory": args.factory, "recall_target": args.recall_target}
    if args.memory_budget_gb is not None:
        index["memory_budget_bytes"] = int(args.memory_budget_gb * (1 << 30))
    version = _run_index_rebuild(settings, {"dump": args.dump, "index": args.index},
                                 {"encoder": encoder, "shards": args.shards}, index)
    print(version)
    return 0


SAMPLE_QUESTION = "Who was the teacher of Alexander the Great?"


def cmd_run(args: argparse.Namespace) -> int:
    """The main job on the embedded defaults: the real sample to a published index, then one search."""
    from flows.sample import fetch_sample
    from flows.search import answer_questions, print_results

    settings = _settings(args)
    dump = fetch_sample(settings.home / "data")
    version = _run_index_rebuild(settings, {"dump": str(dump)}, {}, {})
    results = answer_questions(settings, [SAMPLE_QUESTION], version=version, k=3)
    print_results(results, as_json=False)
    log.info("done: index %s of the Wikipedia sample is LATEST in %s; try `wikirag search \"your question\"`",
             version, settings.store_url)
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from flows.search import answer_questions, print_results, read_questions

    settings = _settings(args)
    questions = read_questions(args.questions, args.question)
    results = answer_questions(settings, questions, version=args.version, k=args.k, encoder_path=args.encoder,
                               question_encoder_path=args.question_encoder)
    print_results(results, as_json=args.json)
    return 0


def cmd_indexes(args: argparse.Namespace) -> int:
    """List published index versions, or delete one."""
    from rag_core.index.versions import delete_version, latest_version, list_versions, read_manifest
    from rag_core.storage import Store

    settings = _settings(args)
    store = Store(settings.store_url, settings.storage_options())
    if args.action == "delete":
        if not args.version:
            raise WikiragError("wikirag indexes delete: give the VERSION to delete (see `wikirag indexes list`)")
        delete_version(store, args.version, force=args.force)
        log.info("deleted index version %s; LATEST is %s", args.version, latest_version(store) or "unset")
        return 0
    latest = latest_version(store)
    versions = list_versions(store)
    if not versions:
        log.info("no published index under %s", store.url_of("indexes"))
    for version in versions:
        m = read_manifest(store, version)
        mark = "*" if version == latest else " "
        print(f"{mark} {version}\t{m['count']:>10,} passages\t{len(m['shards'])} shards\t{m['factory']}\t"
              f"{m['encoder']['name']} ({m['fingerprint_id']})\t{m['dump_id']}")
    return 0


def cmd_data_sample(args: argparse.Namespace) -> int:
    from flows.sample import fetch_sample

    settings = _settings(args)
    print(fetch_sample(settings.home / "data"))
    return 0


def cmd_passages(args: argparse.Namespace) -> int:
    """List the published passage sets of a store."""
    from rag_core.storage import Store
    from rag_core.wiki.ingest import PASSAGES_DIR, published_manifest

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

    rebuild = sub.add_parser("index-rebuild", help="a dump to a published index version: ingest, embed, index, "
                             "gate, publish (prints the version)")
    rebuild.add_argument("dump", help="dump path or URL (.xml, .xml.bz2, multistream .xml.bz2; file://, s3://, https://)")
    rebuild.add_argument("--index", help="multistream index of the dump (parallel parsing)")
    with_engine(rebuild)
    rebuild.add_argument("--encoder", help="local encoder directory (DPR context encoder or a sentence encoder; "
                         "default: the packaged all-MiniLM-L6-v2)")
    rebuild.add_argument("--question-encoder", help="DPR question encoder directory (with a DPR --encoder)")
    rebuild.add_argument("--encoder-dtype", choices=["float32", "bfloat16"],
                         help="weights dtype (default bfloat16; use float32 on CPUs without AMX/AVX512-BF16)")
    rebuild.add_argument("--factory", default="auto", help="FAISS factory: Flat, HNSW32, IVF4096,PQ48, "
                         "OPQ48,IVF4096,PQ48, or auto (default: chosen from size, memory budget and recall target)")
    rebuild.add_argument("--shards", type=int, default=0, help="index shards (default: one per 20,000 passages, at least 4)")
    rebuild.add_argument("--recall-target", type=float, default=0.95, help="gate: held-out recall@10 (default 0.95)")
    rebuild.add_argument("--memory-budget-gb", type=float, help="auto: RAM the whole index may take (default: no limit)")
    rebuild.set_defaults(func=cmd_index_rebuild)

    search = sub.add_parser("search", help="top-k passages for questions from a published index version")
    search.add_argument("question", nargs="*", help="questions, one per argument")
    search.add_argument("--questions", metavar="FILE", help="a file with one question per line ('-' for stdin)")
    search.add_argument("--store", help="store URL (default <home>/store)")
    search.add_argument("--version", help="index version (default: LATEST)")
    search.add_argument("--dask-address", help="search with the shards held by this Dask cluster's workers "
                        "(default $WIKIRAG_DASK_ADDRESS; unset: in this process)")
    search.add_argument("-k", type=int, default=5, help="passages per question (default 5)")
    search.add_argument("--json", action="store_true", help="one JSON line per question, in input order")
    search.add_argument("--encoder", help="query encoder directory (default: the one recorded in the index)")
    search.add_argument("--question-encoder", help="DPR question encoder directory (default: recorded in the index)")
    search.set_defaults(func=cmd_search)

    indexes = sub.add_parser("indexes", help="list index versions (* = LATEST) or delete one")
    indexes.add_argument("action", nargs="?", choices=["list", "delete"], default="list")
    indexes.add_argument("version", nargs="?", help="the version to delete")
    indexes.add_argument("--force", action="store_true", help="delete even the LATEST version (LATEST moves back)")
    indexes.add_argument("--store", help="store URL (default <home>/store)")
    indexes.set_defaults(func=cmd_indexes)

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
    from flows import ask, models  # noqa: E402  (their commands live in their modules)

    ask.add_parser(sub), models.add_parser(sub)
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
