"""``wikirag``: the command line.  Results go to stdout, progress and logs to stderr.

Settings come from the environment (``WIKIRAG_*``, ``AWS_*``,
``MLFLOW_TRACKING_URI``, ``PREFECT_API_URL``), read once in :func:`main`;
flags override them for one command without touching the environment. Every
default shown by ``--help`` is read from the config class that owns it.
A command is one function ``cmd_*(args, settings) -> exit status``; its
parser is built by one ``add_*`` function. Heavy imports (prefect, dask)
happen inside the commands, after the environment is settled, because
Prefect reads its settings when imported.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import signal
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cli.flow_runs import import_flow, quiet_expected_tracebacks
from cli.options import add_engine, add_nproc, add_store, config_option, default, given, train_layers
from cli.plan import add_budget_options, check_rebuild_fits
from rag_core.errors import WikiragError
from rag_core.index.plan import GateConfig
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.encoders import EncoderConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.index.manifest import describe_errors
from rag_core.train.jobs import ShortRun
from rag_core.wiki.ingest import IngestConfig
from runtime import stop_signals
from runtime.process_tuning import end_command, start_process
from runtime.settings import Settings, quiet_environment
from tasks.adapters.index_queries import MAX_K, SearchConfig

log = logging.getLogger("wikirag")


class _StderrHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr``: one bound at install time may be closed by then (an in-process call)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _configure_logging(verbose: bool) -> None:
    for old in [h for h in log.handlers if isinstance(h, _StderrHandler)]:
        log.removeHandler(old)  # main() called twice in one process logs each line once
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s | %(name)s | %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False


def read_settings(args: argparse.Namespace) -> Settings:
    """The environment's settings with this command's flags applied (the environment itself is left alone)."""
    return Settings(**given(args, home="home", store="store", dask_address="dask_address", workers="workers"))


# -- ingest and index-rebuild --------------------------------------------------------------
def ingest_config(args: argparse.Namespace) -> IngestConfig:
    return IngestConfig(dump=args.dump, **given(args, index="index", words_per_passage="words", shards="ingest_shards",
                                                skip_disambiguation="skip_disambiguation",
                                                max_residue_rate="max_residue_rate"))


def rebuild_configs(args: argparse.Namespace) -> tuple[IngestConfig, EmbedConfig, IndexConfig, GateConfig]:
    """The flow's four configs from the flags given; a flag not given leaves the config's default."""
    encoder = EncoderConfig(**given(args, path="encoder", question_path="question_encoder", dtype="encoder_dtype",
                                   engine="encoder_engine"))
    index = given(args, factory="factory", recall_target="recall_target")
    if args.memory_budget_gb is not None:
        index["memory_budget_bytes"] = int(args.memory_budget_gb * (1 << 30))
    return (IngestConfig(dump=args.dump, **given(args, index="index")),
            EmbedConfig(encoder=encoder, **given(args, shards="shards")), IndexConfig(**index),
            GateConfig(**given(args, recall_queries="recall_queries")))


def check_local_dump(dump: str) -> None:
    """A local dump that is missing or is neither XML nor bz2 is refused here, in one line naming it, before a
    Prefect server and a Dask cluster start; a remote one is read by the flow, whose first request checks the
    same."""
    from rag_core.wiki.dumps import DumpSource, sniff_compression

    if "://" in dump and not dump.startswith("file://"):
        return
    with DumpSource(dump).open() as head:
        sniff_compression(head.read(1 << 16), dump)


def run_ingest(settings: Settings, config: IngestConfig) -> str:
    from runtime.prefect_server import prefect_api

    log.info("ingesting %s into %s", config.dump, settings.store_url)
    with prefect_api(settings.prefect_home, meanwhile=import_flow("flows.ingest")):
        from runtime.dask_runner import dask_runner
        from flows.ingest import ingest  # imports prefect: only once its API is known

        if not log.isEnabledFor(logging.DEBUG):
            quiet_expected_tracebacks()
        runner = dask_runner(settings.dask_address, settings.workers)
        url = ingest.with_options(task_runner=runner)(config=config, store=settings.store_access())
    _log_counts(settings, url)
    return url


def _log_counts(settings: Settings, url: str) -> None:
    from rag_core.wiki.ingest import MANIFEST

    c = settings.open_store(url).read_json(MANIFEST)["counts"]
    log.info(
        "%s pages: %s articles (%s disambiguation, %s empty skipped), %s redirects, %s other namespaces -> %s passages",
        f"{c['pages']:,}", f"{c['articles']:,}", f"{c['disambiguation']:,}", f"{c['empty']:,}",
        f"{c['redirects']:,}", f"{c['other_namespace']:,}", f"{c['passages']:,}",
    )


def warm_encoder(embed: EmbedConfig) -> None:
    """Load the passage encoder that the index plan fingerprints in this process, e.g. while a Prefect server boots.

    ``load_encoder`` keeps it per process, so the plan then finds it loaded: a fresh server's boot (~15 s on
    2 cores) hides the imports and the weights' load and hash (~7 s), and a bad encoder path fails before any flow.
    """
    from rag_core.index.plan import load_encoder

    load_encoder(embed.encoder)


def run_index_rebuild(settings: Settings, configs: tuple[IngestConfig, EmbedConfig, IndexConfig, GateConfig]) -> str:
    from runtime.prefect_server import prefect_api

    ingest, embed, index, gate = configs
    log.info("rebuilding the index of %s in %s (encoder %s, factory %s)", ingest.dump, settings.store_url,
             embed.encoder.path or "all-MiniLM-L6-v2 (packaged)", index.factory)
    def meanwhile() -> None:
        warm_encoder(embed)
        importlib.import_module("flows.index_rebuild")

    with prefect_api(settings.prefect_home, meanwhile=meanwhile):
        from flows.index_rebuild import index_rebuild
        from runtime.dask_runner import dask_runner

        if not log.isEnabledFor(logging.DEBUG):
            quiet_expected_tracebacks()
        runner = dask_runner(settings.dask_address, settings.workers)
        version = index_rebuild.with_options(task_runner=runner)(
            ingest_config=ingest, store=settings.store_access(), embed=embed, index=index, gate=gate)
    report_published(settings, version)
    return str(version)


def report_published(settings: Settings, version: str) -> None:
    """Log what the rebuild published and where LATEST stands.

    From what publishing returned (:class:`~rag_core.index.versions.PublishedVersion`): a store that fails right
    after LATEST moved leaves the version published, and the run must say so, not fail. A rerun that found LATEST
    already up to date returns its name only; its summary is read from the store, and a store failing then is a
    warning, not a failure: the version is published either way.
    """
    from rag_core.index.versions import PublishedVersion, latest_version, read_index_manifest

    if isinstance(version, PublishedVersion):
        manifest, latest = version.manifest, version.latest
    else:
        try:
            store = settings.open_store()
            manifest, latest = read_index_manifest(store, version), latest_version(store)
        except WikiragError as exc:
            log.warning("index %s is published; its summary could not be read: %s", version, exc)
            return
    recall = next((v for k, v in manifest.gates.items() if k.startswith("recall:")), None)
    where = "LATEST points at it" if latest == version else f"LATEST stays on {latest} (newer)"
    log.info("published index %s: %s passages in %d shards, %s, recall@10 %s; %s", version, f"{manifest.count:,}",
             len(manifest.shards), manifest.factory, "n/a" if recall is None else f"{recall:.3f}", where)


def cmd_ingest(args: argparse.Namespace, settings: Settings) -> int:
    config = ingest_config(args)
    check_local_dump(config.dump)
    print(run_ingest(settings, config))
    return 0


def cmd_index_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    configs = rebuild_configs(args)
    check_local_dump(configs[0].dump)
    check_rebuild_fits(args, settings, configs[1], configs[2])
    print(run_index_rebuild(settings, configs))
    return 0




def _log_hardware() -> None:
    """The machine and the dtype models get on it (each worker decides again, for its own CPU)."""
    from rag_core.perf.cpu import describe
    from rag_core.perf.precision import choose_precision

    log.info("hardware: %s", describe().line())
    choose_precision("auto", "cpu")  # logs the dtype and why


def short_run_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The main job's fine-tune fields (flows.pipeline.ShortRun) that ``wikirag run``'s flags set."""
    fields = given(args, max_steps="max_steps", train_layers="train_layers")
    if fields.get("train_layers") == "all":
        fields["train_layers"] = None  # ShortRun: None = every parameter
    return fields


