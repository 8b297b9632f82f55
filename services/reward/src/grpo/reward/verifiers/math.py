"""Math answer verification on HuggingFace math-verify, with an exactness guard on its numeric shortcuts.

How the final answer is chosen (the text's part: math_text): when the completion has `<answer>…</answer>` blocks,
the last one's content is judged (the format our prompts ask for); otherwise the whole completion. math-verify then
extracts from that text: `\\boxed{}` content first (several boxes on the last line of answers form a
set: `\\boxed{1}, \\boxed{2}` is {1, 2}), a "final answer is …" sentence after an intermediate box
wins, else the last LaTeX or plain-number expression. Bare math (`1-\\frac1{e}`, a gold
without `$`) is read as LaTeX; plain numbers with thousands separators as numbers, and a bare comma list of
numbers (`-2, 1`) as the set of its items, never its last number (the comma rule above `_THOUSANDS`). Scientific
notation outside math (`1.2e3`, `2.5E-3`) is the number it denotes; in LaTeX `e` stays Euler's (math_text).

A hedge, one answer offering several values ("either 3 or 4", `\\boxed{3 \\lor 4}`, "3 (or 4)"), is read as the set of
its values, whichever of them math-verify read: it matches a gold that is that set or disjunction, never one value.
Nor is an answer a number picked out of a box or math span math-verify cannot read (`\\boxed{3 \\mid 4}` was 4).

math-verify compares numbers after rounding (`evalf` + chop), so it calls `1/2^{99}` equal
to `1/2^{98}` and `1/2004!` equal to `1/2006!`. Every pair it accepts is re-checked here:
exact rationals are compared exactly, other closed numbers by a relative difference at
50 digits. The guard only ever turns a "correct" into "incorrect", never the reverse.

Lettered options (`\\textbf{(C)}\\ 12`, math_choice) and bare values against a system's solution (`x = 1, y = 2`,
math_systems) are judged apart from math-verify's reading, which loses the letter and the variables' order.

`verify_math` has no deadline of its own (sympy cannot be interrupted in-process); run it
in a `WorkerPool`, which kills the worker when the deadline passes.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import sympy
from latex2sympy2_extended.sets import FiniteSet as OrderedSet
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from grpo.reward.verifiers.math_choice import choice, stated_letter
from grpo.reward.verifiers.math_systems import assigned_values, listed_values
from grpo.reward.verifiers.math_text import (
    BOX_START,
    ESCAPED_DOLLAR,
    after_correction,
    after_marker,
    answer_region,
    box_end,
    final_answer_sentence,
    hedge,
    keep_variables,
    math_spans,
    normalise,
)
from grpo.reward.verifiers.math_types import MathOptions, MathVerdict

log = logging.getLogger(__name__)
# We enforce deadlines by killing workers, so math-verify's "timeout is disabled" warning is noise.
logging.getLogger("math_verify").setLevel(logging.ERROR)

STATUSES = ("correct", "incorrect", "unparseable_gold", "unparseable_answer", "timeout", "error")

# boxed_match_priority 0: a box outranks every other pattern (math-verify's own test suite uses it).
_EXTRACTORS = {"latex": LatexExtractionConfig(boxed_match_priority=0), "expr": ExprExtractionConfig()}
# Relative tolerance when both sides are exact (pure rounding noise at 50 digits).
_EXACT_REL_TOL = sympy.Float("1e-40", 50)
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
# Short answers are prose too ("It is 72.", "So n = 72.", "A: 72", "= 72"): read as LaTeX they became products
# of letters (x·i·s·72) or a/72. Two-letter English words standing alone between spaces or punctuation are prose;
# inside math they touch an operator or a brace (`e^{it}`, `x \\in S`) and are left alone.
_SHORT_PROSE = re.compile(
    r"(?:^|(?<=\s))(?:is|it|so|he|we|of|to|if|in|be|by|as|at|an|on|my|am|do|us)(?=\s|[.,;:!?']|$)"
    r"|^\s*(?:[a-zA-Z]\s*:\s+|=)",  # a leading label ("A: 72") or a bare "= 72"
    re.IGNORECASE,
)
_WORD_ARGUMENT = re.compile(r"\\(?:begin|end|text|mathrm|mathbf|operatorname)\s*\{[^{}]*\}")  # words, not prose
_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_PLAIN_NUMBER = re.compile(r"^[+-]?[\d\s.,]*\d[\d\s.,]*%?$")  # 1 000, 1,000.5, 2, 3: numbers and commas only
# Commas in plain numbers (docs/reward.md, "Lists"): groups of three digits are thousands (`1,000`, `12,345.6`); any
# other comma separates the items of a list (`-2, 1`, `2,3`: math-verify's LaTeX reader, and MATH's `\boxed{2,3}`),
# except that with the plain-expression reader alone (extraction ["expr"]) one comma between digits is a decimal comma
# (`1,22`, as in math-verify's own suite). math-verify's number reader kept a list's last number: gold `-2, 1` paid 1.
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?$")
_DECIMAL_COMMA = re.compile(r"^[+-]?\d+,\d+%?$")
_EMPTY_ITEM = re.compile(r"^\s*,|(?<!\\),\s*,|,\s*$")  # `1,,2`, `, 2`, `2,`: a list with an item missing
_WORDS_ONLY = re.compile(r"[^\W\d_]+(?:[\s'-]+[^\W\d_]+)*")  # "Yes", "Evelyn", "not possible": no digits
# An integer gold wants the number itself. math-verify evaluates what it reads, so `047+586`, `4821 \\times 317`,
# `2^{10}` and `\\frac{8}{2}` were paid: a policy on arithmetic tasks could copy the question into its answer.
_INTEGER = re.compile(r"[+-]?\d+")
_OPERATION = re.compile(
    r"(?:[\d)}]|\\right\s*[)\]])\s*(?:[-+*/×÷·!]|\^(?!\s*\{?\s*\\circ)|\\(?:times|cdot|div|ast|bmod|pmod|mod)(?![a-zA-Z]))"
    r"|\\(?:[dt]?frac|sqrt|[dt]?binom)(?![a-zA-Z])"
)
# `1.2 \\times 10^{3}`, and `10^{16}` alone: how large numbers are written, not a restated question.
_SCIENTIFIC = re.compile(r"(?:[+-]?\d+(?:\.\d+)?\s*(?:\\times|\\cdot|×|\*)\s*)?10\s*\^\s*\{?\s*[+-]?\d+\s*\}?")
_HEDGE_VALUES_READ = 16  # a hedge with more values is not parsed as a set (`_hedged`)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|boxed|fbox)\s*\{([^{}]*)\}")


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
    answer = after_marker(gold)
    if _EMPTY_ITEM.search(answer) and not _prose(answer):  # `1,,2`: the number reader kept 1 and paid it
        return "a list with an empty item"
    return None


def _algebraic(parsed: list[Any]) -> bool:
    """Whether a parse holds variables (`2ab`, `x = 5`): then letters in an answer are variables, never units."""
    return any(isinstance(p, sympy.Basic) and p.free_symbols for p in parsed)


def _has_math(parsed: list[Any]) -> bool:
    """math-verify returns its matched strings beside the objects; only objects are a reading of the text."""
    return any(not isinstance(p, str) for p in parsed)


def _prose(text: str) -> bool:
    words = _WORD_ARGUMENT.sub(" ", text)
    return bool(_PROSE_WORD.search(words) or _SHORT_PROSE.search(words))


def _parse(text: str, options: MathOptions, *, answer: bool = False) -> list[Any]:
    """Parse text that may be bare math (`1-\\frac1{e}`), delimited LaTeX, or prose with an answer in it.

    An answer (`answer`) is never read from inside math that cannot be read as a whole (`_read_answer`).
    """
    text = normalise(text)
    if not text:
        return []
    targets = [_EXTRACTORS[name] for name in options.extraction]
    # Bare LaTeX is wrapped in $...$: math-verify's plain-expression fallback would read `1-\frac1{e}` as `1`.
    # Bare numbers (`1 000`, `1,000`) are left to its number reader; a bare list of numbers is read item by item.
    bare = not _DELIMITED.search(text) and not _prose(text)
    if bare and _PLAIN_NUMBER.match(text) and not _one_number(text, options):
        return _number_list(text, options)
    if bare and "latex" in options.extraction and not _PLAIN_NUMBER.match(text):
        parsed = parse(f"${text}$", [_EXTRACTORS["latex"]], parsing_timeout=None)  # type: ignore[arg-type]
        if parsed:
            return list(parsed)
    if answer:
        return _read_answer(text, targets)
    return list(parse(text, targets, parsing_timeout=None))  # type: ignore[arg-type]


def _read_answer(text: str, targets: list[Any]) -> list[Any]:
    """math-verify's reading of an answer, but not a number picked out of a box or math span it cannot read.

    When its first choice fails (`\\boxed{3 \\mid 4}`, `$3 \\cup 4$`), math-verify went on to its plain-number reader,
    which took the last number inside that box: any unreadable operator between two values was a hedge paid for the
    second. Such math is blanked out before the rest is read; the failed match stays as text (a `p \\lor q` gold).
    """
    first = list(parse(text, targets, parsing_timeout=None, extraction_mode="first_match"))  # type: ignore[arg-type]
    if _has_math(first):
        return first
    rest = list(parse(_without_unreadable_math(text), targets, parsing_timeout=None))  # type: ignore[arg-type]
    return rest if _has_math(rest) else first


def _without_unreadable_math(text: str) -> str:
    """The text with each box or math span that reads as nothing on its own replaced by spaces (indices unchanged)."""
    for start, end in math_spans(text):
        alone = parse(text[start:end], [_EXTRACTORS["latex"]], parsing_timeout=None, extraction_mode="first_match")
        if not _has_math(list(alone)):
            text = text[:start] + " " * (end - start) + text[end:]
    return text


def _one_number(text: str, options: MathOptions) -> bool:
    """Whether plain-number text is one number rather than a list (the comma rule above `_THOUSANDS`)."""
    if "," not in text or _THOUSANDS.match(text):
        return True
    return "latex" not in options.extraction and bool(_DECIMAL_COMMA.match(text))


def _number_list(text: str, options: MathOptions) -> list[Any]:
    """A bare comma list of numbers as the set of its items (`-2, 1` is {-2, 1}), or nothing when an item is not
    one number (`1,,2`): each item is read on its own, so no reader can keep just one of them."""
    items = []
    for part in text.split(","):
        parsed = [p for p in _parse(part, options) if not isinstance(p, str)] if part.strip() else []
        if len(parsed) != 1 or not _closed_number(parsed[0]):
            return []
        items.append(parsed[0])
    return [OrderedSet(*items), text]  # a sympy FiniteSet that keeps the written order (math_systems reads it)


def _parse_answer(region: str, options: MathOptions) -> tuple[list[Any], str]:
    """The answer's parse and the text it came from: a final-answer sentence after the last box, else the region."""
    sentence = final_answer_sentence(region)
    if sentence is not None:
        parsed = _parse(sentence, options, answer=True)
        if _has_math(parsed):  # "the final answer is above": the box stays the answer
            return parsed, sentence
    return _parse(region, options, answer=True), region


