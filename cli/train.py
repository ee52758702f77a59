"""``wikirag finetune`` and ``wikirag evaluate``: training and evaluation runs, tracked in MLflow, as Prefect flows."""

from __future__ import annotations

import argparse
import json
import logging

from cli.options import add_nproc, add_store, config_option, data_file, train_layers
from rag_core.errors import WikiragError
from rag_core.train.jobs import TRAINED_BLOCKS, FinetuneRequest, PromotionGate, ShortRun
from rag_core.train.loaders import TASK_KINDS
from rag_core.train.train_config import TrainConfig
from runtime.settings import Settings

log = logging.getLogger("wikirag")


def cmd_evaluate(args: argparse.Namespace, settings: Settings) -> int:
    from cli.flow_runs import import_flow, quiet_expected_tracebacks
    from runtime.prefect_server import prefect_api

    if args.dev is None and args.task != "cloze":
        raise WikiragError(f"--task {args.task} needs --dev FILE (only cloze draws its own held-out questions)")
    log.info("evaluating %s on %s (%s) with MLflow at %s", args.model, args.dev or "its held-out cloze questions",
             args.task, settings.tracking_uri)
    with prefect_api(settings.prefect_home, meanwhile=import_flow("flows.evaluate")):
        from flows.evaluate import evaluate_registered

        quiet_expected_tracebacks()
        metrics = evaluate_registered(args.model, args.task, args.dev, settings.tracking_uri,
                                      settings.store_access(), args.index, args.closed_book)
    print(json.dumps(metrics, sort_keys=True))
    return 0


def finetune_request(args: argparse.Namespace, settings: Settings) -> dict:
    """The flow's request for one task from the command line (the recipe keeps its defaults unless a flag is given)."""
    from runtime.default_generator import resolve_generator

    if args.task not in ("cloze", "generated-qa") and not (args.train and args.dev):
        raise WikiragError(f"--task {args.task} needs --train FILE and --dev FILE (only cloze and generated-qa make "
                           "their own questions from the index)")
    recipe = {name: value for name, value in (("kind", args.kind), ("max_steps", args.max_steps),
                                              ("batch_size", args.batch_size), ("lr", args.lr),
                                              ("n_docs", args.n_docs), ("weight_mix", args.weight_mix))
              if value is not None}
    layers = TRAINED_BLOCKS if args.train_layers is None else args.train_layers
    recipe["train_generator_layers"] = None if layers == "all" else layers
    recipe["generator"] = str(resolve_generator(settings.home, args.generator))
    recipe["max_dev_examples"] = args.eval_examples  # the recipe's dev-loss passes too: every evaluation is bounded
    return {"task": args.task, "train": args.train, "dev": args.dev, "recipe": recipe,
            "eval_examples": args.eval_examples, "decoding": args.decoding, "eval_precision": args.eval_precision}


def check_memory(request: dict, args: argparse.Namespace, settings: Settings) -> None:
    """Refuse in one line, before anything starts, when ``--nproc`` training ranks would not fit in memory
    (rag_core.train.memory_plan); a store without a published index is left to the flow to report."""
    from rag_core.index.versions import read_index_manifest
    from rag_core.train.memory_plan import check_training_memory

    try:
        manifest = read_index_manifest(settings.open_store(), args.index)
    except WikiragError:
        return
    config = TrainConfig.model_validate({**request["recipe"], "task": args.task, "train": args.train or "cloze",
                                         "dev": args.dev})
    plan = check_training_memory(config, args.nproc, manifest, index_in_ranks=not settings.dask_address)
    if plan is not None:
        log.info("memory plan: %d process(es) x %.1f GB (%s GB each)", args.nproc, plan.per_rank / 1e9, plan.parts())