PUBLIC_QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "qa"  # beside a project checkout


def public_questions(given_dir: str | None) -> str | None:
    """``--public-questions``: the folder given (it must exist), else PUBLIC_QUESTIONS when present, else None."""
    if given_dir is None:
        return str(PUBLIC_QUESTIONS) if PUBLIC_QUESTIONS.is_dir() else None
    if not Path(given_dir).is_dir():
        raise WikiragError(f"--public-questions {given_dir}: no such folder; give one holding nq_open/, "
                           "webquestions/ or curatedtrec/, or leave it out")
    return given_dir


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """The main job on the embedded defaults: the real sample to a registered model answering questions."""
    from runtime.default_generator import fetch_default_generator, resolve_generator
    from runtime.prefect_server import prefect_api, workspace_server
    from runtime.sample_dump import fetch_sample

    qa_dir = public_questions(args.public_questions)  # a wrong folder stops here, before anything runs
    if args.dump:
        check_local_dump(args.dump)
    _log_hardware()
    persistent = os.environ.get("PREFECT_API_URL") or workspace_server(settings.prefect_home)
    inputs: dict[str, str] = {}

    def fetch_inputs() -> None:  # while a Prefect server started for this run boots
        inputs["dump"] = str(args.dump or fetch_sample(settings.home / "data"))
        inputs["generator"] = str(resolve_generator(settings.home, args.generator) if args.generator else
                                  fetch_default_generator(settings.home))
        from flows.pipeline import EMBED  # imports Prefect: its API URL is already set here

        warm_encoder(EMBED)

    where = {"store": settings.store_url,
             "MLflow UI": f"mlflow ui --backend-store-uri {settings.tracking_uri} --host 127.0.0.1",
             **({"Prefect UI": persistent.removesuffix("/api")} if persistent else
                {"Prefect UI (a server kept for the next runs)": "wikirag server start"})}
    with prefect_api(settings.prefect_home, meanwhile=fetch_inputs):
        from flows.pipeline import pipeline
        from tasks.reports import ASK, ASK_KEY

        where[ASK_KEY] = ASK.replace("wikirag ", f"wikirag --home {args.home} ", 1) if args.home else ASK
        if not log.isEnabledFor(logging.DEBUG):
            quiet_expected_tracebacks()
        summary = pipeline(dump=inputs["dump"], store=settings.store_access(),
                           tracking_uri=settings.tracking_uri, generator=inputs["generator"],
                           report_dir=str(settings.home / "reports"),
                           run=ShortRun(**short_run_fields(args)), nproc=args.nproc,
                           public_questions=qa_dir,
                           dask_address=settings.dask_address, workers=settings.workers, where=where)
    print(summary.markdown)
    return 0


