"""The ``finetune`` flow: tasks in, registered and gated ``wikirag-<task>`` models out.

For each requested task (one child flow run each), on one index version:

task files (or cloze questions drawn from the index's own passages) -> dataset gate (GX)
-> an MLflow run in experiment ``wikirag-<task>`` -> the zero-shot start evaluated on dev
-> the torchrun job (N DDP processes; rank 0 logs loss, dev loss and the loss curve into the run)
-> the fine-tuned model evaluated on dev -> predictions gate (GX) -> logged as wikirag's MLflow
flavor (weights, config and checksums: data), its index version pinned, registered, and promoted
to ``champion`` only if it beats its own zero-shot start on dev, by more dev answers gained than lost beyond
chance (rag_core.evaluate.paired), and the current champion by ``margin`` (else ``challenger``): a first version
that does not beat the model it started from is no champion.

Everything comes in as parameters; ``deployed_finetune`` (the deployment's entry point) reads
the worker's settings once.
"""

from __future__ import annotations

from typing import Any

from mlflow import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from flows.generated_qa import generated_qa_files
from rag_core.evaluate.metrics import headline_each
from rag_core.evaluate.paired import gained_lost
from rag_core.index.versions import read_index_manifest
from rag_core.train.jobs import DDP_PROCESSES, PROMOTION_MARGIN, FinetuneRequest
from rag_core.train.memory_plan import check_training_memory
from rag_core.train.train_config import TrainConfig, trajectory_key
from runtime.process_tuning import start_process
from runtime.settings import Settings, StoreAccess, quiet_environment
from tasks.adapters.mlflow_registry import log_rag_model, register
from tasks.adapters.mlflow_tracking import close_run, open_run
from tasks.dataset_quality import gate_dataset, gate_predictions
from tasks.evaluation import evaluate, load_examples, record_evaluation
from tasks.finetune import (
    FINGERPRINT_TAG,
    cloze_files,
    fingerprint,
    registered_with,
    remove_dir,
    resolve_index,
    scratch_dir,
    train,
    trained_model,
    zero_shot_model,
)

# Below this many dev examples even every answer changing for the better is within chance: a two-sided sign
# test (rag_core.evaluate.paired.sign_test) gives 5 such answers p = 0.0625, so the gate promotes nothing.
FEW_DEV_EXAMPLES = 6

quiet_environment()


class FinetuneOutcome(BaseModel):
    task: str
    run_id: str
    index_version: str
    dev: str | None = None  # the dev file evaluated
    dev_examples: int | None = None  # how many of its examples (None: an outcome recorded before this field)
    metric: str
    zero_shot: float
    fine_tuned: float
    gained: int | None = None  # dev answers better than the zero-shot start's, and worse (None: the run logged no
    lost: int | None = None    # counts, as before gate rule 3)
    model_version: str
    alias: str
    reason: str
    steps: int
    examples_per_s: float | None


@task
def start_run(tracking_uri: str, config: TrainConfig, train_url: str, dev_url: str) -> str:
    tags = {"wikirag.task": config.task, "wikirag.index_version": str(config.index_version),
            "wikirag.train": train_url, "wikirag.dev": dev_url}
    return open_run(tracking_uri, f"wikirag-{config.task}", f"finetune {config.task} on {config.index_version}", tags)


@task
def finish_run(tracking_uri: str, run_id: str, failed: bool = False) -> None:
    close_run(tracking_uri, run_id, failed=failed)


