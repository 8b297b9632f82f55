"""Math answer verification on HuggingFace math-verify, with an exactness guard on its numeric shortcuts.

How the final answer is chosen: when the completion has `<answer>…</answer>` blocks, the last one's
content is judged (the format our prompts ask for); otherwise the whole completion. math-verify then
extracts from that text: `\\boxed{}` content first (several boxes on the last line of answers form a
set: `\\boxed{1}, \\boxed{2}` is {1, 2}), a "final answer is …" sentence after an intermediate box
wins, else the last LaTeX or plain-number expression. Bare math (`1-\\frac1{e}`, a gold
without `$`) is read as LaTeX; plain numbers with thousands separators or decimal commas as numbers.

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

# boxed_match_priority 0: a box outranks every other pattern (math-verify's own test suite uses it).
_EXTRACTORS = {"latex": LatexExtractionConfig(boxed_match_priority=0), "expr": ExprExtractionConfig()}
# Relative tolerance when both sides are exact (pure rounding noise at 50 digits).
_EXACT_REL_TOL = sympy.Float("1e-40", 50)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_WORD_ARGUMENT = re.compile(r"\\(?:begin|end|text|mathrm|mathbf|operatorname)\s*\{[^{}]*\}")  # words, not prose
_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_GSM8K_MARKER = re.compile(r"(?:^|\n)\s*####\s*(?=\S[^\n]*$)")  # the last line's "#### 72"
_PLAIN_NUMBER = re.compile(r"^[+-]?[\d\s.,]*\d[\d\s.,]*%?$")  # 1 000, 1,000.5, 1000,99: left to the number reader
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
# Between two boxes, a self-correction ("\\boxed{3}, no wait: \\boxed{4}") makes the last box the answer; without
# one, nearby boxes joined by commas or "and" are one answer with several parts (math-verify's rule).
_CORRECTION = re.compile(r"\b(?:wait|no|actually|instead|rather|correction|sorry|oops|mistake)\b", re.IGNORECASE)
# Upright constants (ISO style): math-verify reads \mathrm{e} as text and then loses the rest of the expression,
# so `1 - \frac{1}{\mathrm{e}}` and `1 + \frac{1}{\mathrm{e}}` both became 1.
_UPRIGHT_CONSTANT = re.compile(r"\\(?:mathrm|operatorname)\s*\{\s*(e|i|\\pi)\s*\}")


@dataclass(frozen=True)
class MathOptions:
    """math-verify's comparison settings, per request (the defaults are math-verify's own)."""

    extraction: tuple[str, ...] = ("latex", "expr")  # parsers for both sides: LaTeX, plain expressions
    precision: int = 6  # decimal places numbers are rounded to before comparing
    strict: bool = True  # False: variable and function names may differ (f(x) equals f(y))
    allow_set_relation_comp: bool = False  # a gold set/interval may equal a relation (x ∈ [a, b] vs a ≤ x ≤ b)


@dataclass(frozen=True)
class MathVerdict:
    """The outcome of one verification; `correct` is None when the verifier cannot judge."""

    status: str
    correct: bool | None
    extracted_answer: str = ""
    detail: str = ""


def answer_region(completion: str) -> str:
    """The text the final answer is extracted from: the last <answer> block's content, else everything."""
    tagged = _ANSWER_TAG.findall(completion)
    if tagged and tagged[-1].strip():
        return tagged[-1].strip()
    return completion.strip()


def _box_end(text: str, start: int) -> int:
    """Index just past the brace that closes the box whose content starts at `start` (len(text) if none)."""
    depth, i = 1, start
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return i


def after_correction(region: str) -> str:
    """The region from its last box on when the text before that box corrects the previous box."""
    boxes = list(_BOX_START.finditer(region))
    if len(boxes) < 2:
        return region
    between = region[_box_end(region, boxes[-2].end()) : boxes[-1].start()]
    return region[boxes[-1].start() :] if _CORRECTION.search(between) else region


def malformed(gold: str) -> str | None:
    """Why a gold answer cannot be trusted (unbalanced braces or brackets), or None.

    math-verify parses `\\frac{1}{2` or `(1/2` into *something*; judging answers against it would turn a typo
    in a data set into wrong rewards. Brackets are counted, not matched: `[0, 1)` is a fine interval.
    """
    depth = 0
    for ch in gold:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return "a '}' closes nothing"
    if depth:
        return f"{depth} unclosed '{{'"
    opened, closed = gold.count("(") + gold.count("["), gold.count(")") + gold.count("]")
    if opened != closed:
        return f"{opened} opening and {closed} closing brackets"
    return None


def gold_answer(gold: str) -> str:
    """The answer part of a gold: what follows GSM8K's `####` marker (a whole solution, or `#### 72`), else all."""
    marker = _GSM8K_MARKER.search(gold)
    return gold[marker.end() :] if marker else gold