def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    from cli.search import print_results, read_questions
    from tasks.adapters.index_queries import answer_questions

    questions = read_questions(args.questions, args.question)
    config = SearchConfig(**given(args, k="k", version="version", encoder_path="encoder",
                                  question_encoder_path="question_encoder"))
    print_results(answer_questions(settings.open_store(), questions, config, dask_address=settings.dask_address),
                  as_json=args.json)
    return 0


def cmd_data_sample(args: argparse.Namespace, settings: Settings) -> int:
    from runtime.sample_dump import fetch_sample

    print(fetch_sample(settings.home / "data"))
    return 0


def cmd_passages(args: argparse.Namespace, settings: Settings) -> int:
    """List the published passage sets of a store."""
    from rag_core.wiki.ingest import PASSAGES_DIR, published_manifest

    store = settings.open_store()
    names = [n for n in store.list(PASSAGES_DIR) if not n.startswith("_")]
    rows = [(n, m) for n in names if (m := published_manifest(store, n)) is not None]
    if not rows:
        log.info("no published passages under %s", store.url_of(PASSAGES_DIR))
    for name, manifest in rows:
        c = manifest["counts"]
        print(f"{name}\t{c['passages']:>10,} passages\t{c['articles']:>8,} articles\t{manifest['created_at']}\t"
              f"{manifest['dump']['url']}")
    return 0


