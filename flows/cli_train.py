"""``wikirag finetune`` and ``wikirag evaluate``: training and evaluation runs, tracked in MLflow, as Prefect flows."""

from __future__ import annotations

import argparse
import json
import logging

from flows.settings import Settings
from rag_core.train.loaders import TASK_KINDS

log = logging.getLogger("wikirag")


def cmd_evaluate(args: argparse.Namespace, settings: Settings) -> int:
    from flows.cli import quiet_expected_tracebacks
    from flows.prefect_api import prefect_api

    log.info("evaluating %s on %s (%s) with MLflow at %s", args.model, args.dev, args.task, settings.tracking_uri)
    with prefect_api(settings.prefect_home):
        from flows.evaluate import evaluate_registered

        quiet_expected_tracebacks()
        metrics = evaluate_registered(args.model, args.task, args.dev, settings.tracking_uri,
                                      settings.store_access(), args.index, args.closed_book)
    print(json.dumps(metrics, sort_keys=True))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    kinds = sorted(TASK_KINDS)
    evaluate = sub.add_parser("evaluate", help="a registered model on a task's dev set (any index version: the "
                              "knowledge hot-swap), recorded in MLflow")
    evaluate.add_argument("--model", required=True, help="model URI, e.g. models:/wikirag-nq@champion")
    evaluate.add_argument("--task", required=True, choices=kinds, help="the dev file's task kind")
    evaluate.add_argument("--dev", required=True, help="dev file (path or URL) in the task's original format")
    evaluate.add_argument("--index", help="index version to retrieve from (default: the one the model is bound to)")
    evaluate.add_argument("--closed-book", action="store_true", help="the generator alone, no retrieval")
    evaluate.add_argument("--store", help="store URL (default <home>/store)")
    evaluate.set_defaults(func=cmd_evaluate)
