"""Questions made from one sentence by a handful of rules, each answered by a span of that sentence.

Each rule matches a whole clause shape at the start of a sentence and rewrites it
as a question whose answer is one named group of the match:

| rule | sentence | question | answer |
|---|---|---|---|
| born-when | X was born (in/on) DATE | When was X born? | the date |
| born-where | X was born in PLACE | Where was X born? | the place |
| died-when | X died (in/on) DATE | When did X die? | the date |
| died-where | X died in PLACE | Where did X die? | the place |
| made-when | X was <participle> [up to 8 words] (in/on) DATE | When was X elected President? | the date |
| made-by | X was founded/written/... by NAME | Who founded X? | the name |
| located | X is located in PLACE | Where is X located? | the place |
| measure | X has a population/area/... of NUMBER [unit] | What is the population of X? | the number |
| who-did | [The] NAME <verb>ed ... | Who <verb>ed ...? | the name (one word only if in the title) |
| how-many | X has NUMBER <things> | How many <things> does X have? | the number |
| role-of | NAME is the capital/founder/... of Y | What is the capital of Y? | the name |
| of-is | The capital/founder/... of Y is NAME | What is the capital of Y? | the name |
| when-did | X <verb>ed OBJECT (in/on) DATE | When did X <verb> OBJECT? | the date |
| life-born | NAME (DATE – DATE) / NAME (born DATE) | When was NAME born? | the first date |
| life-died | NAME (DATE – DATE) | When did NAME die? | the second date |
| first-to | NAME was the first/only/largest ... | Who was the first ...? | the name |
| where-is | X is a city/town/river/... in PLACE | Where is X? | the place |
| how-many-did | X <verb>ed NUMBER <things> | How many <things> did X <verb>? | the number |
| known-as | X is (also) known as / called NAME | What is X also known as? | the name |

X (the subject) starts the sentence, has at most eight words, no punctuation,
and names something: its first word is no pronoun, preposition or conjunction,
and it holds a capitalised word that is not a plain sentence opener ("The city
was founded" asks nothing answerable). Dates, places and names are read off the
text (capitalisation, month names, digits); no tagger is involved, so a rule
either fits the surface shape or yields nothing. Each rule reads the sentence and its rewordings
(:mod:`rag_core.train.sentence_views`: a date or adverb first, a pronoun for the title), and "did"
questions take the verb's plain form (:mod:`rag_core.train.verb_forms`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from rag_core.evaluate.normalize import normalize_answer
from rag_core.train.cloze import _DATE, _NOT_NAME
from rag_core.train.sentence_views import views
from rag_core.train.verb_forms import plain_form

_LETTER = r"[^\s,;:()\[\]\"“”]"  # what a subject's words are made of: no punctuation that splits a clause
_SUBJECT = rf"(?P<subject>[A-Z]{_LETTER}*(?:\s+{_LETTER}+){{0,7}}?)"
_CAP = r"[A-ZÀ-ÖØ-Þ][\w'’.-]*\w|[A-ZÀ-ÖØ-Þ]"
_CONNECT = r"of|de|du|da|del|der|van|von|la|le|al|upon|on"
_PLACE = rf"(?:{_CAP})(?:\s+(?:(?:{_CONNECT})\s+)?(?:{_CAP}))*(?:,\s+(?:{_CAP})(?:\s+(?:{_CAP}))*)?"
_NAME = rf"(?:{_CAP})(?:\s+(?:(?:{_CONNECT})\s+)?(?:{_CAP}))*"
_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:\s+(?:million|billion))?"
_UNIT = (r"(?:\s+(?:square\s+)?(?:kilometres|kilometers|km2|km²|km|metres|meters|m|miles|mi|feet|ft|inches|"
         r"hectares|acres|people|inhabitants|residents))?")
_END = r"(?=[.,;]|\s+(?:in|on|at|and|to|from|during|after|before|where|while|when|near)\b)"
_MONTHS = frozenset("january february march april may june july august september october november december".split())

# Participle -> simple past where they differ, for "Who wrote X?" from "X was written by".
_SIMPLE_PAST = {"written": "wrote", "taken": "took", "given": "gave", "known": "knew", "seen": "saw", "begun": "began",
                "drawn": "drew", "chosen": "chose", "thrown": "threw"}
_IRREGULAR = ("built", "written", "held", "made", "won", "lost", "sold", "taken", "given", "born", "known", "seen",
              "begun", "drawn", "chosen", "sent", "led", "brought", "fought", "found", "set", "shot", "hit", "put",
              "struck", "thrown", "killed", "awarded", "elected", "appointed", "crowned", "adopted", "signed")
_PARTICIPLE = rf"(?:[a-z]+ed|{'|'.join(_IRREGULAR)})"
_PAST_IRREGULAR = ("wrote", "began", "became", "took", "gave", "saw", "drew", "chose", "threw", "went", "came", "ran",
                   "grew", "knew", "taught", "told", "said", "spoke", "met", "left", "kept")
_PARTICIPLE_ONLY = ("written", "taken", "given", "born", "known", "seen", "begun", "drawn", "chosen", "thrown")
_PAST = rf"(?:[a-z]{{2,}}ed|{'|'.join(w for w in _IRREGULAR if w not in _PARTICIPLE_ONLY)}|{'|'.join(_PAST_IRREGULAR)})"
_CLAUSE = r"(?:\s+[a-zA-Z0-9][\w'’-]*){0,8}?"  # a short complement: "elected President", "first performed"
# Words that show a candidate subject is a clause, not a noun phrase: "The journal is published by MDPI and".
_CLAUSE_WORDS = frozenset("which that who whom whose and or but is was were are be been has had have he she it they "
                          "then when while if because would could should will can may might".split())
# A name with one of these words is a thing, asked with "What" (else "Who"): "The Kingdom of Albania".
_THING_WORDS = frozenset("kingdom republic empire university college school party army navy river lake mountain "
                         "company corporation church council union association federation city state states act "
                         "war museum institute society committee league government parliament congress court "
                         "island islands bank agency foundation club team group band treaty declaration county "
                         "province district region national".split())
_ROLES = ("capital", "capital city", "largest city", "founder", "author", "leader", "president", "king", "queen",
          "father", "mother", "son", "daughter", "wife", "husband", "teacher", "student", "pupil", "inventor",
          "creator", "composer", "director", "head", "seat", "patron saint", "official language",
          "national language", "currency", "highest mountain", "longest river")
_PEOPLE = frozenset(("founder", "author", "leader", "president", "king", "queen", "father", "mother", "son",
                     "daughter", "wife", "husband", "teacher", "student", "pupil", "inventor", "creator",
                     "composer", "director", "head", "patron saint"))
_ROLE = "|".join(sorted((re.escape(r) for r in _ROLES), key=len, reverse=True))
_RANK = r"first|last|only|largest|oldest|youngest|longest|highest|biggest|smallest|most [a-z]+|\d+(?:st|nd|rd|th)"
_PLACE_KIND = ("(?:city|town|village|municipality|commune|country|state|province|region|island|river|lake|mountain|"
               "county|district|port|capital|suburb|neighbourhood|neighborhood)")
_PERSON_NOUNS = frozenset("person man woman people player president king queen leader writer author actor actress "
                          "artist astronaut athlete emperor ruler governor member pope minister emir sultan "
                          "champion winner recipient scientist director poet composer".split())
_YEAR = re.compile(r"1\d{3}|20\d{2}")
_NOT_THINGS = frozenset("as is was has this its his us thus plus less".split())
# A subject may not open with these: "In 1990 Tirana was founded", "He was born in 1950".
_NOT_SUBJECT = (_NOT_NAME - {"the", "a", "an"}) | {"under", "following", "despite", "through", "within", "among",
                                                    "against", "across", "around", "between", "near", "upon", "like"}


@dataclass(frozen=True)
class Question:
    """A question made from a sentence, answered by ``sentence[start:end]``."""

    rule: str
    question: str
    start: int
    end: int


@dataclass(frozen=True)
class _Rule:
    name: str
    pattern: re.Pattern[str]
    template: str  # str.format over the match's groups (subject, verb, past, role, of, measure, be, wh)


def _rule(name: str, pattern: str, template: str) -> _Rule:
    return _Rule(name, re.compile(pattern), template)


RULES: tuple[_Rule, ...] = (
    _rule("born-when", rf"^{_SUBJECT} was born (?:on |in )?(?P<answer>{_DATE.pattern})", "When was {subject} born?"),
    _rule("born-where", rf"^{_SUBJECT} was born in (?P<answer>{_PLACE}){_END}", "Where was {subject} born?"),
    _rule("died-when", rf"^{_SUBJECT} died (?:on |in )?(?P<answer>{_DATE.pattern})", "When did {subject} die?"),
    _rule("died-where", rf"^{_SUBJECT} died in (?P<answer>{_PLACE}){_END}", "Where did {subject} die?"),
    _rule("made-when", rf"^{_SUBJECT} (?P<be>was|were) (?P<verb>(?!born\b){_PARTICIPLE}{_CLAUSE}) (?:on |in )"
                       rf"(?P<answer>{_DATE.pattern})", "When {be} {subject} {verb}?"),
    _rule("made-by", rf"^{_SUBJECT} (?:was|were) (?P<verb>{_PARTICIPLE}) by (?:the )?(?P<answer>{_NAME}){_END}",
          "{wh} {past} {subject}?"),
    _rule("who-did", rf"^(?:The )?(?P<answer>{_NAME}) (?P<rest>{_PAST}\b[^,;:()\"“”]*?[\w)])"
                     r"(?=[.;]|, (?:and|but|which|who|where|when|while) )",
          "{wh} {rest}?"),
    _rule("how-many", rf"^{_SUBJECT} (?P<have>has|had) (?:about |approximately |around |over |nearly |more than )?"
                      rf"(?P<answer>\d[\d,.]*(?:\s+(?:million|billion))?) (?P<things>(?:[a-z-]+ ){{0,2}}[a-z-]+s)\b",
          "How many {things} {do} {subject} have?"),
    _rule("located", rf"^{_SUBJECT} (?P<be>is|was|are|were) located in (?P<answer>{_PLACE}){_END}",
          "Where {be} {subject} located?"),
    _rule("measure", rf"^{_SUBJECT} (?P<have>has|had) an? (?P<measure>population|area|elevation|length|height) "
                     rf"of (?:about |approximately |around |over |nearly )?(?P<answer>(?:{_NUMBER}){_UNIT})"
                     r"(?=[.,;\s])", "What {be} the {measure} of {subject}?"),
    _rule("role-of", rf"^(?P<answer>{_NAME}) (?P<be>is|was) the (?P<role>{_ROLE}) of (?P<of>{_NAME})(?=[.,;])",
          "{wh} {be} the {role} of {of}?"),
    _rule("of-is", rf"^The (?P<role>{_ROLE}) of (?P<of>{_NAME}) (?P<be>is|was) (?P<answer>{_NAME})(?=[.,;])",
          "{wh} {be} the {role} of {of}?"),
    _rule("when-did", rf"^{_SUBJECT} (?P<verb>{_PAST}) (?P<object>[^,;:()\"“”]{{2,80}}?),? (?:in|on) "
                      rf"(?P<answer>{_DATE.pattern}){_END}", "When did {subject} {plain} {object}?"),
    _rule("life-born", rf"^(?P<subject>{_NAME}) \((?:[^()]*?;\s*)?(?:born\s+)?(?P<answer>{_DATE.pattern})"
                       r"(?:\s*[–-]|\))", "When was {subject} born?"),
    _rule("life-died", rf"^(?P<subject>{_NAME}) \((?:[^()]*?;\s*)?(?:{_DATE.pattern})\s*[–-]\s*"
                       rf"(?P<answer>{_DATE.pattern})\)", "When did {subject} die?"),
    _rule("first-to", rf"^(?:The )?(?P<answer>{_NAME}) (?P<be>is|was|became) the (?P<rank>{_RANK}) "
                      r"(?P<rest>[a-z][^,;:()\"“”]{2,80}?)(?=[.;]|, (?:and|but|which|who)\b)",
          "{wh} {be} the {rank} {rest}?"),
    _rule("where-is", rf"^{_SUBJECT} (?P<be>is|was|are|were) an? (?P<kind>(?:[\w-]+ ){{0,3}}{_PLACE_KIND}) "
                      rf"(?:in|on) (?P<answer>{_PLACE}){_END}", "Where {be} {subject}?"),
    _rule("how-many-did", rf"^{_SUBJECT} (?P<verb>{_PAST}) (?:about |approximately |around |over |nearly |"
                          rf"more than |some )?(?P<answer>\d[\d,.]*(?:\s+(?:million|billion))?) "
                          r"(?P<things>(?:[a-z-]+ ){0,2}[a-z-]+s)\b", "How many {things} did {subject} {plain}?"),
    _rule("known-as", rf"^{_SUBJECT} (?P<be>is|was|are|were) (?P<often>(?:also|commonly|often|sometimes) )?"
                      rf"(?P<how>known as|called|nicknamed) [\"“]?(?P<answer>{_NAME})[\"”]?(?=[.,;])",
          "What {be} {subject} {often}{how}?"),
)
RULE_NAMES = tuple(rule.name for rule in RULES)


def names_something(subject: str) -> bool:
    """The subject can stand alone in a question: a noun phrase (no clause words), no pronoun or preposition
    first, and a proper name in it (a capitalised word after the first, a one-word name, or a possessor)."""
    words = subject.split()
    if not words or words[0].lower() in _NOT_SUBJECT or any(w.lower() in _CLAUSE_WORDS for w in words):
        return False
    if any(w.endswith("ed") and w.islower() and (i == 0 or words[i - 1].lower() not in ("the", "a", "an"))
           for i, w in enumerate(words)):
        return False  # a verb: "The 2011 census reported Alberta"
    if len(words) == 1:
        return words[0].lower() not in _NOT_NAME and not words[0].isdigit()
    return words[0].endswith(("'s", "’s")) or any(w[0].isupper() for w in words[1:])


def _subject_in_question(subject: str) -> str:
    # "The Gettysburg Address was written by" -> "Who wrote the Gettysburg Address?"
    head, _, rest = subject.partition(" ")
    return f"{head.lower()} {rest}" if head in ("The", "A", "An") and rest else subject


def _is_life_span(match: re.Match[str], subject: str, died: bool) -> bool:
    """A person's dates in brackets: "(born DATE)" or "(DATE – DATE)", after a name of two words or more
    ("Emil Post (1936)" cites a paper; "Piss Christ (1989)" dates a work)."""
    text, start, end = match.string, match.start("answer"), match.end("answer")
    dated = died or text[:start].endswith("born ") or text[end:].lstrip()[:1] in ("–", "-")
    words = subject.split()
    return dated and len(words) >= 2 and not any(w.lower() in _THING_WORDS for w in words)


def _is_complement(text: str) -> bool:
    """A verb's object that a question can carry whole: a few words, no clause of its own, no dangling preposition."""
    words = text.split()
    return (0 < len(words) <= 10 and not any(w.lower() in _CLAUSE_WORDS for w in words)
            and words[-1].lower() not in _NOT_NAME and not _cut_at_abbreviation(words))