def _hedged(region: str, extracted: str, options: MathOptions) -> tuple[list[Any], str] | None:
    """The set of values a hedge offers ("either 3 or 4") and its text, when the answer read is one of them; None
    when there is no hedge, or its values are one value written twice (`4 (or 2^2)`, `$\\frac12$ (or $0.5$)`).

    Read as that set, a hedge matches a gold that is the same set or disjunction (`3, 4`, `x = 3 \\text{ or } x = 4`),
    never one of its values.
    """
    if _unclosed_box(region):  # cut off inside its box (`\\boxed{-2, 1`): the list may go on, no set is stated
        return None
    values = hedge(region, extracted)
    if values is None or _one_value(values, options):
        return None
    offered = ", ".join(values)
    if len(values) > _HEDGE_VALUES_READ:  # no gold is a set that large: its text only, not thousands of parses
        return [offered], offered
    return _parse(offered, options) or [offered], offered


def _unclosed_box(region: str) -> bool:
    """Whether a box of the region never closes (the text ends inside it): `box_end` reaches the end without the
    box's own brace, whose closing leaves the braces after the box's opening one short by one."""
    for box in BOX_START.finditer(region):
        end = box_end(region, box.end())
        inside = region[box.end() : end]
        if end == len(region) and inside.count("{") - inside.count("}") != -1:
            return True
    return False