def cmd_finetune(args: argparse.Namespace, settings: Settings) -> int:
    from cli.flow_runs import import_flow, quiet_expected_tracebacks
    from runtime.prefect_server import prefect_api

    request = finetune_request(args, settings)
    check_memory(request, args, settings)
    log.info("fine-tuning %s with %d process(es); MLflow at %s", args.task, args.nproc, settings.tracking_uri)
    with prefect_api(settings.prefect_home, meanwhile=import_flow("flows.finetune")):
        from flows.finetune import finetune

        quiet_expected_tracebacks()
        outcomes = finetune([request], settings.store_access(), settings.tracking_uri, args.index, args.nproc,
                            args.margin, args.force, settings.dask_address)
    for outcome in outcomes:
        print(outcome.model_dump_json())
        log.info("try: wikirag ask --model models:/wikirag-%s@%s \"your question\"", outcome.task, outcome.alias)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    kinds = sorted(TASK_KINDS)
    tune = sub.add_parser("finetune", help="fine-tune the question encoder and generator on a task with torchrun "
                          "DDP, evaluate, register wikirag-TASK in MLflow and gate its promotion")
    tune.add_argument("--task", required=True, choices=kinds, help="task kind of the files (cloze, generated-qa: "
                      "questions made from the index's own passages when --train is not given)")
    tune.add_argument("--train", type=data_file, help="train file (path or URL) in the task's original format")
    tune.add_argument("--dev", type=data_file, help="dev file (path or URL) in the task's original format")
    config_option(tune, "--kind", TrainConfig, "kind", "RAG-Sequence or RAG-Token (default {default})")
    tune.add_argument("--generator", metavar="DIR", help="generator folder, seq2seq or decoder-only (default: the "
                      "one `wikirag models fetch` installs)")
    tune.add_argument("--index", "--version", dest="index", metavar="VERSION",
                      help="index version to train against (default: LATEST)")
    add_nproc(tune, "DDP processes (torchrun --nproc-per-node; default {default})")
    config_option(tune, "--max-steps", TrainConfig, "max_steps", "optimizer steps (default {default}, the recipe's)")
    config_option(tune, "--batch-size", TrainConfig, "batch_size", "global batch, all processes together "
                  "(default {default})")
    config_option(tune, "--lr", TrainConfig, "lr", "peak learning rate (default {default:g}, the paper's)")
    config_option(tune, "--n-docs", TrainConfig, "n_docs", "passages per question (default {default})")
    config_option(tune, "--weight-mix", TrainConfig, "weight_mix", "register this share of the fine-tuned weights "
                  "and the rest of the start's (default {default:g}: the fine-tuned weights as trained; the main job "
                  f"uses {ShortRun().weight_mix:g}, WiSE-FT)")
    tune.add_argument("--train-layers", type=train_layers, metavar="N|all", help="train only the generator's last "
                      f"N decoder blocks, freezing the rest (default {TRAINED_BLOCKS}: cheaper steps, and SmolLM2's "
                      "ranks stay under 4 GB each); all: every parameter, the paper's (a seq2seq generator's encoder "
                      "trains only with all)")
    config_option(tune, "--eval-examples", FinetuneRequest, "eval_examples", "dev examples evaluated, before and "
                  "after training and in the recipe's dev loss (default {default})", keep_default=True)
    config_option(tune, "--decoding", FinetuneRequest, "decoding", "RAG-Sequence decoding in evaluation, as the main "
                  "job's (default {default}; fast: the paper's Fast Decoding; thorough scores every candidate against "
                  "every passage, several times slower)", keep_default=True)
    config_option(tune, "--eval-precision", FinetuneRequest, "eval_precision", "evaluation arithmetic (default "
                  "{default}; auto: bf16 autocast where native, as the main job)", keep_default=True)
    config_option(tune, "--margin", PromotionGate, "margin", "promotion gate: beat the champion's dev metric by "
                  "this much (default {default}); a version that does not beat its own zero-shot start is never "
                  "champion", keep_default=True)
    tune.add_argument("--force", action="store_true", help="train again even when a registered version was made "
                      "from the same recipe, data, index and margin (by default it is reused)")
    add_store(tune)
    tune.set_defaults(func=cmd_finetune)

    evaluate = sub.add_parser("evaluate", help="a registered model on a task's dev set (any index version: the "
                              "knowledge hot-swap), recorded in MLflow")
    evaluate.add_argument("--model", required=True, help="model URI, e.g. models:/wikirag-nq@champion")
    evaluate.add_argument("--task", required=True, choices=kinds, help="the dev file's task kind")
    evaluate.add_argument("--dev", type=data_file, help="dev file (path or URL) in the task's original format "
                          "(cloze: default the held-out questions of the passages the model was trained on)")
    evaluate.add_argument("--index", "--version", dest="index", metavar="VERSION",
                          help="index version to retrieve from (default: the one the model is bound to)")
    evaluate.add_argument("--closed-book", action="store_true", help="the generator alone, no retrieval")
    add_store(evaluate)
    evaluate.set_defaults(func=cmd_evaluate)
