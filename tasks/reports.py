"""The main job's report: plots (PNG, also logged to MLflow) and the summary a newcomer reads at the end."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact

from rag_core.evaluate.paired import CHANCE, sign_test
from rag_core.storage import Store
from rag_core.train.loaders import TASK_KINDS

_RECALL = re.compile(r"^dev_(answer|passage|page)_recall_at_(\d+)$")


def _figure(width: float = 6.0, height: float = 3.5) -> Any:
    from matplotlib.figure import Figure  # no pyplot: no global backend state in a worker

    return Figure(figsize=(width, height), dpi=100)


def plot_metrics(outcomes: Sequence[Any], path: Path) -> Path:
    """Each task's headline dev metric, zero-shot start beside fine-tuned."""
    figure = _figure()
    axes = figure.add_subplot()
    names = [f"{o.task}\n({o.metric}" + ("" if o.dev_examples is None else f", {o.dev_examples} dev") + ")"
             for o in outcomes]
    positions = range(len(outcomes))
    axes.bar([p - 0.2 for p in positions], [o.zero_shot for o in outcomes], 0.4, label="zero-shot start")
    axes.bar([p + 0.2 for p in positions], [o.fine_tuned for o in outcomes], 0.4, label="fine-tuned")
    axes.set_xticks(list(positions), names)
    axes.set_ylim(0, 1)
    axes.set_ylabel("dev metric")
    # generated QA's dev pairs are made like its training pairs: real questions are the gate plot's
    axes.set_title("Dev metric per task, on each task's own dev set")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    return path


MODEL_ROWS = {"zero-shot": "zero-shot RAG (the start)", "fine-tuned": "fine-tuned RAG", "closed-book":
              "closed-book (generator alone)"}


GATE_BARS = ("closed-book", "zero-shot", "fine-tuned")  # left to right in each group, labelled as MODEL_ROWS
GATE_METRICS = {"em": "exact match", "f1": "token F1", "answer_in_output": "answer in output"}


def plot_gate(gate: Any, path: Path) -> Path | None:
    """The gate's scores on the held-out real questions (``gate``: tasks.qa_gate's QAGate), each metric's three
    models side by side, and its decision in the title; None when no test question was scored."""
    if not gate.scores:
        return None
    figure = _figure(6.4, 3.8)
    axes = figure.add_subplot()
    width = 0.8 / len(GATE_BARS)
    for i, model in enumerate(GATE_BARS):
        scores = gate.scores[model]
        values = [getattr(scores, metric) for metric in GATE_METRICS]
        offset = (i - (len(GATE_BARS) - 1) / 2) * width  # the group centred on its tick
        bars = axes.bar([m + offset for m in range(len(GATE_METRICS))], values, width, label=MODEL_ROWS[model])
        axes.bar_label(bars, fmt="%.2f", fontsize="small")
    axes.set_xticks(range(len(GATE_METRICS)), list(GATE_METRICS.values()))
    axes.set_ylim(0, 1)
    axes.set_ylabel("mean over the questions")
    promoted = "promoted" if gate.alias == "champion" else f"not promoted ({gate.alias})"
    changed = "" if gate.gained is None else (f"\nagainst zero-shot: {gate.gained} exact answers gained, {gate.lost} "
                                              f"lost (sign test p = {sign_test(gate.gained, gate.lost):.3f})")
    axes.set_title(f"{gate.test_questions} held-out real questions: {gate.name} v{gate.version} {promoted}"
                   f"{changed}", fontsize="medium")
    axes.legend(fontsize="small", loc="best")
    figure.tight_layout()
    figure.savefig(path)
    return path


RECALL_KS = (1, 2, 5, 10, 20)


@task
def retrieval_recall(store: Store, index_version: str, task_kind: str, dev_url: str, options: dict[str, Any],
                     limit: int = 200) -> dict[str, float]:
    """Recall@k (k up to 20) of the index's own question encoder on the first ``limit`` dev questions."""
    from tasks.adapters.index_queries import SearchConfig, answer_questions
    from rag_core.evaluate.metrics import retrieval_metrics
    from rag_core.evaluate.retrieval import RetrievedPassage
    from rag_core.train.loaders import load_task

    examples = load_task(task_kind, dev_url, options)[:limit]
    found = answer_questions(store, [e.input for e in examples], SearchConfig(version=index_version,
                                                                              k=max(RECALL_KS)))
    retrieved = [[RetrievedPassage(r["passage_id"], r["title"], r["text"]) for r in item["results"]]
                 for item in found]
    return {f"dev_{k.replace('@', '_at_')}": v for k, v in retrieval_metrics(task_kind, examples, retrieved,
                                                                           RECALL_KS).items()}


