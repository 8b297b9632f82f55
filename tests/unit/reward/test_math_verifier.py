"""The math verifier: extraction, math-verify's known false positives caught by the exactness guard, statuses."""

from __future__ import annotations

import pytest

from grpo.reward.verifiers.math import extract_final_answer, last_boxed, numerically_different, verify_math

# (answer or completion, gold, expected status) — the cases math-verify alone gets wrong are marked.
CASES = [
    # math-verify calls these equal (evalf + chop); they are not.
    ("\\boxed{\\frac{1}{2^{98}}}", "\\frac{1}{2^{99}}", "incorrect"),
    ("1/2^{98}", "1/2^{99}", "incorrect"),
    ("\\frac{1}{2006!}", "\\frac{1}{2004!}", "incorrect"),
    ("e^{-51}", "e^{-50}", "incorrect"),
    ("10^{-20}", "2\\cdot 10^{-20}", "incorrect"),
    # bare gold `1-\frac1{e}` is read as `1` by math-verify's plain-expression fallback.
    ("\\boxed{1+\\frac1{e}}", "1-\\frac1{e}", "incorrect"),
    ("\\boxed{1-\\frac1{e}}", "1-\\frac1{e}", "correct"),
    ("\\frac{e-1}{e}", "1-\\frac1{e}", "correct"),
    ("\\frac{1}{2004!}", "\\frac{1}{2004!}", "correct"),
    ("\\frac{1}{2^{99}}", "2^{-99}", "correct"),
    # ordinary equivalences still hold
    ("\\boxed{\\frac{2}{4}}", "0.5", "correct"),
    ("0.5", "\\frac12", "correct"),
    ("1.41421356", "\\sqrt{2}", "correct"),
    ("x+1", "1+x", "correct"),
    ("50\\%", "0.5", "correct"),
    ("\\boxed{2, 3}", "\\{2,3\\}", "correct"),
    ("<answer>x = 5</answer>", "5", "correct"),
    ("The answer is 42", "42", "correct"),
    ("3.14159", "\\pi", "incorrect"),
    ("\\boxed{41}", "42", "incorrect"),
    # \boxed first, then <answer>
    ("<think>maybe 3</think><answer>\\boxed{4} is it</answer>", "4", "correct"),
    ("I think \\boxed{3}, no wait: \\boxed{4}", "4", "correct"),
    ("<think>7</think><answer>6</answer>", "6", "correct"),
    # cannot judge
    ("\\boxed{}", "5", "unparseable_answer"),
    ("", "3", "unparseable_answer"),
    ("\\boxed{4}", "", "unparseable_gold"),
]


@pytest.mark.parametrize(("answer", "gold", "status"), CASES)
def test_verify_math_table(answer: str, gold: str, status: str) -> None:
    verdict = verify_math(answer, gold)
    assert verdict.status == status, verdict
    assert verdict.correct == {"correct": True, "incorrect": False}.get(status)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("\\boxed{a} then \\boxed{{b}}", "{b}"),
        ("\\fbox{7}", "7"),
        ("\\boxed{unbalanced", None),
        ("nothing", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer> 12 </answer>", "12"),
        ("<answer>1</answer> later <answer>2</answer>", "2"),
        ("\\boxed{3} <answer>4</answer>", "3"),
        ("  just 5  ", "just 5"),
    ],
)
def test_extract_final_answer(completion: str, expected: str) -> None:
    assert extract_final_answer(completion) == expected


def test_guard_only_checks_closed_numbers() -> None:
    import sympy

    x = sympy.Symbol("x")
    assert not numerically_different(x + 1, 1 + x)
    assert numerically_different(sympy.Rational(1, 2**99), sympy.Rational(1, 2**98))
    assert numerically_different(1 / sympy.factorial(2004), 1 / sympy.factorial(2006))
    assert not numerically_different(sympy.sqrt(2), sympy.Float("1.41421356"))
    assert not numerically_different(sympy.Rational(1, 3), sympy.Rational(2, 6))
