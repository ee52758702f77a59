"""How well the top passage's similarity tells a question the index can answer from one it cannot: the
threshold below which ``wikirag ask`` says its match is weak (rag_core.model.answers.WEAK_MATCH).

Questions the index answers: the project's real questions (bench/questions.py: each names a sample
article, and its answer occurs in it). Questions it does not: the other NQ-open questions of
../shared/data/qa (none of their answers occurs in the article they name, or they name none; the sample
holds a few hundred of Wikipedia's millions of articles, so nearly all are off the sample). Both sets
split dev / test as the project's questions do (rag_core.evaluate.real_questions.split_of): the threshold
is picked on dev, as the one that keeps false alarms on answerable questions at or under ``--max-false``
(default 5%) while catching the most off-sample questions, and the test split reports it. Nothing is
timed or sampled: one run gives the table.

    python bench/weak_match.py [--home ~/.wikirag] [--max-false 0.05] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from questions import QA_DIR, article_texts, sample_questions  # noqa: E402
from report import RunInfo, publish  # noqa: E402

THRESHOLDS = (0.30, 0.35, 0.40, 0.45, 0.50, 0.55)


def top_similarity(model, questions: list[str], batch: int = 64) -> np.ndarray:
    """The top passage's retrieval score per question (a cosine for the default encoder)."""
    import torch

    out: list[float] = []
    with torch.no_grad():
        for at in range(0, len(questions), batch):
            out += model.retrieve(questions[at: at + batch], 1).doc_scores[:, 0].float().tolist()
    return np.array(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="wikirag workspace with the sample index (default $WIKIRAG_HOME)")
    parser.add_argument("--max-false", type=float, default=0.05,
                        help="the most answerable dev questions a threshold may call weak (default 0.05)")
    parser.add_argument("--markdown", type=Path, help="write the tables to this file")
    args = parser.parse_args()
    info = RunInfo.start()
    from cli.ask import load_model
    from rag_core.evaluate.real_questions import SPLITS, split_of
    from rag_core.model.answers import WEAK_MATCH
    from runtime.settings import Settings, quiet_environment

    quiet_environment()
    model = load_model(Settings(**({"home": args.home} if args.home else {})))
    encoder = model.question_encoder.base_fingerprint.get("name")
    items, _ = sample_questions(article_texts(model.retriever))
    inside = {item["question"] for item in items}
    nq = [json.loads(line)["question"] for path in sorted((QA_DIR / "nq_open").glob("*.jsonl"))
          for line in path.read_text().splitlines() if line.strip()]
    outside = sorted(set(nq) - inside)
    sets = {(split, kind): [q for q in (sorted(inside) if kind == "answerable" else outside) if split_of(q) == split]
            for split in SPLITS for kind in ("answerable", "off-sample")}
    sims = {key: top_similarity(model, questions) for key, questions in sets.items()}
    info.finish()

    def rates(split: str, threshold: float) -> tuple[float, float]:
        return (float((sims[split, "answerable"] < threshold).mean()),
                float((sims[split, "off-sample"] < threshold).mean()))

    allowed = [t for t in THRESHOLDS if rates("dev", t)[0] <= args.max_false]
    chosen = max(allowed, key=lambda t: rates("dev", t)[1]) if allowed else None
    lines = [f"## Weak-match threshold of `wikirag ask`, encoder {encoder}", "", *info.markdown_header(),
             "- answerable: the project's real questions (dev "
             f"{len(sets['dev', 'answerable'])}, test {len(sets['test', 'answerable'])}); off-sample: the other "
             f"NQ-open questions (dev {len(sets['dev', 'off-sample'])}, test {len(sets['test', 'off-sample'])})",
             "- a question is called weak when its top passage's similarity is below the threshold", "",
             "| threshold | dev: answerable called weak | dev: off-sample called weak | test: answerable called weak "
             "| test: off-sample called weak |", "|---|---|---|---|---|"]
    for t in THRESHOLDS:
        (da, do), (ta, to) = rates("dev", t), rates("test", t)
        mark = " (chosen on dev)" if t == chosen else ""
        lines.append(f"| {t:.2f}{mark} | {da:.1%} | {do:.1%} | {ta:.1%} | {to:.1%} |")
    lines += ["", "| top similarity, percentiles 5 / 25 / 50 / 75 / 95 | dev | test |", "|---|---|---|"]
    for kind in ("answerable", "off-sample"):
        cells = [" / ".join(f"{v:.2f}" for v in np.percentile(sims[split, kind], [5, 25, 50, 75, 95]))
                 for split in SPLITS]
        lines.append(f"| {kind} | {cells[0]} | {cells[1]} |")
    shipped = WEAK_MATCH.get(encoder)
    lines += ["", f"- chosen on dev (answerable called weak <= {args.max_false:.0%}, most off-sample caught): "
              f"{'none' if chosen is None else f'{chosen:.2f}'}; rag_core ships "
              f"{'none' if shipped is None else f'{shipped:.2f}'} for {encoder}"]
    publish("\n".join(lines) + "\n", args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