def cmd_server(args: argparse.Namespace, settings: Settings) -> int:
    """A persistent Prefect server for this workspace: commands then skip starting their own."""
    from runtime.prefect_server import start_workspace_server, stop_workspace_server, workspace_server

    home = settings.prefect_home
    if args.action == "start":
        url = start_workspace_server(home, **given(args, port="port"))
        log.info("Prefect server for %s at %s (UI at %s); stop it with `wikirag server stop`",
                 settings.home, url, url.removesuffix("/api"))
        print(url)
    elif args.action == "stop":
        log.info("stopped" if stop_workspace_server(home) else "no server was running for this workspace")
    else:
        print(workspace_server(home) or "not running")
    return 0


# -- the parser ----------------------------------------------------------------------------
def add_ingest(sub: Any) -> None:
    p = sub.add_parser("ingest", help="a Wikipedia dump to 100-word passages on the store")
    p.add_argument("dump", help="dump path or URL (.xml, .xml.bz2, multistream .xml.bz2; file://, s3://, https://)")
    p.add_argument("--index", help="multistream index (offset:page_id:title, .txt or .txt.bz2): parallel parsing")
    add_engine(p)
    p.add_argument("--words", type=int, help=f"words per passage (default {default(IngestConfig, 'words_per_passage')}"
                   ", as DPR)")
    p.add_argument("--shards", type=int, dest="ingest_shards", help="multistream shards (default "
                   f"{default(IngestConfig, 'shards')}: one per 8 MiB of dump, at least 4)")
    p.add_argument("--keep-disambiguation", action="store_const", const=False, dest="skip_disambiguation",
                   help="chunk disambiguation pages too (default: "
                   f"{'skip' if default(IngestConfig, 'skip_disambiguation') else 'keep'} them)")
    p.add_argument("--max-residue-rate", type=float, help="gate: largest share of passages that may keep wiki "
                   f"markup (default {default(IngestConfig, 'max_residue_rate')})")
    p.set_defaults(func=cmd_ingest)


def add_index_rebuild(sub: Any) -> None:
    p = sub.add_parser("index-rebuild", help="a dump to a published index version: ingest, embed, index, gate, "
                       "publish (prints the version)")
    p.add_argument("dump", help="dump path or URL (.xml, .xml.bz2, multistream .xml.bz2; file://, s3://, https://)")
    p.add_argument("--index", help="multistream index of the dump (parallel parsing)")
    add_engine(p)
    p.add_argument("--encoder", help="local encoder directory (DPR context encoder or a sentence encoder; "
                   "default: the packaged all-MiniLM-L6-v2)")
    p.add_argument("--question-encoder", help="DPR question encoder directory (with a DPR --encoder)")
    p.add_argument("--encoder-dtype", choices=typing.get_args(EncoderConfig.model_fields["dtype"].annotation),
                   help=f"weights dtype (default {default(EncoderConfig, 'dtype')}: "
                   f"{EncoderConfig.model_fields['dtype'].description.split('auto = ', 1)[-1]})")
    p.add_argument("--encoder-engine", choices=typing.get_args(EncoderConfig.model_fields["engine"].annotation),
                   help=f"what runs the passage encoder (default {default(EncoderConfig, 'engine')}: "
                   f"{EncoderConfig.model_fields['engine'].description.split('auto = ', 1)[-1]})")
    p.add_argument("--factory", help="FAISS factory: Flat, HNSW32, IVF4096,PQ48, OPQ48,IVF4096,PQ48, or auto "
                   f"(default {default(IndexConfig, 'factory')}: chosen from size, memory budget and recall target)")
    p.add_argument("--shards", type=int, help=f"index shards (default: one per "
                   f"{default(EmbedConfig, 'passages_per_shard'):,} passages, at least {default(EmbedConfig, 'min_shards')})")
    p.add_argument("--recall-target", type=float, help="gate: held-out recall@10 against exact search "
                   f"(default {default(IndexConfig, 'recall_target')})")
    p.add_argument("--recall-queries", type=int, help="gate: held-out queries, over all shards "
                   f"(default {default(GateConfig, 'recall_queries')})")
    budget = default(IndexConfig, "memory_budget_bytes")
    p.add_argument("--memory-budget-gb", type=float, help="auto: RAM the whole index may take, in GiB (default: "
                   f"{'no limit' if budget is None else f'{budget / (1 << 30):g}'})")
    add_budget_options(p)  # any of them: the capacity plan is checked before any work (as `wikirag plan`)
    p.set_defaults(func=cmd_index_rebuild)


