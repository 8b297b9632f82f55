"""Gold answers as real data sets write them, each with a right, a partial and a wrong answer.

The reward is the only learning signal the trainer gets: for every form a right answer must be `correct`, and a
partial answer (a list missing an item, a point missing a coordinate, the wrong bracket of an interval, a number
without its π) or a wrong one `incorrect` — never full credit. Forms drawn from MATH (lists of roots, points,
intervals, matrices, `\\text{}` answers, base-n numbers), GSM8K (`#### 72`, amounts), AIME (leading zeros), Olympiad
and Numina (assignments, systems, `\\pm`, functions). docs/reward.md ("Lists, points and intervals") states the rule.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from grpo.reward.verifiers.math import MathOptions, verify_math


class Form(NamedTuple):
    name: str
    gold: str
    right: tuple[str, ...]
    partial: tuple[str, ...]
    wrong: tuple[str, ...]


GSM8K_SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether she sold 48+24 = <<48+24=72>>72.\n#### 72"

FORMS = [
    # Numbers
    Form("integer", "17", ("The answer is $\\boxed{17}$.", "<answer>17</answer>"), (), ("\\boxed{71}",)),
    Form("negative integer", "-3", ("\\boxed{-3}", "x = -3"), (), ("\\boxed{3}",)),
    Form("GSM8K solution", GSM8K_SOLUTION, ("So she sold 72 clips.", "\\boxed{72}"), (), ("\\boxed{24}",)),
    Form("GSM8K answer line", "#### 1200", ("\\boxed{1,200}", "1200"), (), ("\\boxed{1,100}",)),
    Form("thousands separators", "7,425,000", ("7425000", "\\boxed{7,425,000}"), (), ("\\boxed{7,425,001}",)),
    Form("thousands with decimals", "12,345.6", ("\\boxed{12345.6}",), (), ("\\boxed{12,345}",)),
    Form("decimal", "0.25", ("\\boxed{\\frac14}", "0.250"), (), ("\\boxed{0.26}",)),
    Form("fraction", "\\frac{3}{4}", ("\\boxed{0.75}", "\\boxed{\\dfrac{3}{4}}"), (), ("\\boxed{\\frac{4}{3}}",)),
    Form("negative fraction", "-\\frac{1}{2}", ("\\boxed{-0.5}", "\\boxed{-\\tfrac12}"), (), ("\\boxed{\\frac12}",)),
    Form("rounded repeating decimal", "\\frac{1}{3}", ("\\boxed{\\frac{2}{6}}",), ("\\boxed{0.33}",), ("\\boxed{3}",)),
    Form("AIME leading zeros", "33", ("\\boxed{033}",), (), ("\\boxed{330}",)),
    Form("scientific notation", "3 \\times 10^{8}", ("\\boxed{300000000}",), (), ("\\boxed{3 \\times 10^{9}}",)),
    Form("power", "2^{10}", ("\\boxed{1024}",), (), ("\\boxed{2^{11}}",)),
    Form("binomial", "\\binom{10}{3}", ("\\boxed{120}",), (), ("\\boxed{720}",)),
    Form("percentage", "25\\%", ("\\boxed{25\\%}",), (), ("\\boxed{30\\%}",)),
    Form("money", "\\$18.90", ("\\boxed{\\$18.90}", "\\boxed{18.9}"), (), ("\\boxed{\\$18.00}",)),
    Form("money with thousands", "\\$1,000", ("\\boxed{1000}", "\\boxed{\\$1,000}"), (), ("\\boxed{\\$100}",)),
    Form("degrees", "30^\\circ", ("\\boxed{30^{\\circ}}", "\\boxed{30°}"), (), ("\\boxed{60^\\circ}",)),
    Form("units", "5 \\text{ cm}", ("\\boxed{5 \\text{ cm}}", "\\boxed{5}"), (), ("\\boxed{6 \\text{ cm}}",)),
    # Closed forms
    Form("radical", "2\\sqrt{3}", ("\\boxed{\\sqrt{12}}",), (), ("\\boxed{3\\sqrt{2}}",)),
    Form(
        "rationalised radical",
        "\\frac{\\sqrt{6}}{3}",
        ("\\boxed{\\sqrt{\\frac{2}{3}}}",),
        (),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}",),
    ),
    Form("multiple of pi", "12\\pi", ("\\boxed{12 \\pi}",), ("\\boxed{12}",), ("\\boxed{12\\pi^2}",)),
    Form("logarithm", "\\log_2 5", ("\\boxed{\\frac{\\ln 5}{\\ln 2}}",), (), ("\\boxed{\\log_5 2}",)),
    Form("complex number", "2 + 3i", ("\\boxed{3i + 2}",), ("\\boxed{2}",), ("\\boxed{2 - 3i}",)),
    Form("infinity", "\\infty", ("\\boxed{\\infty}",), (), ("\\boxed{-\\infty}",)),
    # Expressions, equations, assignments
    Form("polynomial", "x^2 + 2x + 1", ("\\boxed{(x+1)^2}",), (), ("\\boxed{x^2 + 2x - 1}",)),
    Form("line", "y = 2x + 3", ("\\boxed{y = 3 + 2x}",), (), ("\\boxed{y = 2x - 3}",)),
    Form("assignment", "x = 5", ("\\boxed{5}", "\\boxed{x = 5}"), (), ("\\boxed{x = 6}",)),
    Form(
        "system solution", "x = 2, y = 3", ("\\boxed{x = 2, y = 3}",), ("\\boxed{x = 2}",), ("\\boxed{x = 3, y = 2}",)
    ),
    Form("inequality", "x < 3", ("\\boxed{x < 3}",), ("\\boxed{x \\le 3}",), ("\\boxed{x > 3}",)),
    Form("function", "f(x) = x^2", ("\\boxed{f(x) = x^2}",), (), ("\\boxed{f(x) = x^3}",)),
    # Lists (unordered sets of answers), points, sets, intervals
    Form(
        "list of roots",
        "-2, 1",
        ("\\boxed{1, -2}", "\\boxed{-2} \\text{ and } \\boxed{1}", "$\\boxed{-2, 1}$"),
        ("\\boxed{1}", "\\boxed{-2}"),
        ("\\boxed{-1, 2}", "\\boxed{1, -2, 3}"),
    ),
    Form("list in boxes", "2, 3", ("\\boxed{2}, \\boxed{3}", "\\boxed{3, 2}"), ("\\boxed{3}",), ("\\boxed{2, 4}",)),
    Form("list without spaces", "1,2,3", ("\\boxed{3, 2, 1}",), ("\\boxed{1, 2}", "\\boxed{3}"), ("\\boxed{1,2,4}",)),
    Form("ambiguous two-item list", "2,3", ("\\boxed{2, 3}", "\\boxed{3,2}"), ("\\boxed{3}",), ("\\boxed{2.3}",)),
    Form(
        "list of fractions", "\\frac{1}{2}, -3", ("\\boxed{-3, \\frac12}",), ("\\boxed{-3}",), ("\\boxed{\\frac12, 3}",)
    ),
    Form(
        "set", "\\{1, 2\\}", ("\\boxed{\\{2, 1\\}}", "\\boxed{1, 2}"), ("\\boxed{\\{1\\}}",), ("\\boxed{\\{1, 3\\}}",)
    ),
    Form("plus-minus", "\\pm 2", ("\\boxed{\\pm 2}", "\\boxed{2, -2}"), ("\\boxed{2}",), ("\\boxed{\\pm 3}",)),
    Form(
        "plus-minus root pair",
        "3 \\pm \\sqrt{5}",
        ("\\boxed{3 - \\sqrt{5}, 3 + \\sqrt{5}}",),
        ("\\boxed{3 + \\sqrt{5}}",),
        ("\\boxed{3 \\pm \\sqrt{3}}",),
    ),
    Form("point", "(1, 2)", ("\\boxed{(1,2)}",), ("\\boxed{1}",), ("\\boxed{(2,1)}",)),
    Form("triple", "(1, -2, 3)", ("\\boxed{(1,-2,3)}",), ("\\boxed{(1,-2)}",), ("\\boxed{(3,-2,1)}",)),
    Form("interval", "[0, 1)", ("\\boxed{[0,1)}",), ("\\boxed{[0,1]}", "\\boxed{\\{0, 1\\}}"), ("\\boxed{(1,2)}",)),
    Form("ray", "(-\\infty, 2]", ("\\boxed{(-\\infty,2]}",), ("\\boxed{(-\\infty, 2)}",), ("\\boxed{[2, \\infty)}",)),
    Form(
        "union of intervals",
        "(-\\infty, -1) \\cup (1, \\infty)",
        ("\\boxed{(-\\infty,-1)\\cup(1,\\infty)}",),
        ("\\boxed{(1, \\infty)}",),
        ("\\boxed{(-1, 1)}",),
    ),
    # Matrices and vectors
    Form(
        "matrix",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        ("\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}",),
        ("\\boxed{\\begin{pmatrix} 1 & 2 \\end{pmatrix}}",),
        ("\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}}",),
    ),
    Form(
        "vector",
        "\\begin{pmatrix} 2 \\\\ -1 \\end{pmatrix}",
        ("\\boxed{\\begin{pmatrix} 2 \\\\ -1 \\end{pmatrix}}",),
        ("\\boxed{2}",),
        ("\\boxed{\\begin{pmatrix} -2 \\\\ 1 \\end{pmatrix}}",),
    ),
    # Words
    Form(
        "name", "\\text{Evelyn}", ("Therefore $\\boxed{\\text{Evelyn}}$ is our answer.",), (), ("\\boxed{\\text{Bob}}",)
    ),
    Form("yes or no", "Yes", ("\\boxed{\\text{Yes}}", "<answer>yes</answer>"), (), ("\\boxed{No}",)),
    Form("multiple choice", "\\text{(C)}", ("\\boxed{\\text{(C)}}", "\\boxed{C}"), (), ("\\boxed{\\text{(B)}}",)),
]


def _cases(kind: str) -> list[tuple[str, str, str]]:
    return [(form.name, form.gold, answer) for form in FORMS for answer in getattr(form, kind)]


def test_the_table_covers_forty_forms_with_partial_answers() -> None:
    assert len(FORMS) >= 40
    assert sum(bool(form.partial) for form in FORMS) >= 15


@pytest.mark.parametrize(("name", "gold", "answer"), _cases("right"))
def test_a_right_answer_is_correct(name: str, gold: str, answer: str) -> None:
    verdict = verify_math(answer, gold)
    assert (verdict.status, verdict.correct) == ("correct", True), (name, verdict)


@pytest.mark.parametrize(("name", "gold", "answer"), _cases("partial") + _cases("wrong"))
def test_a_partial_or_wrong_answer_is_incorrect(name: str, gold: str, answer: str) -> None:
    verdict = verify_math(answer, gold)
    assert (verdict.status, verdict.correct) == ("incorrect", False), (name, verdict)


@pytest.mark.parametrize(
    ("gold", "reason"),
    [
        ("\\infty-\\infty", "undefined number"),
        ("0\\cdot\\infty", "undefined number"),
        ("\\frac{\\infty}{\\infty}", "undefined number"),
        ("1,,2", "empty item"),
        ("\\{1, , 2\\}", "empty item"),
        ("2, 3,", "empty item"),
    ],
)
def test_an_undefined_or_broken_gold_cannot_be_judged(gold: str, reason: str) -> None:
    """A silent 0 for every answer was a column of wrong rewards; `1,,2` even paid `\\boxed{1}`."""
    for answer in ("\\boxed{1}", "\\boxed{2}", "\\boxed{5}", "\\boxed{0}"):
        verdict = verify_math(answer, gold)
        assert (verdict.status, verdict.correct) == ("unparseable_gold", None), (gold, answer, verdict)
        assert reason in verdict.detail


def test_a_decimal_comma_is_read_only_by_the_expression_reader_alone() -> None:
    """The ambiguous `1,22`: a list by default (as math-verify's LaTeX reader and MATH's boxes read it), a decimal
    comma when only math-verify's plain-expression reader is asked for (its own suite's setting)."""
    assert verify_math("1.22", "1,22").status == "incorrect"
    assert verify_math("\\boxed{1, 22}", "1,22").status == "correct"
    expr = MathOptions(extraction=("expr",))
    assert verify_math("1.22", "1,22", expr).status == "correct"
    assert verify_math("1000,99", "1000.99", expr).status == "correct"
    # A list is a list whichever reader is asked for: never its last item alone.
    for options in (MathOptions(), expr):
        assert verify_math("1", "-2, 1", options).status == "incorrect", options
        assert verify_math("3", "1,2,3", options).status == "incorrect", options
