"""Make a large Wikimedia-style multistream dump out of the real sample's pages.

Why this exists: the only real dump we may ship to tests and benchmarks is a
206-page English Wikipedia export (1.7 MB).  That is too small to measure an
ingest stage whose fixed start-up (Prefect server, Dask cluster) takes seconds,
and far too small to see whether memory grows with the dump.  Real dumps are
tens of GB and out of reach offline.  This script cycles over the real pages,
with their real wikitext left byte for byte as it is, and gives every copy a new
page id, revision id and title, so the result has the size we ask for and the
statistics of real articles (markup density, redirect share, article length).

The output has Wikimedia's layout exactly:

    <name>-pages-articles-multistream.xml.bz2
        stream 0: "<mediawiki ...>" + "<siteinfo>...</siteinfo>" (copied from the sample)
        streams 1..k: 100 "<page>" elements each, every stream its own bz2 stream
        last stream: "</mediawiki>"
    <name>-pages-articles-multistream-index.txt.bz2
        "offset:page_id:title" per page, offset = first byte of the page's stream

``--single-stream`` writes a plain one-stream ``<name>-pages-articles.xml.bz2``
(no index) instead, for comparing tools on the ordinary format.

Copy 0 of each source page keeps its title; copy k >= 1 is titled
"<title> (copy k)".  Page ids run upwards from ``--first-id`` (dumps are in
page-id order), revision ids from ``--first-revision``; the order of the pages
inside each cycle is shuffled by ``--seed``, so page ``i`` of a dump depends
only on (seed, i): a dump of N pages is the first N pages of any larger one
(see :func:`cut_dump`, which derives a smaller dump from a larger one without
compressing again).

Memory stays flat in N: streams are built and compressed by a small process
pool, at most two per process in flight, and written in order as they come.

    python bench/make_dump.py --pages 20000 --out /tmp/dumps
    python bench/make_dump.py --pages 20000 --out /tmp/dumps --single-stream
    python bench/make_dump.py --check /tmp/dumps/enwiki-bench20000-pages-articles-multistream.xml.bz2
    python bench/make_dump.py --pages 20000 --out /tmp/dumps --markdown dump.md   # what the dump holds

``--markdown`` describes the dump (pages, articles, redirects, streams, sizes)
under the command and machine that made it: counts, not timings, so one run
is the figure.
"""

from __future__ import annotations

import argparse
import bz2
import collections
import functools
import os
import random
import re
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import unescape

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RunInfo  # noqa: E402

