"""Published alternatives to the zero-shot retriever and reader, beside the defaults, on the project's questions.

bench/answer_quality.py shows the default reader (RAG-Sequence over n_docs passages, span choice) and
retriever (the index's question encoder) short of issue 37's zero-shot goals. This bench measures
alternatives that need no model beyond the ones wikirag already has, on the split they would be chosen
on (``--split dev``, the default), so that keeping or replacing a default rests on a figure.

Retrieval, recall@k (an answer occurs in one of the top k passages, the gate's whole-word test):
- the index (dense; the default);
- UPR (Sachan et al. 2022): the index's top ``--depth`` passages re-ranked by the generator's mean
  log p(question | passage);
- the index and UPR together: the sum of the two ranks;
- BM25 over the index's passages (bm25s, from ``pip install -e '.[bench]'``), alone and fused with
  the index by reciprocal rank (k = 60).

Reading, EM and answer-in-output (every reply cut by rag_core.model.extract.short_answer, as the
default reader's are):
- RAG-Sequence over ``--n-docs`` passages, span choice on (the default), and over each ``--more-docs``;
- one prompt holding the index's top k passages, best first (k = 1 is the top passage alone);
- context-aware decoding (Shi et al. 2023) on the top passage: each next token maximises
  (1 + a) log p(y | passage, q) - a log p(y | q) among the tokens within 10x of the likeliest one
  under the passage.

Decoding is deterministic: one pass gives the table, and s / question is that pass's time (batches of
8 for the default, one question at a time for the others, so compare quality, not time, across them).

    python bench/reader_alternatives.py [--home ~/.wikirag] [--split dev] [--depth 10] [--limit N]
        [--markdown FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from answer_quality import score  # noqa: E402
from questions import SPLITS, article_texts, index_passages, sample_questions  # noqa: E402
from report import RunInfo  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
UPR_PROMPT = "Passage: {title}: {text}\nPlease write a question based on this passage.\nQuestion:"  # UPR's own
RRF_K = 60  # reciprocal-rank fusion's constant (Cormack et al. 2009)
PLAUSIBLE = 0.1  # context-aware decoding keeps tokens with p >= this times the best one's (under the passage)
ALPHAS = (0.5, 1.0)
CONCAT = (1, 2, 3)


def upr_scores(model, question: str, titles: list[str], texts: list[str]) -> list[float]:
    """Per passage, the generator's mean log p(question tokens | UPR_PROMPT), one batch of left-padded rows."""
    import torch

    from rag_core.model.generators import left_pad, positions

    tokenizer = model.generator_tokenizer
    asked = tokenizer(" " + question, add_special_tokens=False)["input_ids"]
    rows = [tokenizer(UPR_PROMPT.format(title=t.strip('"'), text=x), add_special_tokens=False)["input_ids"] + asked
            for t, x in zip(titles, texts, strict=True)]
    ids, mask = left_pad(rows, model.family.pad_token_id)  # [n, L], the question ends every row
    with torch.no_grad():
        logits = model.generator(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    said = logits[:, :-1].float().log_softmax(-1).gather(2, ids[:, 1:, None])[..., 0]  # [n, L - 1]: log p(ids[t+1])
    return said[:, -len(asked):].mean(1).tolist()


def greedy(model, prompt: str, contrast: str | None = None, alpha: float = 0.0, max_new_tokens: int = 16) -> str:
    """The reply to ``prompt``, greedy; with ``contrast`` (the same question without passage), context-aware."""
    import torch

    tokenizer, stops = model.generator_tokenizer, set(model.family.stop_token_ids)
    feeds = [torch.tensor([tokenizer(p, add_special_tokens=False)["input_ids"]]) for p in (prompt, contrast) if p]
    caches: list = [None] * len(feeds)
    said: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logps = []
            for i, feed in enumerate(feeds):
                out = model.generator(input_ids=feed, cache=caches[i], use_cache=True)
                caches[i] = out.cache
                logps.append(out.logits[0, -1].float().log_softmax(-1))  # [V]
            best = logps[0]
            if len(logps) == 2:
                best = (1 + alpha) * logps[0] - alpha * logps[1]
                best[logps[0] < logps[0].max() + torch.log(torch.tensor(PLAUSIBLE))] = -torch.inf
            token = int(best.argmax())
            if token in stops:
                break
            said.append(token)
            feeds = [torch.tensor([[token]])] * len(feeds)
    return tokenizer.decode(said, skip_special_tokens=True).split("\n")[0].strip()


def bm25_rankings(passages: list[tuple[str, str]], questions: list[str], depth: int) -> list[list[int]] | None:
    """Per question, the rows of ``passages`` BM25 ranks first (None without bm25s)."""
    try:
        import bm25s
    except ImportError:
        return None
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([f"{t} {x}" for t, x in passages], stopwords="en", show_progress=False),
                    show_progress=False)
    rows, _ = retriever.retrieve(bm25s.tokenize(questions, stopwords="en", show_progress=False), k=depth,
                                 show_progress=False)
    return rows.tolist()


