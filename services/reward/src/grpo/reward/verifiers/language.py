"""R1's language-consistency reward: the share of target-language words in the reasoning.

Words: each CJK ideograph counts as one word (Chinese has no spaces); a run of Latin
letters is one English word; runs of other letters count against both targets; digits
and symbols do not count. The reasoning is the think block, or the whole completion
when there is none. `auto` picks the prompt's dominant language.
"""

from __future__ import annotations

import re

from grpo.reward.verifiers.format import split_think_answer
from grpo.reward.verifiers.result import Judgement

LANGUAGES = ("en", "zh")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_LATIN = re.compile(r"[A-Za-z]+")
# Letters (\w minus digits and underscore) outside Latin and CJK: Cyrillic, Greek, Arabic, ...
_OTHER = re.compile(r"[^\W\d_A-Za-z\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]+")


def word_counts(text: str) -> dict[str, int]:
    """Words per language class in `text`: {"zh": ..., "en": ..., "other": ...}."""
    return {"zh": len(_CJK.findall(text)), "en": len(_LATIN.findall(text)), "other": len(_OTHER.findall(text))}


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