def add_search(sub: Any) -> None:
    p = sub.add_parser("search", help="top-k passages for questions from a published index version")
    p.add_argument("question", nargs="*", help="questions, one per argument")
    p.add_argument("--questions", metavar="FILE", help="a file with one question per line ('-' for stdin)")
    add_store(p)
    p.add_argument("--version", help="index version (default: LATEST)")
    p.add_argument("--dask-address", help="search with the shards held by this Dask cluster's workers "
                   "(default $WIKIRAG_DASK_ADDRESS; unset: in this process)")
    p.add_argument("-k", type=int, help=f"passages per question (default {default(SearchConfig, 'k')}, at most {MAX_K})")
    p.add_argument("--json", action="store_true", help="one JSON line per question, in input order")
    p.add_argument("--encoder", help="query encoder directory (default: the one recorded in the index)")
    p.add_argument("--question-encoder", help="DPR question encoder directory (default: recorded in the index)")
    p.set_defaults(func=cmd_search)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wikirag",
        description="Retrieval-augmented generation over Wikipedia: ingest, index, train, evaluate.",
        epilog="Settings: WIKIRAG_HOME, WIKIRAG_STORE, WIKIRAG_STORE_RETRIES, WIKIRAG_LEASE_TTL_S, "
        "WIKIRAG_DASK_ADDRESS, WIKIRAG_WORKERS, WIKIRAG_PERF, WIKIRAG_PROCESS_TUNING, AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, PREFECT_API_URL, MLFLOW_TRACKING_URI "
        "(docs/operations.md).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logs and full tracebacks")
    parser.add_argument("--home", help=f"workspace directory (default $WIKIRAG_HOME or {default(Settings, 'home')})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_parser(sub)
    from cli import ask, dumps, generated_qa, indexes, models, plan, refresh, services, train

    for module in (indexes, ask, generated_qa, train, models, refresh, dumps, services, plan):
        module.add_parser(sub)
    _verbose_after_commands(parser, set())
    return parser


def _verbose_after_commands(parser: argparse.ArgumentParser, seen: set[int]) -> None:
    """``-v`` after a command too (``wikirag ingest DUMP -v``), at every level; SUPPRESS keeps one given before
    the command from being reset by the command's parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if id(child) not in seen:  # an alias maps to the same parser
                    seen.add(id(child))
                    child.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                       help="debug logs and full tracebacks (also before the command)")
                    _verbose_after_commands(child, seen)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """This module's commands: run, ingest, index-rebuild, search, data, server, passages."""

    run = sub.add_parser("run", help="the main job on the embedded defaults: the real sample dump to an index, "
                         "question-answer pairs generated from it, a fine-tuned wikirag-qa model gated on real "
                         "held-out questions, and its answers (fetches the sample and the generator)")
    add_engine(run)
    config_option(run, "--max-steps", ShortRun, "max_steps", "fine-tuning steps (default {default}: minutes on 2 "
                  "cores)")
    config_option(run, "--train-layers", ShortRun, "train_layers", "generator decoder blocks the fine-tune trains, "
                  "the last ones, or all of them (default {default} of SmolLM2's 30: about 2/3 of the step time of "
                  "all)", type=train_layers, metavar="N|all")
    add_nproc(run, "DDP processes for fine-tuning (default {default})")
    run.add_argument("--generator", metavar="DIR", help="generator folder, seq2seq or decoder-only (default: "
                     "SmolLM2-135M-Instruct, fetched once by `wikirag models fetch`)")
    run.add_argument("--dump", metavar="PATH", help="a Wikipedia dump (path or URL, as `ingest` takes) to run on "
                     "instead of the fetched sample")
    run.add_argument("--public-questions", metavar="DIR", help="a folder of NQ-open/WebQuestions/CuratedTrec "
                     "files (nq_open/, webquestions/, curatedtrec/) whose questions the index answers join the "
                     "written ones that gate wikirag-qa (default: ../shared/data/qa beside the checkout, when "
                     "present)")
    run.set_defaults(func=cmd_run)
    add_ingest(sub)
    add_index_rebuild(sub)
    add_search(sub)

    data = sub.add_parser("data", help="sample data")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="WHAT")
    sample = data_sub.add_parser("sample", help="download and verify the real Wikipedia sample into <home>/data")
    sample.set_defaults(func=cmd_data_sample)

    from runtime.prefect_server import start_workspace_server

    port = inspect.signature(start_workspace_server).parameters["port"].default
    server = sub.add_parser("server", help="a persistent local Prefect server (and UI) for this workspace")
    server.add_argument("action", choices=["start", "stop", "status"],
                        help="start: one that commands of this workspace then reuse (prints its API URL); stop: it; "
                        "status: its API URL, or 'not running'")
    server.add_argument("--port", type=int, help=f"port on 127.0.0.1 (default {port}; 0 picks a free one)")
    server.set_defaults(func=cmd_server)

    passages = sub.add_parser("passages", help="list the published passage sets of a store")
    add_store(passages)
    passages.set_defaults(func=cmd_passages)