def fused(*rankings: list) -> list:
    """Reciprocal-rank fusion of rankings of the same kind of key, best first."""
    total: dict = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking):
            total[key] = total.get(key, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(total, key=lambda key: -total[key])


def main() -> int:
    from rag_core.train.jobs import ShortRun

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="wikirag workspace with the sample index and the fetched generator")
    parser.add_argument("--split", choices=SPLITS, default="dev", help="which split (default dev: choices are made "
                                                                       "there, test is held out)")
    n_docs = ShortRun().n_docs
    parser.add_argument("--n-docs", type=int, default=n_docs, help=f"the default reader's passages (default "
                                                                  f"{n_docs}: the main job's and `wikirag ask`'s)")
    parser.add_argument("--depth", type=int, default=10, help="passages re-ranked per question (default 10)")
    parser.add_argument("--more-docs", type=int, nargs="*", default=[5], metavar="N",
                        help="the default reader again over N passages each (default 5, the paper's)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--limit", type=int, help="first N questions only (a quick look)")
    parser.add_argument("--markdown", help="write the tables to this file")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    info = RunInfo.start()

    from cli.ask import load_model
    from rag_core.evaluate.real_questions import answer_in_output
    from rag_core.model.extract import short_answer
    from rag_core.perf.precision import choose_precision
    from runtime.settings import Settings, quiet_environment

    quiet_environment()
    model = load_model(Settings(**({"home": args.home} if args.home else {})), n_docs=args.n_docs, kind="sequence")
    model.eval()
    articles = article_texts(model.retriever)
    items, notes = sample_questions(articles)
    items = [item for item in items if item["split"] == args.split][: args.limit]
    if not items:
        parser.error(f"no {args.split} questions in this workspace's index (bench/questions.py counts them)")
    bf16 = choose_precision("auto", "cpu").dtype == "bfloat16"
    info.notes.append(f"{'bf16 autocast' if bf16 else 'float32'} (the precision rule of this CPU)")
    arithmetic = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    questions = [item["question"] for item in items]

    def found(item: dict, title: str, text: str) -> float:
        return answer_in_output(f"{title} {text}", item["answers"])

    # retrieval: each ranking as (title, text) pairs, best first
    rankings: dict[str, list[list[tuple[str, str]]]] = {"the index (default)": [], f"UPR over the top {args.depth}": [],
                                                        "the index + UPR, rank sum": []}
    seconds = dict.fromkeys(list(rankings)[:2], 0.0)  # a fusion costs its parts
    tops = []
    for question in questions:
        start = time.perf_counter()
        result = model.search([question], args.depth)
        seconds["the index (default)"] += time.perf_counter() - start
        dense = list(zip(result.titles[0], result.texts[0], strict=True))
        tops.append(result)
        start = time.perf_counter()
        with arithmetic():
            upr = upr_scores(model, question, result.titles[0], result.texts[0])
        order = sorted(range(len(dense)), key=lambda z: -upr[z])
        seconds[f"UPR over the top {args.depth}"] += time.perf_counter() - start
        rank = {z: r for r, z in enumerate(order)}
        rankings["the index (default)"].append(dense)
        rankings[f"UPR over the top {args.depth}"].append([dense[z] for z in order])
        rankings["the index + UPR, rank sum"].append([dense[z] for z in sorted(range(len(dense)),
                                                                               key=lambda z: (z + rank[z], z))])
    passages = index_passages(model.retriever)
    start = time.perf_counter()
    bm25 = bm25_rankings(passages, questions, args.depth)
    if bm25 is None:
        notes.append("BM25 rows left out: bm25s is not installed (pip install -e '.[bench]')")
    else:
        seconds["BM25"] = time.perf_counter() - start
        rankings["BM25"] = [[passages[row] for row in rows] for rows in bm25]
        rankings["the index + BM25, reciprocal rank"] = [fused(d, b) for d, b in
                                                          zip(rankings["the index (default)"], rankings["BM25"],
                                                              strict=True)]
    retrieval = {name: [[found(item, *hit) for hit in ranked[:5]] for ranked, item in zip(lists, items, strict=True)]
                 for name, lists in rankings.items()}
    print("retrieval: " + ", ".join(f"{name} @1 {sum(h[0] for h in hits) / len(items):.0%}"
                                    for name, hits in retrieval.items()), file=sys.stderr, flush=True)

    # reading
    outputs: dict[str, list[str]] = {}
    read_seconds: dict[str, float] = {}
    for n_docs in dict.fromkeys([args.n_docs, *args.more_docs]):
        name = f"RAG-Sequence, {n_docs} passages, span choice" + (" (default)" if n_docs == args.n_docs else "")
        start, outputs[name] = time.perf_counter(), []
        for at in range(0, len(questions), 8):
            with torch.no_grad(), arithmetic():
                outputs[name] += model.generate(questions[at:at + 8], n_docs=n_docs, mode="fast", max_new_tokens=32)
        read_seconds[name] = time.perf_counter() - start
    family = model.family
    variants = {**{("the top passage, greedy" if k == 1 else f"the top {k} passages in one prompt, greedy"): (k, 0.0)
                   for k in CONCAT},
                **{f"context-aware decoding a={a:g}, the top passage": (1, a) for a in ALPHAS}}
    for name, (k, alpha) in variants.items():
        start, outputs[name] = time.perf_counter(), []
        for question, result in zip(questions, tops, strict=True):
            # one prompt, several passages: the default template's passage slot holds them all, best first
            text = "\n\nPassage: ".join([result.texts[0][0], *(f"{t.strip(chr(34))}: {x}" for t, x in
                                                              zip(result.titles[0][1:k], result.texts[0][1:k]))])
            prompt = family.prompt(question, result.titles[0][0], text)
            with arithmetic():
                reply = greedy(model, prompt, family.prompt(question) if alpha else None, alpha)
            outputs[name].append(short_answer(reply, question))
        read_seconds[name] = time.perf_counter() - start
        print(f"{name}: {outputs[name][:4]}", file=sys.stderr, flush=True)
    info.finish()
    lines = report(items, notes, info, args, retrieval, seconds, outputs, read_seconds)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def report(items, notes, info, args, retrieval, seconds, outputs, read_seconds) -> list[str]:
    """The two tables, each default first, and each default against its best alternative."""
    from rag_core.evaluate.paired import gained_lost, sign_test

    n = len(items)
    lines = [f"## Retriever and reader alternatives on the {args.split} split of the project's questions ({n})", "",
             *info.markdown_header(), *(f"- {note}" for note in notes), *([""] if notes else []),
             "| retrieval | recall@1 | recall@2 | recall@5 | s / question |", "|---|---|---|---|---|"]
    for name, hits in retrieval.items():
        at = [sum(max(h[:k]) for h in hits) / n for k in (1, 2, 5)]
        per = f"{seconds[name] / n:.3f}" if name in seconds else ""
        lines.append(f"| {name} | {at[0]:.1%} | {at[1]:.1%} | {at[2]:.1%} | {per} |")
    lines += ["", "| reader | exact match | answer in output | median words | s / question |", "|---|---|---|---|---|"]
    exact, found = {}, {}
    for name, said in outputs.items():
        scores = [score(out, item["answers"]) for out, item in zip(said, items, strict=True)]
        exact[name], found[name] = [s["em"] for s in scores], [s["in_output"] for s in scores]
        words = statistics.median(s["words"] for s in scores)
        lines.append(f"| {name} | {sum(exact[name]) / n:.1%} | {sum(found[name]) / n:.1%} | {words:g} | "
                     f"{read_seconds[name] / n:.2f} |")
    default, *others = retrieval
    at = {name: sum(max(h[:args.n_docs]) for h in hits) / n for name, hits in retrieval.items()}
    best = max(others, key=at.get)
    lines += ["", f"- Retrieval at the reader's {args.n_docs} passages: {default} {at[default]:.1%}; the best "
                  f"alternative, {best}, {at[best]:.1%} ({(at[best] - at[default]) * 100:+.1f} points)."]
    default, *others = outputs
    best = max(others, key=lambda name: (sum(exact[name]), sum(found[name])))
    gained, lost = gained_lost(exact[default], exact[best])
    lines.append(f"- Reading: the best alternative, {best}, against the default: EM "
                 f"{(sum(exact[best]) - sum(exact[default])) / n * 100:+.1f} points (per question {gained} gained, "
                 f"{lost} lost; two-sided sign test p = {sign_test(gained, lost):.2f}), answer-in-output "
                 f"{(sum(found[best]) - sum(found[default])) / n * 100:+.1f} points.")
    return lines


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