def _one_value(values: list[str], options: MathOptions) -> bool:
    """Whether a hedge's values are one value written several ways; stops at the first that differs."""
    first = _math(_parse(values[0], options))
    return first is not None and all(
        (other := _math(_parse(value, options))) is not None and _pair_correct(first, other, options)
        for value in values[1:]
    )


def _math(parsed: list[Any]) -> Any:
    return next((p for p in parsed if not isinstance(p, str)), None)


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


def _interval(x: Any) -> bool:
    return isinstance(x, sympy.Interval) or (
        isinstance(x, sympy.Union) and all(isinstance(part, sympy.Interval) for part in x.args)
    )


def _ordered_pair(gold: Any, answer: Any, answer_text: str, options: MathOptions) -> bool:
    """A gold `(1,3)` may be an ordered pair, not an interval: a bare list of its two entries in order (`1, 3`, no
    set braces) still matches it (math-verify's suite has that case); `3, 1`, `\\{1, 3\\}` or `-\\infty, 2` do not."""
    if not (isinstance(gold, sympy.Interval) and gold.left_open and gold.right_open and len(answer) == 2):
        return False
    if not (gold.start.is_finite and gold.end.is_finite) or "\\{" in answer_text or "," not in answer_text:
        return False
    first = _parse(answer_text.split(",")[0].strip(" {}"), options)
    return any(_closed_number(x) and x == gold.start for x in first)


