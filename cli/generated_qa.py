"""``wikirag generated-qa``: the generated-QA dataset of an index version, made (or found) and described."""

from __future__ import annotations

import argparse
import logging

from cli.options import add_store, config_option, given
from rag_core.errors import WikiragError
from rag_core.train.generated_qa import GeneratedQAConfig
from runtime.settings import Settings

log = logging.getLogger("wikirag")


def cmd_generated_qa(args: argparse.Namespace, settings: Settings) -> int:
    from cli.flow_runs import import_flow, quiet_expected_tracebacks
    from runtime.prefect_server import prefect_api
    config = GeneratedQAConfig(**given(args, shards="shards", top_k="top_k", subject_share="subject_share",
                                       target="target"))
    if args.reader:
        config = config.model_copy(update={"reader": "generator", "generator": args.reader})
    if args.generator:
        config = config.model_copy(update={"generator": args.generator})
    if config.target == "reader-lead" and not config.generator:
        raise WikiragError("generated-qa --target reader-lead: the reader's words come from a generator; give its "
                           "folder with --generator DIR, or with --reader DIR (which also drops the pairs it does "
                           "not answer)")
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
    p.add_argument("--index", "--version", dest="index", metavar="VERSION", help="index version (default: LATEST)")
    p.add_argument("--dev", action="append", default=[], metavar="FILE", help="dev questions no pair may repeat "
                   "(JSON lines or array with a question field, or CuratedTrec tsv); repeatable")
    p.add_argument("--test", action="append", default=[], metavar="FILE", help="test questions, as --dev")
    config_option(p, "--shards", GeneratedQAConfig, "shards", "passage shards mapped on Dask (default {default})")
    config_option(p, "--top-k", GeneratedQAConfig, "top_k", "round trip: a question must retrieve its passage in "
                  "the top k (default {default})")
    p.add_argument("--reader", metavar="DIR", help="round trip: also ask the decoder-only generator in DIR to "
                   "answer each question from its best passage (off by default: CPU generation is slow)")
    config_option(p, "--subject-share", GeneratedQAConfig, "subject_share", "kept pairs answered by their page's "
                  "own subject at most this share (default {default}: no cap)")
    config_option(p, "--target", GeneratedQAConfig, "target", "what each pair trains toward: its answer span, or "
                  "the reader's own reply to it cut after the answer (reader-lead; needs a generator) "
                  "(default {default})")
    p.add_argument("--generator", metavar="DIR", help="the decoder-only generator whose words reader-lead targets "
                   "use, without the reader check (default: the --reader folder)")
    add_store(p)
    p.set_defaults(func=cmd_generated_qa)
