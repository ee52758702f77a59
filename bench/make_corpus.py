"""A benchmark corpus of distinct passages recombined from real Wikipedia sentences, and its vectors.

The only real dump offline is the 106-article sample (4,391 passages): too
small to say anything about an ANN index, and copying it (``make_dump.py``)
makes every text appear ~24 times, which says nothing about real passages
either. This script builds ``--passages`` (default 200,000) DPR-style passages
of exactly 100 words, no two with the same text, out of the sample's own
sentences:

1. every article of the sample is parsed and cleaned by ``rag_core.wiki``
   (``iter_pages`` + ``clean_wikitext``, disambiguation pages and redirects
   left out, as ingest does) and split into sentences;
2. a passage has a *primary* article, drawn with probability proportional to
   its number of sentences (long articles give more passages, as in a dump),
   whose title it takes, and a *secondary* article drawn uniformly;
3. its text is a run of consecutive sentences of the primary from a random
   start, then a run of the secondary, then the primary again, and so on,
   each run about ``--run-words`` words (geometric, whole sentences), until
   100 words, cut there (a DPR window also ends mid-sentence); a text seen
   before is drawn again.

So each passage reads like a window of one article (title and most
sentences agree) with a digression, topics overlap as they do across real
articles, and the 20,200 sentences make ~200k distinct texts whose nearest
neighbours share a few sentences at most. ``index_bench.py`` prints how
close the nearest neighbours are, against the real sample's.

Vectors: the packaged all-MiniLM-L6-v2 at the precision
``rag_core.perf.precision.choose_precision("auto")`` picks, ``Encoder.encode_passages``,
encoded in chunks of ``CHUNK`` passages cached one file each under
``bench/.cache/corpus-*/`` (git-ignored): a run stopped by ``--max-minutes``
or a kill resumes at the first missing chunk.

    python bench/make_corpus.py --passages 20000                    # the --quick corpus of index_bench.py
    flock /tmp/wikirag-heavy.lock nice -n 10 python bench/make_corpus.py --max-minutes 40   # 200k, resumable
    # on a busy machine, two one-thread processes waste less than one with two threads; then join:
    python bench/make_corpus.py --threads 1 --part 0/2 & python bench/make_corpus.py --threads 1 --part 1/2
    python bench/make_corpus.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

CACHE = Path(__file__).resolve().parent / ".cache"
SAMPLE = REPO.parent / "shared/data/wikipedia/enwiki-sample-pages-articles-multistream.xml.bz2"
QA = REPO.parent / "shared/data/qa"
WORDS = 100  # words per passage, as DPR's windows
CHUNK = 10_000  # passages per cached vector file
MIN_SENTENCE_WORDS = 3  # shorter pieces are leftovers of lists and tables
# a sentence ends at . ! or ? (maybe followed by a quote or bracket) before a capital, digit, quote or bracket
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]?\s+(?=[A-Z0-9\"'(\[])")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Article:
    title: str
    sentences: list[list[str]]  # words of each sentence, in article order


def sample_articles(path: Path = SAMPLE) -> list[Article]:
    """The sample's chunked articles (what ingest would cut into passages), split into sentences."""
    from rag_core.wiki.dumps import DumpSource, iter_pages
    from rag_core.wiki.wikitext import clean_wikitext, is_disambiguation, redirect_target

    articles = []
    for page in iter_pages(DumpSource(str(path))):
        text = page.text or ""
        if page.redirect is not None or redirect_target(text) or page.ns != 0 or not text.strip() \
                or is_disambiguation(text):
            continue
        sentences = [s.split() for paragraph in clean_wikitext(text).split("\n")
                     for s in _SENTENCE_END.split(paragraph.strip())]
        sentences = [s for s in sentences if len(s) >= MIN_SENTENCE_WORDS]
        if sentences:
            articles.append(Article(page.title, sentences))
    return articles


def _run(article: Article, rng: np.random.Generator, words: int) -> list[str]:
    """About ``words`` words of consecutive sentences from a random start (whole sentences, at least one)."""
    i, out = int(rng.integers(len(article.sentences))), []
    while len(out) < words:
        out += article.sentences[i % len(article.sentences)]
        i += 1
    return out