def interval_against_points(gold: Any, answer: Any, answer_text: str = "", options: MathOptions | None = None) -> bool:
    """An interval on one side and a finite set of points on the other: not the same answer.

    math-verify counts (0, 1) equal to {0, 1} (its endpoints), and a gold `(0,1)` reads as the open interval:
    `\\boxed{\\{0, 1\\}}` or `\\boxed{-\\infty, 2}` then matched an interval, and `\\boxed{(0,1)}` a gold {0, 1}.
    """
    if isinstance(gold, sympy.FiniteSet) and _interval(answer):
        return True
    return (
        _interval(gold)
        and isinstance(answer, sympy.FiniteSet)
        and not _ordered_pair(gold, answer, answer_text, options or MathOptions())
    )


def imaginary_unit(x: Any, other: Any) -> Any:
    """`x` with its variable `i` as the imaginary unit when the other side is a closed non-real number.

    math-verify reads `i` as a variable and `\\sqrt{-1}` as sympy's I, so `i` scored 0 against `\\sqrt{-1}` (and `2i`
    against `\\sqrt{-4}`). Only when `i` is the one variable in `x`: there it cannot stand for anything else.
    """
    if not (isinstance(x, sympy.Expr) and _closed_number(other)):
        return x
    symbols = x.free_symbols
    if not symbols or any(getattr(s, "name", None) != "i" for s in symbols):
        return x
    try:
        non_real = sympy.im(sympy.N(other, 30)) != 0
    except (TypeError, ValueError, ArithmeticError):
        return x
    return x.subs({s: sympy.I for s in symbols}) if non_real else x


def _pair_correct(gold: Any, answer: Any, options: MathOptions, answer_text: str = "") -> bool:
    orders, values = assigned_values(gold), listed_values(answer)
    if orders and values is not None:  # gold `x = 1, y = 2`, answer `2, 1`: math-verify pairs them sorted by value
        return any(
            len(order) == len(values) and all(_pair_correct(g, a, options) for g, a in zip(order, values, strict=True))
            for order in orders
        )
    if interval_against_points(gold, answer, answer_text, options):
        return False
    gold, answer = imaginary_unit(gold, answer), imaginary_unit(answer, gold)
    # Gold first: math-verify is asymmetric (assignments and intervals are read from the gold side).
    same = verify(
        gold,
        answer,
        float_rounding=options.precision,
        strict=options.strict,
        allow_set_relation_comp=options.allow_set_relation_comp,
        timeout_seconds=None,
    )
    if not same and equal_as_written(gold, answer):
        return True
    return bool(same) and not numerically_different(gold, answer, options.precision)