def _cut_at_abbreviation(words: list[str]) -> bool:
    # A match that stops at the period of "St. Lawrence" or "Dred Scott v. Sandford" ends on a stub.
    return len(words[-1]) == 1 or words[-1] in ("St", "Mt", "Dr", "Jr", "Sr", "Ft", "Co", "vs", "Gen", "Lt", "Col")


def _is_date(text: str) -> bool:
    return any(w.lower().strip(",") in _MONTHS for w in text.split())


def _question(rule: _Rule, match: re.Match[str], title_words: frozenset[str]) -> str | None:
    groups = {k: v for k, v in match.groupdict().items() if v is not None}
    groups.setdefault("often", "")
    if "subject" in groups:
        if not names_something(groups["subject"]):
            return None
        groups["subject"] = _subject_in_question(groups["subject"])
    if rule.name in ("born-where", "died-where", "located") and _is_date(groups["answer"]):
        return None  # "born in May 1950" is a date, asked by the -when rules
    if "verb" in groups and rule.name == "made-by":
        groups["past"] = _SIMPLE_PAST.get(groups["verb"], groups["verb"])
        groups["wh"] = "What" if any(w.lower() in _THING_WORDS for w in groups["answer"].split()) else "Who"
    if "have" in groups:
        groups["be"] = "is" if groups["have"] == "has" else "was"
        groups["do"] = "does" if groups["have"] == "has" else "did"
    if rule.name in ("where-is",) and _is_date(groups["answer"]):
        return None
    if rule.name.startswith("life-") and not _is_life_span(match, groups["subject"], rule.name == "life-died"):
        return None
    if rule.name.startswith("how-many") and _YEAR.fullmatch(groups["answer"]):
        return None  # "ended 1999 as ...": a year, no count
    if "things" in groups and groups["things"].split()[-1] in _NOT_THINGS:
        return None
    if "plain" in rule.template:
        groups["plain"] = plain_form(groups["verb"])
    if "object" in groups and not _is_complement(groups["object"]):
        return None
    if "rest" in groups:
        name = groups["answer"].split()
        rest = groups["rest"].split()
        opener = name[0].lower()
        if (len(name) < 2 and name[0] not in title_words) or opener in _NOT_NAME | _CLAUSE_WORDS or opener[-2:] == "ly":
            return None  # "The Greeks built", "Then Apollo struck": capitalised because they open the sentence
        if (len(rest) > 16 or any(w.lower() in _CLAUSE_WORDS - {"that", "and", "or", "but", "when"} for w in rest)
                or _cut_at_abbreviation(rest)):
            return None  # a clause of its own follows: no single question asks it
        groups["wh"] = "What" if any(w.lower() in _THING_WORDS for w in name) else "Who"
        if rule.name == "first-to" and not _PERSON_NOUNS.intersection(rest[:4]):
            groups["wh"] = "What"  # "the largest continent", "the first airline"
    if "role" in groups:
        groups["wh"] = "Who" if groups["role"] in _PEOPLE else "What"
        if groups["of"].split()[0] in ("The", "A", "An") and match.start("of") > 0:
            groups["of"] = _subject_in_question(groups["of"])
    return rule.template.format(**groups)


def questions(sentence: str, title: str = "", pronoun: str = "it") -> Iterator[Question]:
    """Every question the rules make of ``sentence`` (from the article ``title``), each with the answer's offsets.

    A one-word name opening a sentence is taken for a name only when it is a word of the title ("Lincoln issued
    ..." in "Abraham Lincoln"); otherwise it may be any capitalised opener. A question that shows its own answer
    (once normalised) is left out: it asks nothing.
    """
    title_words = frozenset(w for w in re.findall(r"[\w'’-]+", title) if len(w) > 2 and w[0].isupper())
    asked: set[str] = set()
    for view in views(sentence, title, pronoun):
        for rule in RULES:
            match = rule.pattern.search(view.text)
            if match is None:
                continue
            text = _question(rule, match, title_words)
            span = view.in_sentence(*match.span("answer"))
            if text is None or span is None or text in asked:
                continue  # no question, or its answer is reworded text (the title put in for "He")
            answer = normalize_answer(sentence[span[0]:span[1]])
            if not answer or f" {answer} " in f" {normalize_answer(text)} ":
                continue
            asked.add(text)
            yield Question(rule.name, text, *span)