@task(cache_policy=NO_CACHE)  # a model is no cache key: Prefect would warn on every call
def register_model(tracking_uri: str, run_id: str, model: Any, store: StoreAccess, task_kind: str, metric: str,
                   value: float, margin: float, print_: str, baseline: float, changed: tuple[int, int]) -> Any:
    """Log the fine-tuned model as data into the run, pin its index, register it, gate its promotion (``baseline``:
    the zero-shot start's value of ``metric``, which it must beat; ``changed``: dev answers gained and lost against
    it, whose split must be beyond chance, logged into the run first: a reused version shows them)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    for key, count in zip(("dev_answers_gained", "dev_answers_lost"), changed, strict=True):
        client.log_metric(run_id, key, float(count))
    folder = scratch_dir("wikirag-register-")
    try:
        model.save_pretrained(folder)
        uri = log_rag_model(tracking_uri, run_id, folder, store_url=store.url, index_version=model.index_version)
        promotion = register(tracking_uri, uri, task_kind, run_id=run_id, metric=metric, value=value, margin=margin,
                             store=store.store(), index_version=model.index_version, baseline=baseline,
                             changed=changed)
        client.set_model_version_tag(promotion.name, promotion.version, FINGERPRINT_TAG, print_)
        return promotion
    finally:
        remove_dir(folder)


@flow(name="finetune-task", validate_parameters=True)
def finetune_task(request: FinetuneRequest, store: StoreAccess, tracking_uri: str, index_version: str,
                  nproc: int = DDP_PROCESSES, margin: float = PROMOTION_MARGIN, output: str | None = None,
                  force: bool = False, dask_address: str | None = None) -> FinetuneOutcome:
    """One task: data, gate, zero-shot baseline, training, evaluation, registry (module docstring).

    A model already registered from the same recipe, data, index version, evaluation and gate (margin and
    rule: tasks.finetune.fingerprint) is reused (training is deterministic) unless ``force``."""
    log = get_run_logger()
    target = store.store()
    if request.train is None and request.task == "generated-qa":  # the index's own, made once (flows/generated_qa.py)
        train_url, dev_url = generated_qa_files(store, index_version)
    elif request.train is None:
        if request.task != "cloze":
            raise ValueError(f"task {request.task} needs a train file; only cloze and generated-qa draw their own from the index")
        train_url, dev_url = cloze_files(target, index_version, request.cloze)
    else:
        train_url, dev_url = request.train, request.dev
    if dev_url is None:
        raise ValueError(f"task {request.task}: give a dev file to evaluate on")
    train_examples = load_examples(request.task, train_url, store.options(train_url))
    dev_examples = load_examples(request.task, dev_url, store.options(dev_url))
    gate_dataset(request.task, train_examples, dev_examples, target)
    dev_examples = dev_examples[: request.eval_examples]

    # the recipe's own dev-loss passes are bounded like every other evaluation, unless the recipe says otherwise
    config = TrainConfig.model_validate({"max_dev_examples": request.eval_examples, **request.recipe,
                                         "task": request.task, "train": train_url, "dev": dev_url,
                                         "index_version": index_version})
    check_training_memory(config, nproc, read_index_manifest(target, index_version),
                          index_in_ranks=dask_address is None)
    # one folder per recipe: another recipe on the same index must not meet this one's checkpoints
    config = config.model_copy(update={"output": output or
                                       f"runs/{request.task}/{index_version}/{trajectory_key(config)}"})
    print_ = fingerprint(config, f"{request.eval_examples}|{request.max_new_tokens}|{request.decoding}|"
                                 f"{request.eval_precision}", margin)
    if not force and (done := registered_with(tracking_uri, request.task, print_)) is not None:
        log.info("%s: reusing wikirag-%s v%s, %s now (trained and gated from the same recipe, data, index and "
                 "margin; `wikirag finetune --force` trains again)",
                 request.task, request.task, done["model_version"], done["alias"])
        return FinetuneOutcome(task=request.task, index_version=index_version, examples_per_s=None, dev=dev_url,
                               dev_examples=len(dev_examples), **done)
    run_id = start_run(tracking_uri, config, train_url, dev_url)
    model_dir = scratch_dir("wikirag-trained-")
    try:
        settings = {"max_new_tokens": request.max_new_tokens, "mode": request.decoding,
                    "precision": request.eval_precision}
        baseline = evaluate(zero_shot_model(config, target), dev_examples, **settings)
        record_evaluation(tracking_uri, run_id, baseline, prefix="zero_shot")
        result = train(config, nproc, target.url, tracking_uri, run_id, dask_address)
        model = trained_model(target, result, model_dir)
        evaluation = evaluate(model, dev_examples, **settings)
        gate_predictions(request.task, dev_examples, evaluation.predictions)
        record_evaluation(tracking_uri, run_id, evaluation, prefix="dev", step=result.final_step)
        metric, value = evaluation.headline
        changed = gained_lost(*(headline_each(request.task, dev_examples, [r["prediction"] for r in e.predictions])
                                for e in (baseline, evaluation)))
        promotion = register_model(tracking_uri, run_id, model, store, request.task, metric, value, margin, print_,
                                   baseline.headline[1], changed)
    except BaseException:
        finish_run(tracking_uri, run_id, failed=True)
        raise
    finally:
        remove_dir(model_dir)
    finish_run(tracking_uri, run_id)
    _, before = baseline.headline
    log.info("%s: %s %.4f zero-shot -> %.4f fine-tuned; %s v%s is %s (%s)", request.task, metric, before, value,
             promotion.name, promotion.version, promotion.alias, promotion.reason)
    if len(dev_examples) < FEW_DEV_EXAMPLES:
        log.warning("%s: gated on %d dev example(s): on fewer than %d no fine-tune can be promoted (a sign test "
                    "needs %d answers changed the same way to tell a lead from chance); give a larger --dev or "
                    "--eval-examples", request.task, len(dev_examples), FEW_DEV_EXAMPLES, FEW_DEV_EXAMPLES)
    return FinetuneOutcome(task=request.task, run_id=run_id, index_version=index_version, dev=dev_url,
                           dev_examples=len(dev_examples), metric=metric,
                           zero_shot=before, fine_tuned=value, gained=changed[0], lost=changed[1],
                           model_version=promotion.version, alias=promotion.alias,
                           reason=promotion.reason, steps=result.final_step, examples_per_s=result.examples_per_s)


@flow(name="finetune", validate_parameters=True)
def finetune(requests: list[FinetuneRequest], store: StoreAccess, tracking_uri: str, index_version: str | None = None,
             nproc: int = DDP_PROCESSES, margin: float = PROMOTION_MARGIN, force: bool = False,
             dask_address: str | None = None) -> list[FinetuneOutcome]:
    """Fine-tune, evaluate, register and gate one model per task, all on one index version (LATEST by default).

    ``dask_address``: the training ranks retrieve through the index held once by that Dask cluster
    (tasks/adapters/torchrun_launcher.py); None = each rank loads the index itself (fine for small indexes)."""
    if not requests:
        raise ValueError("finetune: no tasks given")
    if nproc < 1:
        raise ValueError(f"finetune: nproc must be at least 1, got {nproc}")
    version = resolve_index(store.store(), index_version)
    return [finetune_task(r, store, tracking_uri, version, nproc, margin, force=force, dask_address=dask_address)
            for r in requests]


@flow(name="finetune-deployment", validate_parameters=True)
def deployed_finetune(requests: list[FinetuneRequest], index_version: str | None = None, nproc: int = DDP_PROCESSES,
                      margin: float = PROMOTION_MARGIN, force: bool = False) -> list[FinetuneOutcome]:
    """The deployment's entry point: the worker's settings (store, MLflow), read once."""
    settings = Settings()
    start_process(settings)  # the deployment's process: the same switches as a command's
    from runtime.default_generator import resolve_generator

    generator = str(resolve_generator(settings.home, None)) if any("generator" not in r.recipe for r in requests) else None
    requests = [r if "generator" in r.recipe else r.model_copy(update={"recipe": {**r.recipe, "generator": generator}})
                for r in requests]
    return finetune(requests, settings.store_access(), settings.tracking_uri, index_version, nproc, margin, force,
                    settings.dask_address)