def equal_as_written(gold: Any, answer: Any) -> bool:
    """Whether two closed numbers, one written with a decimal, are equal once each decimal is the exact number it
    writes (`6.022` is 3011/500).

    math-verify multiplies out a binary float, so `6.022 \\times 10^{23}` became 602200000000000027262976 and neither
    `602200000000000000000000` nor that notation matched the other (rounding to `precision` decimal places cannot
    absorb the error of a number that large). Only the digits written count: `1.8446744073709552 \\times 10^{19}` is
    not 2^64.
    """
    if not (_closed_number(gold) and _closed_number(answer)) or not (gold.has(sympy.Float) or answer.has(sympy.Float)):
        return False
    try:
        exact = [x.xreplace({f: sympy.Rational(str(f)) for f in x.atoms(sympy.Float)}).doit() for x in (gold, answer)]
        return bool(exact[0].is_Rational and exact[1].is_Rational and exact[0] == exact[1])
    except (TypeError, ValueError, ArithmeticError):
        return False


def undefined_number(parsed: list[Any]) -> bool:
    """Read only as a number that does not exist (0/0, 1/0: sympy's nan and zoo), besides its text.

    math-verify raises comparing such a number and counts the pair unequal; only text can then match it.
    """
    exprs = [p for p in parsed if isinstance(p, sympy.Basic | sympy.MatrixBase)]
    return bool(exprs) and all(_undefined(e) for e in exprs)


def _undefined(expr: Any) -> bool:
    """nan or zoo, also once evaluated: math-verify keeps `\\infty-\\infty` and `0\\cdot\\infty` unevaluated
    (-oo + oo, 0*oo), and compared so they were a sound gold that every answer missed."""
    if expr.has(sympy.nan, sympy.zoo):
        return True
    if not (isinstance(expr, sympy.Expr) and expr.has(sympy.oo, -sympy.oo)):
        return False
    try:
        return bool(expr.doit().has(sympy.nan, sympy.zoo))
    except (TypeError, ValueError, ArithmeticError):
        return False


def _extracted(parsed: list[Any], region: str) -> str:
    """What was read as the answer: math-verify's matched string, else the start of the region."""
    return next((p for p in reversed(parsed) if isinstance(p, str)), region[:200])


def _words(text: str) -> str:
    """A one-word (or few-word) answer as a grader compares it: no \\text{}/\\boxed{} wrappers, case or edge punctuation."""
    previous = None
    while previous != text:  # \\boxed{\\text{Yes}}: unwrap from the inside out
        previous, text = text, _TEXT_WRAPPER.sub(r"\1", text)
    text = ESCAPED_DOLLAR.sub("", text).replace("$", " ")
    return " ".join(text.split()).strip(" .,;:!?()'\"").casefold()


def word_gold(gold: str) -> str | None:
    """The normalised words of a gold made of words only (`Yes`, `\\text{Evelyn}`), else None."""
    words = _words(gold)
    return words if _WORDS_ONLY.fullmatch(words) else None


def _word_verdict(words: str, region: str) -> MathVerdict:
    """A words-only gold math-verify reads as nothing: the answer's words (its last box, if any) decide."""
    boxes = list(BOX_START.finditer(region))
    said = region[boxes[-1].start() : box_end(region, boxes[-1].end())] if boxes else region
    correct = _words(said) == words
    return MathVerdict("correct" if correct else "incorrect", correct, said[:200], "compared as words")


def unevaluated(answer_text: str, gold_text: str) -> bool:
    """Whether an answer to an integer gold is an expression for it (`047+586`, `2^{10}`, `\\frac{8}{2}`) rather than
    the number. An equation that states a number is the number (`3 \\times 6 = 18`, `x = 18`), and so is scientific
    notation (`1.2 \\times 10^{3}`, `10^{16}`)."""
    if not _INTEGER.fullmatch(re.sub(r"[\s,]|\\[,; !]", "", gold_text)):
        return False
    sides = [side.strip() for side in answer_text.split("=") if re.search(r"\d", side)]
    return bool(sides) and all(_OPERATION.search(side) and not _SCIENTIFIC.fullmatch(side) for side in sides)


