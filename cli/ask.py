"""``wikirag ask``: answers in English from a published index and the default generator (zero-shot, no flow run).

The RAG model is the index's own question encoder, the index (LATEST or ``--index``) and a
decoder-only generator (``wikirag models fetch``: SmolLM2-135M-Instruct), in float32 by default:
bf16 (``--dtype auto``, where ``rag_core.perf.precision`` finds it native) is faster on AMX CPUs but
changes some greedy answers (bench/answer_speed.py times both and counts them), so it is opt-in. ``--closed-book`` asks the generator alone: the paper's
baseline. Provenance lists the retrieved passages in the model's order of p(z|x). It reads as many passages
as the main job's model and gate do (ShortRun.n_docs): with the 135M default generator, 5 passages answered
no more of the dev questions (bench/reader_alternatives.py), with two and a half times the prompts to read.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any

from cli.options import add_store, config_option
from rag_core.train.jobs import ShortRun
from rag_core.train.train_config import TrainConfig
from runtime.settings import Settings

# The paper reads 5 or 10 passages. Thorough RAG-Sequence scores n replies against n passages, so memory and
# time grow with n squared; twice the paper's most keeps one question's answer to a machine's share.
MAX_N_DOCS = 20


def load_model(settings: Settings, *, index: str | None = None, generator: str | None = None,
               kind: str = "sequence", n_docs: int = ShortRun().n_docs, dtype: str = "float32") -> Any:
    """A RagModel over index ``index`` (LATEST when None) with the generator folder (the fetched default when None)."""
    from runtime.default_generator import resolve_generator
    from tasks.adapters.index_queries import untrained_model

    path = resolve_generator(settings.home, generator)  # a clear error before the index loads
    return untrained_model(settings.open_store(), index, str(path), kind=kind, n_docs=n_docs, dtype=dtype)


def print_answers(results: list[dict], *, as_json: bool, model: Any = None) -> None:
    """Flushed per answer: a reader of a pipe sees each one while later questions are answered. Text output says
    when the closest passage is a weak match for the model's encoder (rag_core.model.answers.weak_match)."""
    from rag_core.model.answers import weak_match_note

    for item in results:
        if as_json:
            print(json.dumps(item, ensure_ascii=False), flush=True)
            continue
        print(f"Q: {item['question']}\nA: {item['answer']}")
        if note := weak_match_note(model, item):
            print(f"   ({note})")
        for hit in item["provenance"]:
            print(f"   [p {hit['score']:.2f}, similarity {hit['similarity']:.2f}] {hit['title']} ({hit['passage_id']})")
        print(flush=True)


def _up_to_a_document(questions: Iterable[tuple[str, str]], refused: list[str]) -> Iterator[str]:
    """The questions (after where each came from) up to the first that is a document rather than a question, whose
    one-line refusal goes into ``refused``: the questions before it are answered (a batch reads ahead), then the
    command stops."""
    from rag_core.model.answers import too_long

    for where, question in questions:
        if refusal := too_long(where, question):
            refused.append(refusal)
            return
        yield question


def zero_shot_choices(args: argparse.Namespace) -> list[str]:
    """The flags given that shape only the zero-shot model (a value other than the default counts as given)."""
    defaults = {"generator": None, "kind": TrainConfig.model_fields["kind"].default, "n_docs": ShortRun().n_docs,
                "dtype": inspect.signature(load_model).parameters["dtype"].default}
    return [f"--{name.replace('_', '-')} {getattr(args, name)}" for name, default in defaults.items()
            if getattr(args, name) != default]


def cmd_ask(args: argparse.Namespace, settings: Settings) -> int:
    from cli.search import located_questions
    from rag_core.errors import WikiragError
    from rag_core.model.answers import answer
    from tasks.adapters.index_queries import QUESTIONS_PER_BATCH, batches

    refused: list[str] = []
    questions = _up_to_a_document(located_questions(args.questions, args.question), refused)
    first = next(questions, None)
    if first is None:  # before the model loads
        raise WikiragError(refused[0])
    if not 1 <= args.n_docs <= MAX_N_DOCS:
        why = (": RAG-Sequence scores each passage's reply against every passage, so its memory and time grow "
               "with the square") if args.n_docs > MAX_N_DOCS else ""
        raise WikiragError(f"--n-docs must be 1 to {MAX_N_DOCS}, got {args.n_docs}{why}")
    if args.model:  # a registered model: its own generator, question encoder and index binding
        from tasks.evaluation import load_registered_model

        if chosen := zero_shot_choices(args):
            raise WikiragError(f"{', '.join(chosen)}: choose the zero-shot model's parts; {args.model} brings its "
                               "own generator, kind, passages per question and dtype: drop them, or drop --model")

        model = load_registered_model(args.model, settings.tracking_uri, args.index)
    else:
        model = load_model(settings, index=args.index, generator=args.generator, kind=args.kind, n_docs=args.n_docs,
                           dtype=args.dtype)
    for batch in batches(itertools.chain([first], questions), QUESTIONS_PER_BATCH):  # read as answers print
        # the weak-match threshold was measured on the index's own encoder; a registered model's tower is trained
        print_answers(answer(model, batch, closed_book=args.closed_book), as_json=args.json,
                      model=None if args.model else model)
    if refused:
        raise WikiragError(refused[0])
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``wikirag ask QUESTION... [--questions FILE] [--index V] [--generator DIR] [--kind] [--n-docs] [--closed-book]``."""
    ask = sub.add_parser("ask", help="answer questions from the index with the default generator (zero-shot), or "
                         "with a registered model (--model)")
    ask.add_argument("question", nargs="*", help="questions, one per argument")
    ask.add_argument("--questions", metavar="FILE", help="a file with one question per line ('-' for stdin)")
    add_store(ask)
    ask.add_argument("--model", metavar="URI", help="a registered model, e.g. models:/wikirag-nq@champion (MLflow at "
                     "MLFLOW_TRACKING_URI, else the workspace's); its index binding unless --index is given")
    ask.add_argument("--index", "--version", dest="index", metavar="VERSION",
                     help="index version, as search's --version (default: LATEST, or the model's own)")
    ask.add_argument("--generator", metavar="DIR", help="local generator folder, seq2seq or decoder-only "
                     "(default: the one `wikirag models fetch` installs); this, --kind, --n-docs and --dtype shape "
                     "the zero-shot model: a registered model (--model) brings its own")
    config_option(ask, "--kind", TrainConfig, "kind", "RAG-Sequence or RAG-Token marginalisation (default {default})",
                  keep_default=True)
    config_option(ask, "--n-docs", ShortRun, "n_docs", "passages per question, 1 to " + str(MAX_N_DOCS) +
                  " (default {default}, as the main job's model and gate)", keep_default=True)
    dtype = inspect.signature(load_model).parameters["dtype"].default
    ask.add_argument("--dtype", choices=["float32", "auto", "bfloat16"], default=dtype,
                     help=f"generator weights (default {dtype}; auto = bf16 where the CPU has it natively: faster, "
                     "but some answers change)")
    ask.add_argument("--closed-book", action="store_true", help="the generator alone, no retrieval (the baseline)")
    ask.add_argument("--json", action="store_true", help="one JSON line per question, in input order: "
                     '{"question", "answer", "provenance": [{"passage_id", "title", "score", "similarity"}, ...]}')
    ask.set_defaults(func=cmd_ask)