# The real sample, where the project's checkout keeps it: ../shared/data/ beside the repository.
SAMPLE = (
    Path(__file__).resolve().parents[2]
    / "shared/data/wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)
PAGES_PER_STREAM = 100
FOOTER = "</mediawiki>\n"
XML_UNESCAPE = {"&quot;": '"', "&apos;": "'"}

_PAGE_RE = re.compile(r"  <page>\n.*?</page>\n", re.DOTALL)
# The fields a copy changes, in the order they appear in a <page>: title, the
# page's <id> (after <ns>), the revision's <id> (first thing in <revision>).
_FIELDS_RE = re.compile(
    r"(?P<pre><title>)(?P<title>[^<]*)(?P<mid1></title>\s*<ns>-?\d+</ns>\s*<id>)(?P<page_id>\d+)"
    r"(?P<mid2></id>.*?<revision>\s*<id>)(?P<rev_id>\d+)(?P<post></id>)",
    re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class PageTemplate:
    """One source ``<page>`` cut around the fields a copy changes (all still XML-escaped)."""

    before_title: str
    title: str  # escaped, as in the source
    before_page_id: str
    before_rev_id: str
    after_rev_id: str

    def render(self, title: str, page_id: int, rev_id: int) -> str:
        """The page's XML with a new (already escaped) title and new ids."""
        return (
            f"{self.before_title}{title}{self.before_page_id}{page_id}"
            f"{self.before_rev_id}{rev_id}{self.after_rev_id}"
        )


@dataclass(frozen=True, slots=True)
class Source:
    """The sample split into its header (``<mediawiki>`` + ``<siteinfo>``) and page templates."""

    header: str
    pages: tuple[PageTemplate, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """Which pages a dump holds: page ``i`` is a pure function of these fields and ``i``."""

    sample: str
    seed: int
    first_id: int
    first_revision: int
    edit_fraction: float = 0.0  # share of articles given a new revision whose text gains a first sentence
    edit_seed: int = 1


EDIT_SENTENCE = "This article was revised in a later dump. "
_TEXT_OPEN_RE = re.compile(r"<text[^>]*>")


def _is_edited(plan: Plan, i: int) -> bool:
    return plan.edit_fraction > 0 and random.Random(f"edit:{plan.edit_seed}:{i}").random() < plan.edit_fraction


def _with_first_sentence(xml: str) -> str:
    """The page with EDIT_SENTENCE in front of its text: every 100-word window shifts, so all its
    passages change (an edit near the top, as most are)."""
    m = _TEXT_OPEN_RE.search(xml)
    return xml if m is None else xml[: m.end()] + EDIT_SENTENCE + xml[m.end():]


def load_source(sample: Path) -> Source:
    """Read the sample and cut each page into a template; checks the cuts against an XML parser."""
    xml = bz2.decompress(sample.read_bytes()).decode("utf-8")
    first = xml.find("  <page>")
    if first < 0 or "<siteinfo>" not in xml[:first]:
        raise SystemExit(f"{sample}: no <siteinfo> followed by <page> elements; give a MediaWiki pages-articles export")
    header = xml[:first]
    templates = []
    for block in _PAGE_RE.findall(xml, first):
        m = _FIELDS_RE.search(block)
        if m is None:
            raise SystemExit(f"{sample}: a <page> without <title>, <id> and <revision><id>: {block[:200]!r}")
        _check_cut(block, m)
        templates.append(
            PageTemplate(
                before_title=block[: m.start("title")],
                title=m["title"],
                before_page_id=block[m.end("title") : m.start("page_id")],
                before_rev_id=block[m.end("page_id") : m.start("rev_id")],
                after_rev_id=block[m.end("rev_id") :],
            )
        )
    if not templates:
        raise SystemExit(f"{sample}: no <page> elements found")
    return Source(header=header, pages=tuple(templates))


def _check_cut(block: str, m: re.Match[str]) -> None:
    """The regex found the same title and ids as an XML parser does."""
    page = ET.fromstring(block)
    want = (page.findtext("title"), page.findtext("id"), page.findtext("revision/id"))
    got = (unescape(m["title"], XML_UNESCAPE), m["page_id"], m["rev_id"])
    if want != got:
        raise SystemExit(f"cutting a <page> went wrong: parser says {want}, regex says {got}")


@functools.lru_cache(maxsize=4)
def _cycle_order(seed: int, cycle: int, n: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(f"{seed}:{cycle}").shuffle(order)
    return tuple(order)


def page_xml(source: Source, plan: Plan, i: int) -> tuple[str, int, str]:
    """Page ``i`` of the dump: (its XML, page id, unescaped title for the index)."""
    n = len(source.pages)
    cycle, pos = divmod(i, n)
    template = source.pages[_cycle_order(plan.seed, cycle, n)[pos]]
    title = template.title if cycle == 0 else f"{template.title} (copy {cycle})"
    page_id = plan.first_id + i
    xml = template.render(title, page_id, plan.first_revision + i)
    if _is_edited(plan, i) and "<redirect" not in xml:  # a later revision of the same article
        xml = _with_first_sentence(template.render(title, page_id, plan.first_revision + i + 500_000_000))
    return xml, page_id, unescape(title, XML_UNESCAPE)


# -- worker side: each pool process loads the sample once ---------------------------------

_worker_source: Source | None = None


def _init_worker(sample: str) -> None:
    global _worker_source
    _worker_source = load_source(Path(sample))


def _build_stream(plan: Plan, start: int, stop: int) -> tuple[bytes, list[tuple[int, str]]]:
    """Pages [start, stop) as one compressed bz2 stream, plus their (page id, title)."""
    assert _worker_source is not None
    parts, entries = [], []
    for i in range(start, stop):
        xml, page_id, title = page_xml(_worker_source, plan, i)
        parts.append(xml)
        entries.append((page_id, title))
    return bz2.compress("".join(parts).encode("utf-8"), 9), entries


# -- writers ------------------------------------------------------------------------------


def dump_paths(out: Path, name: str, single_stream: bool = False) -> tuple[Path, Path | None]:
    """(dump, index) paths for a dump called ``name``; no index for a single-stream dump."""
    if single_stream:
        return out / f"{name}-pages-articles.xml.bz2", None
    return out / f"{name}-pages-articles-multistream.xml.bz2", out / f"{name}-pages-articles-multistream-index.txt.bz2"


def _in_order(pool: ProcessPoolExecutor, plan: Plan, n_pages: int, window: int) -> Iterator[tuple[bytes, list]]:
    """Compressed page streams in file order, with at most ``window`` in flight."""
    pending: collections.deque[Future] = collections.deque()
    starts = iter(range(0, n_pages, PAGES_PER_STREAM))
    for start in starts:
        pending.append(pool.submit(_build_stream, plan, start, min(start + PAGES_PER_STREAM, n_pages)))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def write_multistream(plan: Plan, n_pages: int, dump: Path, index: Path, jobs: int) -> None:
    """Write the multistream dump and its index (each through a temporary name, renamed at the end)."""
    source = load_source(Path(plan.sample))
    tmp_dump, tmp_index = dump.with_name(dump.name + ".part"), index.with_name(index.name + ".part")
    with open(tmp_dump, "wb") as out, bz2.open(tmp_index, "wt", encoding="utf-8") as idx:
        out.write(bz2.compress(source.header.encode("utf-8"), 9))
        with ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(plan.sample,)) as pool:
            for data, entries in _in_order(pool, plan, n_pages, window=2 * jobs):
                offset = out.tell()
                out.write(data)
                idx.writelines(f"{offset}:{page_id}:{title}\n" for page_id, title in entries)
        out.write(bz2.compress(FOOTER.encode("utf-8"), 9))
    os.replace(tmp_index, index)
    os.replace(tmp_dump, dump)


def write_single_stream(plan: Plan, n_pages: int, dump: Path) -> None:
    """Write the same pages as one bz2 stream (one core: a single stream cannot be split)."""
    source = load_source(Path(plan.sample))
    tmp = dump.with_name(dump.name + ".part")
    with bz2.open(tmp, "wt", encoding="utf-8", compresslevel=9) as out:
        out.write(source.header)
        for i in range(n_pages):
            out.write(page_xml(source, plan, i)[0])
        out.write(FOOTER)
    os.replace(tmp, dump)


def cut_dump(dump: Path, index: Path, n_pages: int, out: Path, name: str) -> tuple[Path, Path]:
    """The first ``n_pages`` of a multistream dump as a dump of its own, without recompressing.

    ``n_pages`` must end a stream (a multiple of 100 for dumps made here).
    Copies the header and page streams byte for byte, then adds a footer stream.
    """
    entries = bz2.decompress(index.read_bytes()).decode("utf-8").splitlines()
    if not 0 < n_pages <= len(entries):
        raise SystemExit(f"{index}: holds {len(entries)} pages, cannot cut {n_pages}")
    if n_pages < len(entries):
        end = int(entries[n_pages].split(":", 1)[0])
        if end == int(entries[n_pages - 1].split(":", 1)[0]):
            raise SystemExit(
                f"{dump}: page {n_pages} is in the middle of a stream; cut at a multiple of {PAGES_PER_STREAM}"
            )
    else:
        end = None
    new_dump, new_index = dump_paths(out, name)
    tmp = new_dump.with_name(new_dump.name + ".part")
    with open(dump, "rb") as src, open(tmp, "wb") as dst:
        if end is None:  # the whole dump: footer included already
            while chunk := src.read(8 << 20):
                dst.write(chunk)
        else:
            remaining = end
            while remaining and (chunk := src.read(min(8 << 20, remaining))):
                dst.write(chunk)
                remaining -= len(chunk)
            dst.write(bz2.compress(FOOTER.encode("utf-8"), 9))
    new_index.write_bytes(bz2.compress(("\n".join(entries[:n_pages]) + "\n").encode("utf-8"), 9))
    os.replace(tmp, new_dump)
    return new_dump, new_index


def make_dump(
    n_pages: int,
    out: Path,
    *,
    name: str | None = None,
    seed: int = 0,
    single_stream: bool = False,
    sample: Path = SAMPLE,
    first_id: int = 1000,
    first_revision: int = 800_000_000,
    jobs: int | None = None,
    edit_fraction: float = 0.0,
    edit_seed: int = 1,
) -> tuple[Path, Path | None]:
    """Write a dump of ``n_pages`` pages into ``out``; returns (dump, index or None)."""
    if n_pages < 1:
        raise SystemExit("--pages must be at least 1")
    if not sample.exists():
        raise SystemExit(f"{sample}: the real sample is missing; pass --sample with the enwiki ...-shortened.bz2 file")
    out.mkdir(parents=True, exist_ok=True)
    name = name or f"enwiki-bench{n_pages}"
    plan = Plan(sample=str(sample), seed=seed, first_id=first_id, first_revision=first_revision,
                edit_fraction=edit_fraction, edit_seed=edit_seed)
    dump, index = dump_paths(out, name, single_stream)
    if index is None:
        write_single_stream(plan, n_pages, dump)
    else:
        write_multistream(plan, n_pages, dump, index, jobs or os.cpu_count() or 1)
    return dump, index


# -- self-check ---------------------------------------------------------------------------


def check_dump(dump: Path, index: Path | None = None) -> int:
    """Stream-parse the whole dump (all bz2 streams) and check it against its index; returns pages.

    Checks: well-formed XML; unique page ids and titles; when an index is given,
    it lists the same pages in the same order and every offset starts a bz2 stream.
    """
    ids, titles, pages = set(), set(), []
    with bz2.open(dump, "rb") as f:
        for _, elem in ET.iterparse(f, events=("end",)):
            if elem.tag.endswith("}page"):
                ns = elem.tag[: -len("page")]
                page_id, title = int(elem.findtext(f"{ns}id")), elem.findtext(f"{ns}title")
                if page_id in ids or title in titles:
                    raise SystemExit(f"{dump}: page id {page_id} or title {title!r} occurs twice")
                ids.add(page_id)
                titles.add(title)
                if index is not None:
                    pages.append((page_id, title))
                elem.clear()
    n = len(ids)
    if index is not None:
        lines = bz2.decompress(index.read_bytes()).decode("utf-8").splitlines()
        listed = [(int(p), t) for _, p, t in (line.split(":", 2) for line in lines)]
        if listed != pages:
            raise SystemExit(f"{index}: does not list the dump's pages in order")
        with open(dump, "rb") as f:
            for offset in sorted({int(line.split(":", 1)[0]) for line in lines}):
                f.seek(offset)
                if f.read(3) != b"BZh":
                    raise SystemExit(f"{dump}: no bz2 stream starts at index offset {offset}")
    return n


def describe_dump(dump: Path, index: Path | None) -> list[str]:
    """A markdown table of what the dump holds (parsed in full, and checked against its index)."""
    pages = check_dump(dump, index)
    articles = redirects = xml_bytes = 0
    with bz2.open(dump, "rb") as f:
        while chunk := f.read(8 << 20):
            xml_bytes += len(chunk)
    with bz2.open(dump, "rb") as f:
        for _, elem in ET.iterparse(f, events=("end",)):
            if elem.tag.endswith("}page"):
                is_redirect = any(child.tag.endswith("}redirect") for child in elem)
                redirects += is_redirect
                articles += not is_redirect
                elem.clear()
    streams = None
    if index is not None:
        streams = len({line.split(":", 1)[0] for line in bz2.decompress(index.read_bytes()).decode().splitlines()})
    return [
        "| dump | pages | articles (not redirects) | redirects | page streams | MB bz2 | MB XML |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| `{dump.name}` | {pages:,} | {articles:,} | {redirects:,} | {fmt_count(streams)} | "
        f"{dump.stat().st_size / 1e6:.1f} | {xml_bytes / 1e6:.1f} |",
    ]


def fmt_count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pages", type=int, default=20_000, help="pages in the dump (default 20000)")
    p.add_argument("--out", type=Path, default=Path("."), help="directory to write into")
    p.add_argument("--name", help="file name stem (default enwiki-bench<pages>)")
    p.add_argument("--seed", type=int, default=0, help="shuffles the page order within each cycle")
    p.add_argument("--single-stream", action="store_true", help="one bz2 stream, no index")
    p.add_argument("--sample", type=Path, default=SAMPLE, help="the real export to copy pages from")
    p.add_argument("--jobs", type=int, default=None, help="compressing processes (default: all cores)")
    p.add_argument("--check", type=Path, metavar="DUMP", help="only check an existing dump (and its index)")
    p.add_argument("--edit-fraction", type=float, default=0.0,
                   help="a later dump: this share of articles gets a new revision with a new first sentence")
    p.add_argument("--edit-seed", type=int, default=1, help="which articles --edit-fraction picks")
    p.add_argument("--markdown", type=Path, help="also describe the dump in this markdown file (parses it in full)")
    args = p.parse_args(argv)
    info = RunInfo.start(argv and [sys.argv[0], *argv]) if args.markdown else None

    if args.check:
        index = args.check.with_name(args.check.name.replace(".xml.bz2", "-index.txt.bz2"))
        index = index if "multistream" in args.check.name and index.exists() else None
        n = check_dump(args.check, index)
        print(f"{args.check}: well-formed, {n} pages" + (", index matches" if index else ""))
        return
    t0 = time.perf_counter()
    dump, index = make_dump(
        args.pages, args.out, name=args.name, seed=args.seed, single_stream=args.single_stream,
        sample=args.sample, jobs=args.jobs, edit_fraction=args.edit_fraction, edit_seed=args.edit_seed,
    )
    took = time.perf_counter() - t0
    size = dump.stat().st_size
    print(f"{dump} ({size / 1e6:.1f} MB, {args.pages} pages, {took:.1f} s)", file=sys.stderr)
    if index:
        print(f"{index}", file=sys.stderr)
    if info is not None:
        table = describe_dump(dump, index)
        info.finish()
        text = "\n".join(["## Benchmark input: a dump made by `bench/make_dump.py`", "", *info.markdown_header(),
                          "Real wikitext of the sample's pages, cycled with new ids and titles (see the script's "
                          "docstring); counts, not timings.", "", *table, ""])
        print(text)
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
