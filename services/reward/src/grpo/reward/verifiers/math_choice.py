"""Multiple-choice answers written as a lettered option with its value: `\\textbf{(C)}\\ 12` (AMC, as NuminaMath's
solutions box them).

math-verify reads that as the product 12·C, so neither `C` nor `12` matched such a gold, and a model that boxed
`\\textbf{(C)}\\ 12` scored 0 against the gold `C`. The letter and the value are read apart here; math.py decides.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_WRAP = r"\\(?:text|textbf|textrm|mathrm|mathbf)\s*\{\s*"  # math-verify's matched text turns \textbf into \text
_SPACE = r"(?:\s|~|\\[ ,;:!]|\\q?quad)*"
# `(C) 12`, `\text{(C)} 12`, `\text{(C) }12`, `\qquad\textbf{(C)}\ 12`: an option letter in brackets, then its value.
_LABELLED = re.compile(rf"^{_SPACE}(?:{_WRAP})?\(\s*([A-J])\s*\)\s*\}}?{_SPACE}(.*?){_SPACE}$", re.DOTALL)
_OPTION = re.compile(r"\(\s*[A-J]\s*\)")
# `C`, `(C)`, `\text{(C)}`: an option letter alone.
_LETTER = re.compile(rf"^{_SPACE}(?:{_WRAP})?\(?\s*([A-J])\s*\)?\s*\}}?{_SPACE}$")


# "Answer: C", "The answer is (C).", "**Answer: C**": an option named in prose at the very end of the answer (math-verify
# reads no math there, and the answer was unparseable, 0). One letter only: "C or D" names none.
_STATED = re.compile(
    r"\b(?:answer|option|choice)\b[^\n]{0,30}?(?:\bis|:)[\s*]*\(?\s*([A-J])\s*\)?[\s.*!]*$", re.IGNORECASE
)


class Choice(NamedTuple):
    letter: str
    value: str  # the option's value as written (`12`), "" when only the letter is given


def choice(text: str) -> Choice | None:
    """The option a text names: a lettered value (`(C) 12`) or a letter alone (`C`, `(C)`), else None."""
    labelled = _LABELLED.match(text)
    if labelled and not _OPTION.search(labelled.group(2)):  # `(C) 12, (D) 13` names two options: no one choice
        return Choice(labelled.group(1), labelled.group(2))
    letter = _LETTER.match(text)
    return Choice(letter.group(1), "") if letter else None


def stated_letter(text: str) -> str | None:
    """The option letter a prose answer ends by naming ("The answer is (C)."), else None."""
    stated = _STATED.search(text)
    return stated.group(1) if stated and stated.group(1).isupper() else None
