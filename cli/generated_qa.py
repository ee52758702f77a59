"""``wikirag generated-qa``: the generated-QA dataset of an index version, made (or found) and described."""

from __future__ import annotations

import argparse
import logging

from cli.options import add_store, config_option, given
from rag_core.train.generated_qa import GeneratedQAConfig
from runtime.settings import Settings

log = logging.getLogger("wikirag")


def cmd_generated_qa(args: argparse.Namespace, settings: Settings) -> int:
    from cli.flow_runs import import_flow, quiet_expected_tracebacks
    from runtime.prefect_server import prefect_api
    config = GeneratedQAConfig(**given(args, shards="shards", top_k="top_k"))
    if args.reader:
        config = config.model_copy(update={"reader": "generator", "generator": args.reader})
    held_out_files = [*args.dev, *args.test]
    with prefect_api(settings.prefect_home, meanwhile=import_flow("flows.generated_qa")):
        from flows.generated_qa import generated_qa_on

        quiet_expected_tracebacks()
        outcome = generated_qa_on(settings, args.index, config, held_out_files)
    log.info("%s generated QA of index %s: %s", "reused" if outcome.reused else "published", outcome.index_version,
             outcome.url)
    print(outcome.model_dump_json())
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generated-qa", help="question-answer pairs made from an index's own passages (rules, then a "
                       "retrieval round trip), deduplicated against dev/test questions, gated and published once")
    p.add_argument("--index", metavar="VERSION", help="index version (default: LATEST)")
    p.add_argument("--dev", action="append", default=[], metavar="FILE", help="dev questions no pair may repeat "
                   "(JSON lines or array with a question field, or CuratedTrec tsv); repeatable")
    p.add_argument("--test", action="append", default=[], metavar="FILE", help="test questions, as --dev")
    config_option(p, "--shards", GeneratedQAConfig, "shards", "passage shards mapped on Dask (default {default})")
    config_option(p, "--top-k", GeneratedQAConfig, "top_k", "round trip: a question must retrieve its passage in "
                  "the top k (default {default})")
    p.add_argument("--reader", metavar="DIR", help="round trip: also ask the decoder-only generator in DIR to "
                   "answer each question from its best passage (off by default: CPU generation is slow)")
    add_store(p)
    p.set_defaults(func=cmd_generated_qa)
