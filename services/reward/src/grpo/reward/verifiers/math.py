"""Math answer verification on HuggingFace math-verify, with an exactness guard on its numeric shortcuts.

math-verify compares numbers after rounding (`evalf` + chop), so it calls `1/2^{99}` equal
to `1/2^{98}` and `1/2004!` equal to `1/2006!`. Every pair it accepts is re-checked here:
exact rationals are compared exactly, other closed numbers by a relative difference at
50 digits. The guard only ever turns a "correct" into "incorrect", never the reverse.

`verify_math` has no deadline of its own (sympy cannot be interrupted in-process); run it
in a `WorkerPool`, which kills the worker when the deadline passes.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

log = logging.getLogger(__name__)
# We enforce deadlines by killing workers, so math-verify's "timeout is disabled" warning is noise.
logging.getLogger("math_verify").setLevel(logging.ERROR)

STATUSES = ("correct", "incorrect", "unparseable_gold", "unparseable_answer", "timeout", "error")

_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())
# Relative tolerance when both sides are exact (pure rounding noise at 50 digits) ...
_EXACT_REL_TOL = sympy.Float("1e-40", 50)
# ... and when one side is a decimal the model wrote (6 significant digits is a fair answer).
_FLOAT_REL_TOL = sympy.Float("1e-6", 50)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")


@dataclass(frozen=True)
class MathVerdict:
    """The outcome of one verification; `correct` is None when the verifier cannot judge."""

    status: str
    correct: bool | None
    extracted_answer: str = ""
    detail: str = ""


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` with balanced braces, or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start : i - 1].strip()
    return None


def extract_final_answer(completion: str) -> str:
    """The final answer of a whole completion: last \\boxed{} first, then the last <answer>, else all of it."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    tagged = _ANSWER_TAG.findall(completion)
    if tagged:
        inner = tagged[-1].strip()
        return last_boxed(inner) or inner
    return completion.strip()


def _parse(text: str) -> list[Any]:
    """Parse text that may be bare math (`1-\\frac1{e}`), delimited LaTeX, or prose with an answer in it."""
    text = text.strip()
    if not text:
        return []
    # Bare math is wrapped in $...$: math-verify's plain-expression fallback would read `1-\frac1{e}` as `1`.
    if not _DELIMITED.search(text) and not _PROSE_WORD.search(text):
        parsed = parse(f"${text}$", list(_EXTRACTION), parsing_timeout=None)  # type: ignore[arg-type]
        if parsed:
            return list(parsed)
    return list(parse(text, list(_EXTRACTION), parsing_timeout=None))  # type: ignore[arg-type]


def _closed_number(x: Any) -> bool:
    return isinstance(x, sympy.Expr) and not x.free_symbols and x.is_number


def numerically_different(gold: Any, answer: Any) -> bool:
    """True when two closed numbers that math-verify called equal differ beyond rounding noise."""
    if not (_closed_number(gold) and _closed_number(answer)):
        return False
    if isinstance(gold, sympy.Rational) and isinstance(answer, sympy.Rational):
        return bool(gold != answer)
    try:
        g, a = sympy.N(gold, 50), sympy.N(answer, 50)
        scale = max(abs(g), abs(a))
        if not (scale.is_number and scale.is_finite) or scale == 0:
            return False
        tol = _FLOAT_REL_TOL if (gold.has(sympy.Float) or answer.has(sympy.Float)) else _EXACT_REL_TOL
        return bool(abs(g - a) > tol * scale)
    except (TypeError, ValueError, ArithmeticError):  # cannot evaluate: keep math-verify's verdict
        return False


def _pair_correct(gold: Any, answer: Any) -> bool:
    # Gold first: math-verify is asymmetric (assignments and intervals are read from the gold side).
    if not verify(gold, answer, timeout_seconds=None):
        return False
    return not numerically_different(gold, answer)


def verify_math(answer: str, gold: str) -> MathVerdict:
    """Judge a completion (or bare answer) against a gold answer; no deadline of its own."""
    try:
        gold_parsed = _parse(gold)
        if not gold_parsed:
            return MathVerdict("unparseable_gold", None, detail=f"cannot parse gold {gold[:200]!r}")
        extracted = extract_final_answer(answer)
        answer_parsed = _parse(extracted)
        if not answer_parsed:
            return MathVerdict("unparseable_answer", None, extracted, "no final answer could be parsed")
        correct = any(_pair_correct(g, a) for g in gold_parsed for a in answer_parsed)
        return MathVerdict("correct" if correct else "incorrect", correct, extracted)
    except Exception as exc:  # a verifier bug is an error verdict, never "incorrect"
        log.debug("math verification failed", exc_info=True)
        return MathVerdict("error", None, detail=f"{type(exc).__name__}: {exc}"[:500])