def _choice_correct(gold: tuple[str, list[Any]], answer: tuple[str, list[Any]], options: MathOptions) -> bool | None:
    """A multiple-choice verdict when a side (its text, its parse) names an option with its value (`\\textbf{(C)}\\ 12`,
    read by math-verify as 12·C), else None.

    Two options: the letters decide (`C` and `(C) 12` agree, `(B) 12` does not). An option against a side with no
    letter: its value is compared with that side (`12`, or an answer's `(C) 12` against a gold `12`).
    """
    gold_choice, answer_choice = choice(gold[0]), choice(answer[0])
    if not ((gold_choice and gold_choice.value) or (answer_choice and answer_choice.value)):
        return None
    if gold_choice and answer_choice:
        return gold_choice.letter == answer_choice.letter
    gold_values = _parse(gold_choice.value, options) if gold_choice else gold[1]
    answer_text = answer_choice.value if answer_choice else answer[0]
    answer_values = _parse(answer_text, options) if answer_choice else answer[1]
    return any(_pair_correct(g, a, options, answer_text) for g in gold_values for a in answer_values)


def _stated_option(gold_text: str, region: str) -> MathVerdict | None:
    """The verdict on a prose answer naming an option ("Answer: C", where math-verify reads no math) for a gold that
    is one; else None."""
    gold_choice, letter = choice(gold_text), stated_letter(region)
    if not (gold_choice and letter):
        return None
    correct = letter == gold_choice.letter
    return MathVerdict("correct" if correct else "incorrect", correct, letter, "compared as an option")


def check_gold(gold: str, options: MathOptions | None = None) -> MathVerdict:
    """The gold alone: parsed and compared with itself (run apart, to tell whose fault a timeout was)."""
    options = options or MathOptions()
    if malformed(gold):
        return MathVerdict("unparseable_gold", None)
    parsed = _parse(keep_variables(after_marker(gold)), options)
    for g in parsed:
        _pair_correct(g, g, options)
    return MathVerdict("correct" if parsed else "unparseable_gold", bool(parsed) or None)


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
        gold_parsed = _parse(keep_variables(after_marker(gold)), options)
        region = after_correction(after_marker(answer_region(answer, options.answer_tag)))
        region = keep_variables(region) if _algebraic(gold_parsed) else region
        words = word_gold(after_marker(gold)) if not _has_math(gold_parsed) else None
        if words:  # `Yes`: no math in it, so nothing else could judge the answer
            return _word_verdict(words, region)
        if not gold_parsed:
            return MathVerdict("unparseable_gold", None, detail=f"cannot parse gold {gold[:200]!r}")
        answer_parsed, region = _parse_answer(region, options)
        if not answer_parsed:
            return _stated_option(_extracted(gold_parsed, gold), region) or MathVerdict(
                "unparseable_answer", False, region[:200], "no final answer could be parsed"
            )
        extracted, gold_text = _extracted(answer_parsed, region), _extracted(gold_parsed, gold)
        hedged = _hedged(region, extracted, options)
        if hedged is not None:  # "either 3 or 4": the answer is both values, whichever one was read
            answer_parsed, extracted = hedged
        by_choice = _choice_correct((gold_text, gold_parsed), (extracted, answer_parsed), options)
        correct = (
            by_choice
            if by_choice is not None
            else any(_pair_correct(g, a, options, extracted) for g in gold_parsed for a in answer_parsed)
        )
        if correct and not options.allow_unevaluated and unevaluated(extracted, gold_text):
            return MathVerdict("incorrect", False, extracted, "an expression for the integer gold, not the number "
                               "itself (allow_unevaluated: true accepts it, as math-verify does)")  # fmt: skip
        # A gold of 1/0 against a real answer: no answer could be judged right, so it is the data's fault, not
        # the answer's. Both undefined (`12:00` against `1:00`, read as ratios) their texts decide, as above.
        if not correct and not any(isinstance(p, sympy.Basic | sympy.MatrixBase) for p in gold_parsed):
            # A gold read only as text ("# 72") is matched by string equality: another answer cannot be judged.
            return MathVerdict("unparseable_gold", None, extracted, f"gold {gold[:200]!r} could only be read as text")
        if not correct and undefined_number(gold_parsed) and not undefined_number(answer_parsed):
            return MathVerdict("unparseable_gold", None, extracted,
                               f"gold {gold[:200]!r} reads as an undefined number (0/0, 1/0, ∞−∞, 0·∞)")  # fmt: skip
        return MathVerdict("correct" if correct else "incorrect", correct, extracted)
    except Exception as exc:  # a verifier bug is an error verdict, never "incorrect"
        log.debug("math verification failed", exc_info=True)
        return MathVerdict("error", None, detail=f"{type(exc).__name__}: {exc}"[:500])
