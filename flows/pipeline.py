"""The ``pipeline`` flow, wikirag's main job: a dump to a registered model that answers questions.

index_rebuild (ingest, embed, index, every gate, publish) -> finetune (cloze questions drawn
from the new index's passages, plus any task files given; N DDP processes; zero-shot and
fine-tuned evaluation; registry and promotion gate) -> the champion answers a few questions
with provenance, beside the generator before fine-tuning -> plots (metrics per task, retrieval
recall@k, training loss; PNG files, also in MLflow) and a summary (also a Prefect artifact).

A second run reuses what exists: the published passages and vectors of an unchanged dump, and
a model registered from the same recipe, data and index version.
"""

from __future__ import annotations

from prefect import flow, task
from pydantic import BaseModel, Field

from flows.finetune import FinetuneOutcome, FinetuneRequest, finetune
from flows.index_rebuild import index_rebuild
from flows.ingest import dask_runner
from flows.settings import StoreAccess, quiet_environment
from rag_core.index.build import GateConfig
from rag_core.index.embeddings import EmbedConfig
from rag_core.index.faiss_index import IndexConfig
from rag_core.wiki.ingest import IngestConfig
from tasks.reports import publish_summary, retrieval_recall, summary_markdown, write_plots

quiet_environment()

EMBED = EmbedConfig()  # the main job's embedding settings (`wikirag run` loads this encoder while its server boots)
SAMPLE_QUESTIONS = ("Who was the teacher of Alexander the Great?", "What is the capital of Algeria?",
                    "Which planet did Galileo observe moons around?")


class ShortRun(BaseModel):
    """The main job's fine-tune: short enough for 2 CPU cores, long enough to beat its zero-shot start."""

    max_steps: int = Field(24, ge=1, description="optimizer steps")
    batch_size: int = Field(4, ge=1, description="global batch (all processes)")
    lr: float = Field(2e-4, gt=0, description="a short run needs a larger rate than the paper's 3e-5")
    n_docs: int = Field(2, ge=1, description="passages per question")
    max_context_length: int = Field(160, ge=8, description="generator input tokens per passage (seq2seq; "
                                                              "a decoder-only prompt holds the whole passage)")
    # Half of SmolLM2-135M's 30 blocks: on the sample, dev loss 19.5 -> 11.1 in 24 steps (all blocks: 10.4, the
    # last 10: 13.4) at about 2/3 of the step time (bench/train_layers_bench.py)
    train_layers: int | None = Field(15, ge=1, description="generator decoder blocks trained (the last ones); "
                                                           "None = every parameter")
    eval_examples: int = Field(16, ge=1, description="dev questions evaluated, zero-shot and fine-tuned")
    max_new_tokens: int = Field(12, ge=1, description="answer tokens generated in evaluation (cloze spans are short)")
    cloze_passages: int = Field(2000, ge=1, description="passages the cloze questions are drawn from")


class PipelineSummary(BaseModel):
    index_version: str
    passages: int
    outcomes: list[FinetuneOutcome]
    answers: list[dict]
    zero_shot_answers: list[dict] = Field(default_factory=list)  # the generator before fine-tuning, same questions
    plots: list[str]
    markdown: str


@task
def index_facts(store: StoreAccess, version: str) -> int:
    from rag_core.index.versions import read_index_manifest

    return read_index_manifest(store.store(), version).count


@task
def champion_answers(tracking_uri: str, task_kind: str, questions: list[str]) -> list[dict]:
    """The registered champion, loaded by name as a consumer would, answering ``questions`` with provenance."""
    from rag_core.model.answers import answer
    from tasks.evaluation import load_registered_model

    model = load_registered_model(f"models:/wikirag-{task_kind}@champion", tracking_uri)
    return answer(model, questions)  # as `wikirag ask --model` answers


@task
def zero_shot_answers(store: StoreAccess, version: str, generator: str, questions: list[str],
                      n_docs: int) -> list[dict]:
    """The same generator and index before fine-tuning, answering the same questions: what the champion changed.

    The cloze champion learns to fill a masked span and answers questions with one (often a number), while the
    instruction-tuned generator it started from answers in a sentence; the summary shows both.
    """
    from flows.ask import untrained_model
    from rag_core.model.answers import answer

    return answer(untrained_model(store.store(), version, generator, n_docs=n_docs), questions)  # as `wikirag ask`


@flow(name="pipeline", validate_parameters=True)
def pipeline(dump: str, store: StoreAccess, tracking_uri: str, generator: str, report_dir: str,
             run: ShortRun = ShortRun(),  # noqa: B008 - pydantic defaults are immutable values here
             tasks: list[FinetuneRequest] | None = None, nproc: int = 2, questions: list[str] | None = None,
             dask_address: str | None = None, workers: int | None = None, where: dict[str, str] | None = None,
             ) -> PipelineSummary:
    """The main job (module docstring); ``tasks``: more task files to fine-tune on besides the cloze task."""
    version = index_rebuild.with_options(task_runner=dask_runner(dask_address, workers))(
        ingest_config=IngestConfig(dump=dump), store=store, embed=EMBED, index=IndexConfig(),
        gate=GateConfig())
    recipe = {"generator": generator, "max_steps": run.max_steps, "batch_size": run.batch_size, "lr": run.lr,
              "n_docs": run.n_docs, "max_context_length": run.max_context_length,
              "train_generator_layers": run.train_layers, "checkpoint_every": 0,
              "max_dev_examples": 16, "kind": "sequence"}
    requests = [FinetuneRequest(task="cloze", recipe=recipe, eval_examples=run.eval_examples,
                                max_new_tokens=run.max_new_tokens, decoding="fast", eval_precision="auto",
                                cloze={"max_passages": run.cloze_passages}),
                *[t.model_copy(update={"recipe": {**recipe, **t.recipe}}) for t in tasks or []]]
    outcomes = finetune(requests, store, tracking_uri, version, nproc)
    asked = list(questions or SAMPLE_QUESTIONS)
    answers = champion_answers(tracking_uri, "cloze", asked)
    before = zero_shot_answers(store, version, generator, asked, run.n_docs)
    recall = {o.task: retrieval_recall(store.store(), version, o.task, o.dev, store.options(o.dev))
              for o in outcomes if o.dev}
    plots = write_plots(tracking_uri, outcomes, recall, report_dir)
    passages = index_facts(store, version)
    markdown = publish_summary(summary_markdown(version, passages, outcomes, answers, plots, where or {}, before))
    return PipelineSummary(index_version=version, passages=passages, outcomes=outcomes, answers=answers,
                           zero_shot_answers=before, plots=plots, markdown=markdown)