def recombine(articles: list[Article], n: int, seed: int = 0, run_words: int = 40) -> pa.Table:
    """``n`` distinct 100-word passages (see the module docstring); columns passage_id, title, text, primary."""
    rng = np.random.default_rng(seed)
    weights = np.array([len(a.sentences) for a in articles], dtype=np.float64)
    weights /= weights.sum()
    seen: set[bytes] = set()
    titles, texts, primaries = [], [], []
    while len(texts) < n:
        a = int(rng.choice(len(articles), p=weights))
        b = int(rng.integers(len(articles) - 1))
        b += b >= a  # a secondary article other than the primary
        words: list[str] = []
        for turn in range(WORDS):  # primary, secondary, primary, ... until 100 words
            words += _run(articles[(a, b)[turn % 2]], rng, int(rng.geometric(1 / run_words)))
            if len(words) >= WORDS:
                break
        text = " ".join(words[:WORDS])
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        if key in seen:
            continue
        seen.add(key)
        titles.append(articles[a].title)
        texts.append(text)
        primaries.append(a)
    ids = [f"bench-{i:07d}" for i in range(n)]
    return pa.table({"passage_id": ids, "title": titles, "text": texts, "primary": pa.array(primaries, pa.int32())})


def corpus_dir(n: int, seed: int = 0, run_words: int = 40) -> Path:
    return CACHE / f"corpus-{n}-seed{seed}-run{run_words}"


def corpus_vectors(n: int, seed: int = 0, run_words: int = 40) -> Path | None:
    """The corpus's vectors by the encoder ``embed`` uses, when they are all there."""
    path = corpus_dir(n, seed, run_words) / f"vectors-{_encoder().fingerprint_id}.npy"
    return path if path.exists() else None


def build_passages(n: int, seed: int, run_words: int) -> Path:
    """Write (once) and return ``passages.parquet`` of the corpus."""
    out = corpus_dir(n, seed, run_words) / "passages.parquet"
    if not out.exists():
        t0 = time.perf_counter()
        articles = sample_articles()
        table = recombine(articles, n, seed, run_words)
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, out.with_suffix(".tmp"))
        out.with_suffix(".tmp").rename(out)
        n_sent = sum(len(a.sentences) for a in articles)
        log(f"{out}: {n:,} passages from {len(articles)} articles ({n_sent:,} sentences) "
            f"in {time.perf_counter() - t0:.0f} s")
    return out


