"""R1's language-consistency reward: the share of target-language words in the reasoning.

Words: each CJK ideograph counts as one word (Chinese has no spaces); a run of Latin-script
letters is one English word, accented letters (résumé, naïve, decomposed accents too) and an
apostrophe between letters (don't) included; runs of other letters count against both targets;
digits and symbols do not count. Math and code are in no language: `$…$`, `$$…$$`, `\\(…\\)`, `\\[…\\]`, fenced
and inline code, LaTeX commands (`\\frac`) and single Latin letters (the `x` of `设 x + y = 10`) are left out, so
a Chinese solution with formulas is all Chinese (it scored 0.5 for its variables and `\\frac`s counted as English).
The reasoning is the think block, or the whole completion when there is none. `auto` picks the prompt's dominant
language.
"""

from __future__ import annotations

import re

from grpo.reward.verifiers.format import delimited, split_think_answer
from grpo.reward.verifiers.result import Judgement

LANGUAGES = ("en", "zh")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
# The Latin-script letter blocks (Basic, Latin-1, Extended A/B, IPA, Extended Additional, C, D, E, fullwidth);
# Latin-1's × and ÷ are symbols and not \w, so the ranges need not skip them. Combining accents
# (U+0300-036F) continue a word: "é" may arrive as "e" + U+0301, which \w does not match.
_LATIN_LETTER = (
    "A-Za-z\u00c0-\u00ff\u0100-\u02af\u1e00-\u1eff\u2c60-\u2c7f\ua720-\ua7ff\uab30-\uab6f\uff21-\uff3a\uff41-\uff5a"
)
_LATIN = re.compile(
    rf"[{_LATIN_LETTER}][{_LATIN_LETTER}\u0300-\u036f]*(?:['\u2019][{_LATIN_LETTER}][{_LATIN_LETTER}\u0300-\u036f]*)*"
)
# Letters (\w minus digits and underscore) outside Latin and CJK: Cyrillic, Greek, Arabic, ...
_OTHER = re.compile(rf"[^\W\d_{_LATIN_LETTER}\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]+")


# Spans of math or code, in the order they are cut (a fence before its backticks, `$$` before `$`).
_SPANS = (("```", "```"), ("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)"), ("`", "`"))
_COMMAND = re.compile(r"\\[a-zA-Z]+")


def prose(text: str) -> str:
    """`text` without its math and code: the spans in _SPANS (an opener never closed is text), then LaTeX
    commands."""
    for opener, closer in _SPANS:
        kept, at = [], 0
        for start, end in delimited(text, opener, closer):
            kept.append(text[at : start - len(opener)])
            at = end + len(closer)
        text = " ".join([*kept, text[at:]])
    return _COMMAND.sub(" ", text)


def word_counts(text: str) -> dict[str, int]:
    """Words per language class in the prose of `text`: {"zh": ..., "en": ..., "other": ...}."""
    text = prose(text)
    english = sum(1 for word in _LATIN.findall(text) if len(word) > 1)  # one letter alone is a variable
    return {"zh": len(_CJK.findall(text)), "en": english, "other": len(_OTHER.findall(text))}


def detect_language(text: str) -> str | None:
    """The dominant language of `text` (en or zh), None when it has no words."""
    counts = word_counts(text)
    if counts["zh"] == counts["en"] == 0:
        return None
    return "zh" if counts["zh"] >= counts["en"] else "en"


def language_reward(completion: str, target: str, prompt: str = "", think_tag: str = "think") -> Judgement:
    """Proportion of `target`-language words in the reasoning of `completion`."""
    if target == "auto":
        detected = detect_language(prompt)
        if detected is None:
            return Judgement(None, "cannot_judge", "target 'auto' needs a prompt with words in it")
        target = detected
    if target not in LANGUAGES:
        return Judgement(None, "cannot_judge", f"unknown language {target!r}; known: {', '.join(LANGUAGES)}")
    think, _ = split_think_answer(completion, think_tag=think_tag)
    counts = word_counts(completion if think is None else think)
    total = sum(counts.values())
    if total == 0:
        return Judgement(0.0, "ok", "no words in the reasoning")
    return Judgement(counts[target] / total, "ok", f"target {target}: {counts[target]}/{total} words")
