"""The plain form of an English past-tense verb, for questions with "did": "issued" -> "When did X issue ...?".

No lexicon is shipped: irregular verbs are listed, and a regular "-ed" form is undone by its spelling
(a doubled final consonant, "-ied", and the consonant endings that take a silent "e": "created",
"moved", "decided", "captured"). An ending the spelling cannot settle ("visited" but "completed") is
guessed by the commoner case; a wrong guess costs a slightly ungrammatical question, which the
retrieval round trip still checks like any other.
"""

from __future__ import annotations

import re

IRREGULAR_PAST = {
    "wrote": "write", "began": "begin", "became": "become", "took": "take", "gave": "give", "saw": "see",
    "drew": "draw", "chose": "choose", "threw": "throw", "went": "go", "came": "come", "ran": "run",
    "grew": "grow", "knew": "know", "taught": "teach", "told": "tell", "said": "say", "spoke": "speak",
    "met": "meet", "left": "leave", "kept": "keep", "built": "build", "held": "hold", "made": "make",
    "won": "win", "lost": "lose", "sold": "sell", "led": "lead", "brought": "bring", "fought": "fight",
    "found": "find", "set": "set", "shot": "shoot", "hit": "hit", "put": "put", "struck": "strike",
    "sent": "send", "bought": "buy", "caught": "catch", "thought": "think", "sought": "seek", "fell": "fall",
    "flew": "fly", "rose": "rise", "sang": "sing", "stood": "stand", "understood": "understand", "wore": "wear",
    "bore": "bear", "broke": "break", "drove": "drive", "ate": "eat", "forgot": "forget", "hid": "hide",
    "laid": "lay", "paid": "pay", "read": "read", "rode": "ride", "spent": "spend", "swore": "swear",
    "withdrew": "withdraw", "overthrew": "overthrow", "undertook": "undertake", "overcame": "overcome",
    "felt": "feel", "heard": "hear", "lent": "lend", "meant": "mean", "slew": "slay", "split": "split",
    "spread": "spread", "cast": "cast", "beat": "beat", "bid": "bid", "dealt": "deal", "shook": "shake",
    "died": "die", "lied": "lie", "tied": "tie",
}
_DOUBLED = re.compile(r"([bgmnprt])\1$")  # "planned" -> "plan"; not "ll"/"ss"/"dd" ("called", "passed", "added")
_VOWEL = "aeiou"


def _needs_e(stem: str) -> bool:
    last, before = stem[-1], stem[-2:-1]
    single_vowel = before in _VOWEL and stem[-3:-2] not in tuple(_VOWEL)  # "creat" yes, "treat" no
    if last in "vzcu" or (last == "s" and before != "s"):
        return True  # moved, organized, produced, continued, used, released
    if last == "g":
        return before in "rd" or stem.endswith("ang") or (single_vowel and before == "a")  # judged, changed, waged
    if last == "l":
        return before in "bptdgkcz" or (single_vowel and before in "iu")  # settled, enabled, compiled, ruled
    if last == "t" and before == "a":
        return not stem.endswith(("feat", "peat", "treat", "heat", "seat", "cheat"))  # created; not defeated
    if last in "tdk":
        return single_vowel and before in ("eou" if last == "t" else "aiou")  # completed, decided, invoked
    if last == "p":
        return single_vowel and before == "a"  # escaped; not developed
    if last in "nm":
        return single_vowel and before in ("i" if last == "n" else "au")  # defined, named, assumed
    if last == "r":
        return before in "aiou" and stem[-3:-2] not in ("a", "e", "o")  # declared, acquired, captured; not entered
    return False


def plain_form(past: str) -> str:
    """The plain (infinitive) form of ``past``, a simple past tense: "issued" -> "issue", "became" -> "become"."""
    lower = past.lower()
    if lower in IRREGULAR_PAST:
        return IRREGULAR_PAST[lower]
    if not lower.endswith("ed") or len(lower) < 4:
        return lower
    if lower.endswith("ied") and len(lower) > 4:
        return lower[:-3] + "y"  # married, carried
    if lower.endswith("eed"):
        return lower[:-1]  # agreed, freed
    stem = lower[:-2]
    if _DOUBLED.search(stem) and len(stem) > 3:
        return stem[:-1]
    return stem + "e" if _needs_e(stem) else stem