def embed(passages: Path, max_minutes: float, threads: int | None, part: tuple[int, int] = (0, 1)) -> Path | None:
    """Encode the missing chunks (of this ``part``: chunk i when i % parts == part); returns
    ``vectors-<fingerprint_id>.npy`` once every chunk is done and ``parts`` is 1."""
    import torch

    from rag_core.perf.precision import choose_precision

    if threads:
        torch.set_num_threads(threads)
    precision = choose_precision("auto")
    encoder = _encoder()
    log(f"encoder {encoder.fingerprint['name']} {precision.dtype} ({precision.reason}), "
        f"{torch.get_num_threads()} torch threads")
    table = pq.read_table(passages, columns=["title", "text"])
    n, folder, fid = table.num_rows, passages.parent, encoder.fingerprint_id
    full = folder / f"vectors-{fid}.npy"
    if full.exists():
        return full
    t0, done = time.perf_counter(), 0
    this, parts = part
    for start in range(0, n, CHUNK):
        chunk = folder / f"vectors-{fid}-{start:07d}.npy"
        if chunk.exists() or (start // CHUNK) % parts != this:
            continue
        if time.perf_counter() - t0 > 60 * max_minutes:
            log(f"stopped after {max_minutes:g} min at passage {start:,}; run again to resume")
            return None
        part = table.slice(start, min(CHUNK, n - start))
        vectors = encoder.encode_passages(part.column("title").to_pylist(), part.column("text").to_pylist(),
                                          _progress(start, t0, done))
        np.save(chunk.with_suffix(".tmp.npy"), vectors)
        chunk.with_suffix(".tmp.npy").rename(chunk)
        done += len(vectors)
        log(f"  {start + len(vectors):,}/{n:,} ({done / (time.perf_counter() - t0):.0f} passages/s)")
    if parts > 1:
        log(f"part {this}/{parts} done; run without --part to join the chunks")
        return None
    chunks = [np.load(folder / f"vectors-{fid}-{s:07d}.npy") for s in range(0, n, CHUNK)]
    np.save(full.with_suffix(".tmp.npy"), np.concatenate(chunks))
    full.with_suffix(".tmp.npy").rename(full)
    (folder / f"vectors-{fid}.json").write_text(json.dumps(
        {"fingerprint": encoder.fingerprint, "precision": precision.reason, "passages": n}, indent=1))
    for s in range(0, n, CHUNK):
        (folder / f"vectors-{fid}-{s:07d}.npy").unlink()
    return full


def _encoder():
    from rag_core.perf.precision import choose_precision
    from rag_core.index.encoders import Encoder, EncoderConfig

    return Encoder.load(EncoderConfig(dtype=choose_precision("auto").dtype))


def _progress(start: int, t0: float, done: int):
    """A progress callback logging every 1,000 passages of a chunk (the rate over the whole run)."""
    seen = [0]

    def progress(k: int) -> None:
        seen[0] += k
        if seen[0] % 1000 < k:
            log(f"    {start + seen[0]:,} ({(done + seen[0]) / (time.perf_counter() - t0):.0f} passages/s)")
    return progress


def question_pool() -> list[tuple[str, str]]:
    """Every question (and FEVER claim) of ../shared/data/qa usable as a query: ``(set, text)``, in file order.

    NQ-open dev and EfficientQA dev, WebQuestions (all splits), CuratedTREC
    (both splits), FEVER dev claims: 23,203 queries, most of them about topics
    the sample's 98 articles never mention.
    """
    pool = []
    for name in ("NQ-open.dev.jsonl", "NQ-open.efficientqa.dev.1.1.jsonl"):
        with (QA / "nq_open" / name).open() as f:
            pool += [("nq", json.loads(line)["question"]) for line in f]
    for name in ("main_trainmodel.json", "main_val.json", "main_test.json"):
        pool += [("webquestions", q["qText"]) for q in json.loads((QA / "webquestions" / name).read_text())]
    for name in ("large2180-train.tsv", "large2180-test.tsv"):
        with (QA / "curatedtrec" / name).open() as f:
            pool += [("curatedtrec", line.split("\t")[2]) for line in f if line.count("\t") >= 3]
    with (QA / "fever/paper_dev.jsonl").open() as f:
        pool += [("fever", json.loads(line)["claim"]) for line in f]
    return pool


def question_vectors() -> tuple[Path, list[str]]:
    """The question pool encoded like the passages (cached), and the set of each row."""
    encoder = _encoder()
    pool = question_pool()
    path = CACHE / f"questions-{len(pool)}-{encoder.fingerprint_id}.npy"
    if not path.exists():
        CACHE.mkdir(exist_ok=True)
        np.save(path, encoder.encode_questions([text for _, text in pool]))
    return path, [name for name, _ in pool]


def sample_vectors() -> Path:
    """The real sample's own passages (ingest's 100-word windows, 4,391 of them), encoded (cached)."""
    from rag_core.wiki.dumps import DumpSource, iter_pages
    from rag_core.wiki.passages import passages_from_pages

    encoder = _encoder()
    path = CACHE / f"sample-passages-{encoder.fingerprint_id}.npy"
    if not path.exists():
        passages = passages_from_pages(iter_pages(DumpSource(str(SAMPLE))))[0]
        vectors = encoder.encode_passages(passages.column("title").to_pylist(), passages.column("text").to_pylist())
        CACHE.mkdir(exist_ok=True)
        np.save(path, vectors)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--passages", type=int, default=200_000, help="distinct passages to make (default 200,000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the recombination")
    p.add_argument("--run-words", type=int, default=40, help="mean words of one run of consecutive sentences")
    p.add_argument("--max-minutes", type=float, default=40.0, help="start no new chunk after this long")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, all cores)")
    p.add_argument("--no-embed", action="store_true", help="only write the passages")
    p.add_argument("--part", default="0/1", help="I/N: encode only chunks i with i %% N == I (one process each)")
    args = p.parse_args(argv)
    if not SAMPLE.exists():
        sys.exit(f"make_corpus: {SAMPLE} is missing (the Wikipedia sample, from ../shared/data); nothing made")
    passages = build_passages(args.passages, args.seed, args.run_words)
    if args.no_embed:
        print(passages)
        return
    this, parts = (int(v) for v in args.part.split("/"))
    vectors = embed(passages, args.max_minutes, args.threads, (this, parts))
    if vectors is not None:
        print(vectors)


if __name__ == "__main__":
    main()