def plot_recall(metrics: dict[str, dict[str, float]], path: Path) -> Path | None:
    """Retrieval recall@k of each question set in ``metrics`` (a task's dev set, or the real held-out questions):
    answer, passage or page recall, whichever the set allows. Curves that coincide (a generated set is filtered
    to questions that retrieve their passage, so its recall is 1 at every k) stay apart by line style."""
    figure = _figure()
    axes = figure.add_subplot()
    styles = itertools.cycle([("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", "-"), ("x", "--")])
    drawn = False
    for questions, values in metrics.items():
        curves: dict[str, list[tuple[int, float]]] = {}
        for name, value in values.items():
            if match := _RECALL.match(name):
                curves.setdefault(match.group(1), []).append((int(match.group(2)), value))
        for kind, points in curves.items():
            ks, ys = zip(*sorted(points))
            marker, line = next(styles)
            axes.plot(ks, ys, marker=marker, linestyle=line, markersize=7 if drawn else 9,
                      label=f"{questions}{' dev' if questions in TASK_KINDS else ''}: {kind} recall")
            drawn = True
    if not drawn:
        return None
    axes.set_xscale("log")
    axes.set_xticks(RECALL_KS, [str(k) for k in RECALL_KS])
    axes.minorticks_off()
    axes.set_xlabel("k (passages retrieved)")
    axes.set_ylabel("recall@k")
    axes.set_ylim(0, 1.05)
    axes.set_title("Retrieval recall@k" + ("\n(generated QA keeps only questions that find their passage)"
                                           if "generated-qa" in metrics else ""), fontsize=10)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path)
    return path


def plot_losses(histories: dict[str, list[tuple[int, float]]], path: Path,
                dev_histories: dict[str, list[tuple[int, float]]] | None = None) -> Path | None:
    """Training loss per step of each task's run, smoothed, with its dev loss on the same axes."""
    from rag_core.train.loss_curves import draw_losses

    if not any(histories.values()):
        return None
    figure = _figure()
    axes = figure.add_subplot()
    for task_kind, points in histories.items():
        draw_losses(axes, points, (dev_histories or {}).get(task_kind, []), task_kind)
    axes.set_title("Fine-tuning loss")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    return path


@task
def write_plots(tracking_uri: str, outcomes: list[Any], recall: dict[str, dict[str, float]], folder: str,
                gate: Any | None = None) -> list[str]:
    """The plots as PNG files in ``folder``, each also logged to its task's MLflow run under ``plots/``:
    ``gate``'s scores on real questions first (:func:`plot_gate`), then the tasks' dev metrics, recall and losses;
    ``recall``: each task's retrieval recall@k (:func:`retrieval_recall`), logged to its run as metrics too."""
    from mlflow import MlflowClient

    from tasks.adapters.mlflow_tracking import MlflowRunLogger

    client = MlflowClient(tracking_uri=tracking_uri)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    runs = {o.task: client.get_run(o.run_id) for o in outcomes}
    for outcome in outcomes:
        if recall.get(outcome.task):
            MlflowRunLogger(client, outcome.run_id).log_metrics({f"index_{k}": v for k, v in
                                                                 recall[outcome.task].items()})
    histories, dev_histories = ({t: sorted((m.step, m.value) for m in client.get_metric_history(r.info.run_id, metric))
                                 for t, r in runs.items()} for metric in ("loss", "dev_loss"))
    made = [plot_gate(gate, out / "real_questions.png") if gate is not None else None,
            plot_metrics(outcomes, out / "metrics_per_task.png"),
            plot_recall(recall, out / "retrieval_recall.png"),
            plot_losses(histories, out / "training_loss.png", dev_histories)]
    made = [p for p in made if p is not None]
    for outcome in outcomes:
        for path in made:
            client.log_artifact(outcome.run_id, str(path), "plots")
    return [str(p) for p in made]


def gate_sentence(gate: Any) -> str:
    """The gate's decision on real questions, in plain sentences with its numbers: the means, then how many answers
    changed each way (:mod:`rag_core.evaluate.paired`)."""
    if not gate.scores:
        return f"{gate.reason}, so {gate.name} was not registered."
    zero, tuned = gate.scores["zero-shot"], gate.scores["fine-tuned"]
    numbers = (f"test EM {tuned.em:.3f} vs its zero-shot start's {zero.em:.3f} on {gate.test_questions} held-out "
               "questions")
    model = f"{gate.name} v{gate.version}"
    if not gate.beat_zero_shot:
        decision = (f"The fine-tune did not beat its zero-shot start ({numbers}), so {model} is not promoted "
                    f"({gate.alias}).")
    elif gate.alias == "champion":
        decision = f"{model} is champion: the fine-tune beat its zero-shot start ({numbers})."
    elif not gate.lead_beyond_chance:
        decision = (f"The fine-tune scored above its zero-shot start ({numbers}), but its lead is within chance "
                    f"(below), so {model} is not promoted ({gate.alias}).")
    else:
        decision = (f"{model} beat its zero-shot start ({numbers}) but not the current champion, so it is "
                    f"{gate.alias}: {gate.reason}.")
    return decision if gate.gained is None else f"{decision} {changes_sentence(gate.gained, gate.lost)}"


