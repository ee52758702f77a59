"""The ``pipeline`` flow, wikirag's main job: a dump to a registered model that answers questions.

index_rebuild (ingest, embed, index, every gate, publish) -> the real held-out questions the new
index can answer (tasks/qa_gate.py: the project's written questions, plus NQ-open, WebQuestions
and CuratedTrec ones when their folder is given), split dev / test -> generated QA from the
index's own passages, filtered against them, with the generator's own words around each answer
as targets (flows/generated_qa.py) -> finetune on it
(``wikirag-generated-qa``: N DDP processes, its own gate on generated dev questions) -> the gate
on real questions: zero-shot vs fine-tuned vs closed-book on the test split, and ``wikirag-qa``
registered, champion only if it beats its zero-shot start by more than chance -> the ``wikirag-qa``
champion (or the zero-shot model, when none beat it by more than chance) answers a few questions with
provenance -> plots and a summary (also a Prefect artifact).

A second run reuses what exists: the published passages, vectors and generated QA of an
unchanged dump, a model registered from the same recipe, data, index version and gate margin, and
the test-question gate made for it.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from pydantic import BaseModel

from flows.finetune import FinetuneOutcome, finetune
from flows.generated_qa import generated_qa
from flows.index_rebuild import index_rebuild
from rag_core.index.plan import GateConfig
from rag_core.index.embedding_files import EmbedConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.train.generated_qa import GeneratedQAConfig
from rag_core.train.jobs import DDP_PROCESSES, FinetuneRequest, ShortRun
from rag_core.wiki.ingest import IngestConfig
from runtime.dask_runner import dask_runner
from runtime.settings import StoreAccess, quiet_environment
from tasks.qa_gate import QAGate, RealQuestions, qa_answers, qa_gate, real_question_files
from tasks.reports import publish_summary, retrieval_recall, summary_markdown, write_plots

quiet_environment()

EMBED = EmbedConfig()  # the main job's embedding settings (`wikirag run` loads this encoder while its server boots)
SAMPLE_QUESTIONS = ("Who was the teacher of Alexander the Great?", "What is the capital of Algeria?",
                    "Which planet did Galileo observe moons around?")


class PipelineSummary(BaseModel):
    index_version: str
    passages: int
    outcomes: list[FinetuneOutcome]
    questions: RealQuestions  # the held-out real questions
    gate: QAGate  # zero-shot vs fine-tuned vs closed-book on their test split, and what was promoted
    answered_by: str  # "wikirag-qa v<n>" (the champion) or "zero-shot"
    answers: list[dict]
    plots: list[str]
    markdown: str


@task
def index_facts(store: StoreAccess, version: str) -> int:
    from rag_core.index.versions import read_index_manifest

    return read_index_manifest(store.store(), version).count


@task
def zero_shot_model(store: StoreAccess, version: str, generator: str, n_docs: int) -> Any:
    """The generator and index before fine-tuning, as `wikirag ask` answers with them."""
    from tasks.adapters.index_queries import untrained_model

    return untrained_model(store.store(), version, generator, n_docs=n_docs)


@flow(name="pipeline", validate_parameters=True)
def pipeline(dump: str, store: StoreAccess, tracking_uri: str, generator: str, report_dir: str,
             run: ShortRun = ShortRun(),  # noqa: B008 - pydantic defaults are immutable values here
             tasks: list[FinetuneRequest] | None = None, nproc: int = DDP_PROCESSES, questions: list[str] | None = None,
             public_questions: str | None = None, dask_address: str | None = None, workers: int | None = None,
             where: dict[str, str] | None = None) -> PipelineSummary:
    """The main job (module docstring); ``tasks``: more task files to fine-tune on besides generated QA;
    ``public_questions``: a folder with nq_open/, webquestions/ and curatedtrec/ (None: written questions only)."""
    runner = dask_runner(dask_address, workers)
    version = index_rebuild.with_options(task_runner=runner)(
        ingest_config=IngestConfig(dump=dump), store=store, embed=EMBED, index=IndexConfig(),
        gate=GateConfig())
    held_out = real_question_files(store.store(), version, public_questions)
    qa_config = GeneratedQAConfig(subject_share=run.subject_share, target=run.qa_target,
                                  generator=generator if run.qa_target == "reader-lead" else None)
    qa_data = generated_qa.with_options(task_runner=runner)(store=store, index_version=version, config=qa_config,
                                                            held_out_files=[held_out.dev, held_out.test])
    recipe = {"generator": generator, "max_steps": run.max_steps, "batch_size": run.batch_size, "lr": run.lr,
              "n_docs": run.n_docs, "weight_mix": run.weight_mix, "max_context_length": run.max_context_length,
              "train_generator_layers": run.train_layers, "train_question_encoder": run.train_question_encoder,
              "checkpoint_every": 0, "kind": "sequence",
              # the main job's time budget: lean ranks run at 0.78x the examples/s (bench/rank_malloc_bench.py),
              # and two fast ranks of this short run fit the machine
              "rank_memory": "fast",
              # two examples per process hold small activations: recomputing each trained block in the backward
              # pass costs 1.72x the step time here and saves no peak memory (bench/checkpointing_bench.py)
              "activation_checkpointing": False,
              # four dev-loss points for the plot at the cost of two passes over 16
              "eval_every": max(1, run.max_steps // 3), "max_dev_examples": 8}
    decoding = {"max_new_tokens": run.max_new_tokens, "mode": "fast", "precision": "auto"}
    requests = [FinetuneRequest(task="generated-qa", train=qa_data.train, dev=qa_data.dev, recipe=recipe,
                                eval_examples=run.eval_examples, max_new_tokens=run.max_new_tokens,
                                decoding="fast", eval_precision="auto"),
                *[t.model_copy(update={"recipe": {**recipe, **t.recipe}}) for t in tasks or []]]
    outcomes = finetune(requests, store, tracking_uri, version, nproc)
    start = zero_shot_model(store, version, generator, run.n_docs)
    qa = outcomes[0]
    gate = qa_gate(tracking_uri, store.store(), version, held_out, qa.task, qa.model_version, qa.run_id, start,
                   decoding, run.gate_questions)
    answered_by, answers = qa_answers(tracking_uri, start, list(questions or SAMPLE_QUESTIONS))
    recall = {o.task: retrieval_recall(store.store(), version, o.task, o.dev, store.options(o.dev))
              for o in outcomes if o.dev}
    if held_out.test_size:  # the real questions the gate scores: the recall a user's question meets
        recall["real held-out questions"] = retrieval_recall(store.store(), version, "nq", held_out.test,
                                                             store.options(held_out.test))
    plots = write_plots(tracking_uri, outcomes, recall, report_dir, gate)
    passages = index_facts(store, version)
    markdown = publish_summary(summary_markdown(version, passages, outcomes, held_out, gate, answered_by, answers,
                                                plots, where or {}))
    return PipelineSummary(index_version=version, passages=passages, outcomes=outcomes, questions=held_out,
                           gate=gate, answered_by=answered_by, answers=answers, plots=plots, markdown=markdown)
