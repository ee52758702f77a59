"""The cleaner on real articles and on each construct it must remove or keep."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rag_core.wiki.dumps import DumpSource, iter_pages
from rag_core.wiki.wikitext import clean_wikitext, is_disambiguation, redirect_target
from tasks.quality import RESIDUE_PATTERN
from tests.conftest import SAMPLE_BZ2, TABLES_BZ2

RESIDUE = re.compile(RESIDUE_PATTERN)


@pytest.fixture(scope="module")
def articles(wiki: Path) -> list:
    pages = list(iter_pages(DumpSource(str(SAMPLE_BZ2)))) + list(iter_pages(DumpSource(str(TABLES_BZ2))))
    return [p for p in pages if p.ns == 0 and p.redirect is None and p.text]


def test_real_articles_leave_no_markup(articles: list) -> None:
    for page in articles:
        text = clean_wikitext(page.text)
        assert not RESIDUE.search(text), (page.title, RESIDUE.findall(text)[:5])
        assert not re.search(r"^\s*[|!]", text, re.M), page.title  # no table rows
        assert "http://" not in text and "https://" not in text, page.title


def test_table_heavy_articles_keep_prose_and_drop_tables(wiki: Path) -> None:
    pages = {p.title: p for p in iter_pages(DumpSource(str(TABLES_BZ2)))}
    assert len(pages) == 5
    text = clean_wikitext(pages["Constructive vote of no confidence"].text)
    assert text.startswith("The constructive vote of no confidence (in German: konstruktives Misstrauensvotum")
    awards = pages["Academy Award for Best Production Design"]
    raw_cells = re.findall(r"^\|\s*([A-Z][a-z]+ [A-Z][a-z]+)\s*$", awards.text, re.M)
    cleaned = clean_wikitext(awards.text)
    assert len(cleaned.split()) < len(awards.text.split()) / 3  # the winners' tables are gone
    assert "{|" in awards.text and "wikitable" in awards.text and "wikitable" not in cleaned
    assert raw_cells and all(cell not in cleaned for cell in raw_cells[:20])


def test_words_agree_with_a_second_parser(articles: list) -> None:
    """mwparserfromhell's strip_code keeps more (it cannot drop tables), but our words should be its words."""
    mwp = pytest.importorskip("mwparserfromhell")
    for page in articles[:25]:
        ours = clean_wikitext(page.text).split()
        theirs = set(mwp.parse(page.text).strip_code(normalize=True, collapse=True).split())
        shared = sum(w in theirs for w in ours)
        assert shared >= 0.9 * len(ours), page.title


@pytest.mark.parametrize(
    ("wikitext", "expected"),
    [
        ("A {{Infobox person|name={{nowrap|X Y}}|born={{birth date|1900|1|1}}}} person.", "A person."),
        ("Text.<ref name=a>{{cite web|url=http://x.org|title=T}}</ref> More.<ref name=a/>", "Text. More."),
        ("[[File:Map.png|thumb|A [[map]] of [[Europe|the continent]]]]Rest.", "Rest."),
        ("[[Image:X.jpg|200px]] kept", "kept"),
        ("See [[Paris]] and [[France|the country]]; [[dog]]s.", "See Paris and the country; dogs."),
        ("Bold '''word''' and ''italic'' and '''''both'''''.", "Bold word and italic and both."),
        ("x <!-- hidden [[link]] --> y", "x y"),
        ("__NOTOC__Intro.", "Intro."),
        ("Energy <math>E = mc^2</math> is mass.", "Energy is mass."),
        ("An <span style=\"x\">inline</span> tag<br/>break.", "An inline tag break."),
        ("AT&amp;T and A&nbsp;B", "AT&T and A\u00a0B".replace("\u00a0", " ")),
        ("Site [http://example.org the example] and [http://bare.org].", "Site the example and."),
        ("[[Category:Anarchism]][[de:Anarchismus]][[fr:Anarchisme]]", ""),
        ("* first item\n* second ''item''\n# numbered", "first item second item numbered"),
        ("Intro.\n{| class=\"wikitable\"\n|-\n| cell || cell\n|}\nAfter.", "Intro.\nAfter."),
        ("<gallery>\nA.jpg|one\n</gallery>After", "After"),
        ("Before\n== History ==\nAfter", "Before\nAfter"),
        ("Body\n== References ==\n{{reflist}}\n* A book\n== External links ==\n* [http://x.org X]", "Body"),
        ("Intro\n== See also ==\n* [[Other]]\n=== Sub ===\nstill skipped\n== Life ==\nKept", "Intro\nKept"),
        ("{{unclosed template\n\nNext paragraph.", "Next paragraph."),
        ("stray }} closer", "stray closer"),
    ],
)
def test_constructs(wikitext: str, expected: str) -> None:
    assert clean_wikitext(wikitext) == expected


def test_disambiguation_and_redirect_detection() -> None:
    assert is_disambiguation("'''Ada''' may refer to:\n* x\n{{disambiguation}}")
    assert is_disambiguation("{{Disambiguation|geo}}") and is_disambiguation("{{geodis}}") and is_disambiguation("{{hndis|Smith, John}}")
    assert not is_disambiguation("A claim.{{disambiguation needed|date=May 2020}}")
    assert not is_disambiguation("An article about [[Disambiguation (linguistics)]].")
    assert redirect_target("#REDIRECT [[Computer accessibility]]") == "Computer accessibility"
    assert redirect_target("#redirect: [[A#Section|x]]") == "A"
    assert redirect_target("Not a redirect") is None