def changes_sentence(gained: int, lost: int) -> str:
    """How many exact answers the fine-tune won and lost against its start, and whether that is more than chance."""
    if not gained and not lost:
        return "Question by question, the fine-tune changed no exact answer."
    p = sign_test(gained, lost)
    verdict = "more than chance" if p < CHANCE else "within chance"
    return (f"Question by question, it answers {gained} exactly that its start missed and misses {lost} that its "
            f"start answered: {verdict} (two-sided sign test, p = {p:.3f}).")


ASK_KEY, ASK = "ask zero-shot RAG", 'wikirag ask "your question"'  # the summary's ask line (cli: with --home)


def summary_markdown(version: str, passages: int, outcomes: Sequence[Any], questions: Any, gate: Any,
                     answered_by: str, answers: Sequence[dict[str, Any]], plots: Sequence[str],
                     where: dict[str, str]) -> str:
    """The main job's summary: the fine-tunes, the gate on real held-out ``questions`` (``gate``: tasks.qa_gate's
    QAGate) and the demo ``answers`` (``answered_by``: the champion, or "zero-shot")."""
    lines = ["# wikirag: the main job", "", f"Index **{version}**: {passages:,} passages, now LATEST.", "",
             "## Fine-tuning (each task's own dev questions)", "",
             "| task | dev metric | zero-shot | fine-tuned | dev answers gained / lost | model | alias | steps "
             "| dev examples |", "|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        n = "?" if o.dev_examples is None else o.dev_examples
        changed = "?" if o.gained is None or o.lost is None else f"{o.gained} / {o.lost}"
        lines.append(f"| {o.task} | {o.metric} | {o.zero_shot:.3f} | {o.fine_tuned:.3f} | {changed} | "
                     f"wikirag-{o.task} v{o.model_version} | {o.alias} | {o.steps} | {n} |")
    counts = ", ".join(f"{source} {sum(c.values())}" for source, c in questions.counts.items()) or "none"
    dev = sum(c.get("dev", 0) for c in questions.counts.values())
    scored = ", ".join(f"{source} {n}" for source, n in gate.sources.items())
    lines += ["", "## The gate on real questions, held out from training", "",
              f"Real human-written questions answerable from this index: {counts} (sources used); "
              f"{dev} in the dev split, {questions.test_size} in the test split, of which {gate.test_questions} "
              f"({scored or 'none'}) gate {gate.name}. Generated QA is filtered against both splits and no training "
              "reads them."]
    lines += [f"- note: {note}" for note in questions.notes]
    if gate.scores:
        lines += ["", "| model (test split) | EM | F1 | answer-in-output | n |", "|---|---|---|---|---|"]
        lines += [f"| {MODEL_ROWS[m]} | {s.em:.3f} | {s.f1:.3f} | {s.answer_in_output:.3f} | {s.examples} |"
                  for m, s in gate.scores.items()]
    lines += ["", gate_sentence(gate)]
    if answered_by == "zero-shot":
        lines += ["", "## Questions answered by the zero-shot model", "",
                  f"No {gate.name} champion (no fine-tune has beaten its zero-shot start by more than chance), so "
                  "the generator and index before fine-tuning answer:", ""]
    else:
        lines += ["", f"## Questions answered by the champion, {answered_by}", ""]
    for item in answers:
        lines.append(f"- **{item['question']}** → {item['answer']!r}")
        for p in item["provenance"][:3]:
            similarity = f", similarity {p['similarity']:.2f}" if "similarity" in p else ""
            lines.append(f"  - {p['title']} ({p['passage_id']}, p={p['score']:.2f}{similarity})")
        if item.get("weak_match"):  # ask's note (rag_core.model.answers.weak_match_note)
            lines.append(f"  - {item['weak_match']}")
    lines += ["", "## Where to look", ""] + [f"- {k}: `{v}`" for k, v in where.items()]
    if gate.version:  # the gated model by name, as consumers load it, with the workspace flags of the ask above
        handle = "@champion" if gate.alias == "champion" else f"/{gate.version}"
        ask = where.get(ASK_KEY, ASK).replace(" ask ", f" ask --model models:/{gate.name}{handle} ", 1)
        lines.append(f"- ask the fine-tune: `{ask}`")
    lines += [f"- plot: `{p}`" for p in plots]
    return "\n".join(lines) + "\n"


@task
def publish_summary(markdown: str) -> str:
    create_markdown_artifact(markdown=markdown, key="wikirag-summary", description="the main job's summary")
    return markdown
