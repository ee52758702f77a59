"""The settings of a fine-tuning job as a launcher sees them: what to train on, how to evaluate, how many processes.

These are the ``finetune`` and ``pipeline`` flows' parameters and the CLI's defaults; they live here, below Prefect
and MLflow, so that building the command line reads them without importing either.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from rag_core.train.cloze import ClozeConfig


class Launch(BaseModel):
    """How a fine-tune is launched."""

    nproc: int = Field(2, ge=1, description="DDP processes on this node (torchrun --nproc-per-node)")


class PromotionGate(BaseModel):
    """When a fine-tuned model takes the ``champion`` alias: its dev metric beats its own zero-shot start's
    (strictly, by dev answers gained and lost beyond chance) and the current champion's by ``margin``."""

    margin: float = Field(0.0, ge=0.0, description="beat the current champion's dev metric by this much")


DDP_PROCESSES = Launch().nproc
PROMOTION_MARGIN = PromotionGate().margin


class FinetuneRequest(BaseModel):
    """One task to fine-tune on: its files, and any recipe setting (TrainConfig's fields) to change."""

    task: str = Field(description="task kind: nq, triviaqa, webquestions, curatedtrec, msmarco, jeopardy, fever3, "
                                  "fever2, kilt, cloze")
    train: str | None = Field(None, description="train file (path or URL, the task's original format); None with "
                                                "cloze: questions drawn from the index's own passages")
    dev: str | None = Field(None, description="dev file; None with cloze: held-out articles' questions")
    recipe: dict[str, Any] = Field(default_factory=dict, description="TrainConfig fields, e.g. {\"max_steps\": 50, "
                                                                     "\"kind\": \"token\", \"generator\": DIR}")
    cloze: ClozeConfig = Field(default_factory=ClozeConfig, description="how cloze questions are drawn")
    eval_examples: int = Field(64, ge=1, description="dev examples evaluated (the first N)")
    max_new_tokens: int = Field(32, ge=1, description="answer tokens generated in evaluation")
    decoding: Literal["thorough", "fast"] = Field("fast", description="RAG-Sequence decoding in evaluation "
                                                                     "(fast: the paper's Fast Decoding)")
    eval_precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="evaluation arithmetic; auto = bf16 autocast where native (~3x faster on AMX)")



# The generator's decoder blocks a fine-tune trains by default (the last ones; `wikirag finetune`, the main job and
# prefect.yaml's finetune deployment). Half of SmolLM2-135M's 30: on the sample, dev loss 19.5 -> 11.1 in 24 steps
# (all blocks: 10.4, the last 10: 13.4) at about 2/3 of the step time (bench/train_layers_bench.py), and a rank's
# peak memory under 4 GB at the finetune defaults (bench/rank_malloc_bench.py), where every block would add about
# 1.1 GB of gradients, Adam states and bf16 copies (81M more trained parameters).
TRAINED_BLOCKS = 15


class ShortRun(BaseModel):
    """The main job's fine-tune: short enough for 2 CPU cores, long enough to beat its zero-shot start."""

    max_steps: int = Field(24, ge=1, description="optimizer steps")
    batch_size: int = Field(4, ge=1, description="global batch (all processes)")
    lr: float = Field(5e-5, gt=0, description="peak rate after warm-up (bench/train_choice_bench.py)")
    n_docs: int = Field(2, ge=1, description="passages per question")
    weight_mix: float = Field(0.5, gt=0.0, le=1.0, description="the registered weights: this share of the "
                              "fine-tuned ones, the rest the start's (WiSE-FT; bench/train_choice_bench.py)")
    max_context_length: int = Field(160, ge=8, description="generator input tokens per passage (seq2seq; "
                                                              "a decoder-only prompt holds the whole passage)")
    train_layers: int | None = Field(TRAINED_BLOCKS, ge=1, description="generator decoder blocks trained (the "
                                                                        "last ones); None = every parameter")
    train_question_encoder: bool = Field(True, description="train the question encoder too; False = retrieve "
                                                            "as the index's own encoder does")
    # The data the fine-tune reads (GeneratedQAConfig fields): its pairs answered by their page's own subject go, and
    # each pair trains toward the generator's own reply around its answer (docs/architecture.md, "What the main
    # job's fine-tune learns")
    subject_share: float = Field(0.0, ge=0.0, le=1.0, description="generated pairs answered by their page's own "
                                                                  "subject at most this share")
    qa_target: Literal["answer", "reader-lead"] = Field("reader-lead", description="what each generated pair trains "
                                                        "toward: its answer span, or the generator's own reply to "
                                                        "it, cut after the answer")
    eval_examples: int = Field(8, ge=1, description="generated dev questions evaluated, zero-shot and fine-tuned "
                                                    "(the fine-tune's own gate; the real questions gate wikirag-qa)")
    # Each is answered three times (zero-shot, fine-tuned, closed-book): 40 of the sample's 70 keeps the gate
    # to about a third of the main job on 2 cores
    gate_questions: int = Field(40, ge=1, description="held-out real test questions the wikirag-qa gate scores")
    # room for a full date or name ("July 16, 1969"); a reply stops at its first line break or eos, so the cap
    # costs time only on a rambling one
    max_new_tokens: int = Field(32, ge=1, description="answer tokens generated in evaluation")