def _parse(text: str, options: MathOptions) -> list[Any]:
    """Parse text that may be bare math (`1-\\frac1{e}`), delimited LaTeX, or prose with an answer in it."""
    text = _UPRIGHT_CONSTANT.sub(r"\1", text.strip())
    if not text:
        return []
    targets = [_EXTRACTORS[name] for name in options.extraction]
    # Bare LaTeX is wrapped in $...$: math-verify's plain-expression fallback would read `1-\frac1{e}` as `1`.
    # Bare numbers (`1 000`, `1,22`) are left to its number reader.
    bare = not _DELIMITED.search(text) and not _PROSE_WORD.search(_WORD_ARGUMENT.sub(" ", text))
    if bare and "latex" in options.extraction and not _PLAIN_NUMBER.match(text):
        parsed = parse(f"${text}$", [_EXTRACTORS["latex"]], parsing_timeout=None)  # type: ignore[arg-type]
        if parsed:
            return list(parsed)
    return list(parse(text, targets, parsing_timeout=None))  # type: ignore[arg-type]


def _closed_number(x: Any) -> bool:
    return isinstance(x, sympy.Expr) and not x.free_symbols and x.is_number


def numerically_different(gold: Any, answer: Any, precision: int = 6) -> bool:
    """True when two closed numbers that math-verify called equal differ beyond rounding noise.

    Exact against exact: a relative difference over 1e-40 at 50 digits. When either side is a decimal the
    model wrote, the answer may be rounded: up to 5·10^-precision relative (math-verify rounds to `precision`
    decimal places, which calls every pair of numbers below 10^-precision equal).
    """
    if not (_closed_number(gold) and _closed_number(answer)):
        return False
    if isinstance(gold, sympy.Rational) and isinstance(answer, sympy.Rational):
        return bool(gold != answer)
    try:
        g, a = sympy.N(gold, 50), sympy.N(answer, 50)
        scale = max(abs(g), abs(a))
        if not (scale.is_number and scale.is_finite) or scale == 0:
            return False
        decimal = gold.has(sympy.Float) or answer.has(sympy.Float)
        tol = sympy.Float(5, 50) * sympy.Float(10, 50) ** -precision if decimal else _EXACT_REL_TOL
        return bool(abs(g - a) > tol * scale)
    except (TypeError, ValueError, ArithmeticError):  # cannot evaluate: keep math-verify's verdict
        return False


def _pair_correct(gold: Any, answer: Any, options: MathOptions) -> bool:
    # Gold first: math-verify is asymmetric (assignments and intervals are read from the gold side).
    same = verify(
        gold,
        answer,
        float_rounding=options.precision,
        strict=options.strict,
        allow_set_relation_comp=options.allow_set_relation_comp,
        timeout_seconds=None,
    )
    return bool(same) and not numerically_different(gold, answer, options.precision)


def undefined_number(parsed: list[Any]) -> bool:
    """Read only as a number that does not exist (0/0, 1/0: sympy's nan and zoo), besides its text.

    math-verify raises comparing such a number and counts the pair unequal; only text can then match it.
    """
    exprs = [p for p in parsed if isinstance(p, sympy.Basic | sympy.MatrixBase)]
    return bool(exprs) and all(e.has(sympy.nan, sympy.zoo) for e in exprs)


def _extracted(parsed: list[Any], region: str) -> str:
    """What was read as the answer: math-verify's matched string, else the start of the region."""
    return next((p for p in reversed(parsed) if isinstance(p, str)), region[:200])


def verify_math(answer: str, gold: str, options: MathOptions | None = None) -> MathVerdict:
    """Judge a completion (or bare answer) against a gold answer; no deadline of its own.

    `correct` is None only when the verifier cannot judge: an unusable gold, or an error. An answer with no
    parseable final answer is `unparseable_answer` and wrong (the model gave no answer).
    """
    options = options or MathOptions()
    try:
        why = malformed(gold)
        if why:
            return MathVerdict("unparseable_gold", None, detail=f"gold {gold[:200]!r} is malformed: {why}")
        gold_parsed = _parse(gold_answer(gold), options)
        if not gold_parsed:
            return MathVerdict("unparseable_gold", None, detail=f"cannot parse gold {gold[:200]!r}")
        region = after_correction(answer_region(answer))
        answer_parsed = _parse(region, options)
        if not answer_parsed:
            return MathVerdict("unparseable_answer", False, region[:200], "no final answer could be parsed")
        correct = any(_pair_correct(g, a, options) for g in gold_parsed for a in answer_parsed)
        extracted = _extracted(answer_parsed, region)
        # A gold of 1/0 against a real answer: no answer could be judged right, so it is the data's fault, not
        # the answer's. Both undefined (`12:00` against `1:00`, read as ratios) their texts decide, as above.
        if not correct and not any(isinstance(p, sympy.Basic | sympy.MatrixBase) for p in gold_parsed):
            # A gold read only as text ("# 72") is matched by string equality: another answer cannot be judged.
            return MathVerdict("unparseable_gold", None, extracted, f"gold {gold[:200]!r} could only be read as text")
        if not correct and undefined_number(gold_parsed) and not undefined_number(answer_parsed):
            return MathVerdict("unparseable_gold", None, extracted,
                               f"gold {gold[:200]!r} reads as an undefined number (a division by zero)")  # fmt: skip
        return MathVerdict("correct" if correct else "incorrect", correct, extracted)
    except Exception as exc:  # a verifier bug is an error verdict, never "incorrect"
        log.debug("math verification failed", exc_info=True)
        return MathVerdict("error", None, detail=f"{type(exc).__name__}: {exc}"[:500])