def _exit_on_signal(signum: int, _frame: object) -> None:
    # SIGTERM and SIGHUP end the command through its finally blocks, which stop what it started.
    raise SystemExit(128 + signum)


def _validation_text(exc: ValidationError, argv: Sequence[str] | None) -> str:
    """A refused value in the words the user gave it: the flag on the command line that carried exactly that value
    (``-k 0: Input should be greater than or equal to 1``), or the environment variable of a setting; else the
    model's field (a flag named otherwise than its field, a value that came from elsewhere)."""
    given = list(sys.argv[1:] if argv is None else argv)
    parts = []
    for error in exc.errors()[:3]:
        field = str(error["loc"][0]) if error["loc"] else ""
        value = error.get("input")
        said = [i for i, word in enumerate(given[:-1]) if field and word in (f"--{field.replace('_', '-')}",
                                                                             f"-{field}")]
        setting = Settings.model_fields.get(field) if exc.title in ("Settings", "Switches") else None
        if said and given[said[-1] + 1] == str(value):  # argparse keeps a repeated flag's last value
            parts.append(f"{given[said[-1]]} {value}: {error['msg']}")
        elif setting is not None:
            parts.append(f"{setting.validation_alias or 'WIKIRAG_' + field.upper()}={value!r}: {error['msg']}")
        else:
            return f"{exc.title}: {describe_errors(exc)}"
    return "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    quiet_environment()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    with stop_signals.recording():
        try:
            settings = read_settings(args)
            start_process(settings)
            # Prefect takes its home only from the environment, when first imported; Dask workers inherit it.
            os.environ.setdefault("PREFECT_HOME", str(settings.prefect_home))
            return args.func(args, settings)
        except (WikiragError, ValidationError) as exc:
            if args.verbose:
                log.exception("failed")
            text = _validation_text(exc, argv) if isinstance(exc, ValidationError) else str(exc)
            print(f"wikirag: error: {text}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("wikirag: interrupted; staged parts are kept and a rerun resumes", file=sys.stderr)
            return 130
        except Exception:
            # A stop signal whose exception library code turned into an error of its own: still a stop.
            if (signum := stop_signals.received()) is None:
                raise
            if args.verbose:
                log.exception("stopped")
            how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
            print(f"wikirag: {how}; staged parts are kept and a rerun resumes", file=sys.stderr)
            return 128 + signum


# Commands that only read: after their one-line error nothing is left to clean up, so their process ends without
# the interpreter's teardown, where a native library's thread (FAISS, Arrow) could abort it after the line and turn
# exit 2 into 134. A group whose actions differ names the reading action alone (``dumps mirror`` runs a flow).
READ_ONLY_COMMANDS = frozenset({"search", "ask", "indexes", "dumps check"})


def read_only(args: argparse.Namespace) -> bool:
    """Whether the parsed command (or its group's action) is one of READ_ONLY_COMMANDS."""
    return args.command in READ_ONLY_COMMANDS or f"{args.command} {getattr(args, 'action', '')}" in READ_ONLY_COMMANDS


def entry(argv: Sequence[str] | None = None) -> None:
    """The ``wikirag`` program: :func:`main` (which tests call in process), then the exit."""
    argv = sys.argv[1:] if argv is None else list(argv)
    code = main(argv)
    stop_signals.exit_by_the_deadline()  # a stopped command's teardown is bound by its stop's deadline too
    # the parser's own reading (a global option's value, as in `--home DIR search`, is no command)
    skip_teardown = code == 2 and read_only(build_parser().parse_args(argv))
    end_command(code, skip_teardown=skip_teardown)


if __name__ == "__main__":
    entry()
