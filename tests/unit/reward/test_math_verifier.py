"""The math verifier: extraction, math-verify's known false positives caught by the exactness guard, statuses."""

from __future__ import annotations

import pytest

from grpo.reward.verifiers.math import answer_region, malformed, numerically_different, verify_math

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
    # a correction in other words: the boxes were a set {12, 13}, and the corrected answer scored 0
    ("\\boxed{12} is wrong; the answer is \\boxed{13}", "13", "correct"),
    ("\\boxed{12} is wrong; the answer is \\boxed{13}", "12", "incorrect"),
    ("\\boxed{5}\n\nHmm, let me recheck.\n\n\\boxed{6}", "6", "correct"),
    ("\\boxed{5}, or \\boxed{6}", "6", "incorrect"),  # no correction: two answers, never full credit
    ("<think>7</think><answer>6</answer>", "6", "correct"),
    # several boxes, a final-answer sentence after an intermediate box, boxes with text, number formats
    ("\\boxed{1},\\boxed{2},\\boxed{3}", "\\{1,2,3\\}", "correct"),
    ("The roots are \\boxed{-2} and \\boxed{1}.", "1, -2", "correct"),
    ("\\boxed{3}, \\boxed{4}", "4", "incorrect"),  # two answers where one is asked: not the gold
    (
        "$0.05 \\cdot 10,200 = \\boxed{255}$ So she has $10,200 + $255 = $10,455. "
        "Final Answer: The final answer is $10,455$. I hope it is correct.",
        "10455",
        "correct",
    ),
    ("worth $\\boxed{\\$16,\\!386.20}$ in the end", "16386.20", "correct"),
    ("Therefore $\\boxed{\\text{Evelyn}}$ is our answer.", "\\text{Evelyn}", "correct"),
    (
        "\\boxed{\\begin{pmatrix} 0 & 3 \\\\ 0 & -1 \\end{pmatrix}}",
        "\\begin{pmatrix} 0 & 3 \\\\ 0 & -1 \\end{pmatrix}",
        "correct",
    ),
    ("1 000", "1000", "correct"),
    ("1000,99", "1000.99", "incorrect"),  # a list {1000, 99} unless only the expr reader is asked (decimal comma)
    ("7,425,000", "7425000", "correct"),
    # a sign error behind an upright constant (math-verify reads both sides as 1)
    ("1 + \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{\\mathrm{e}}", "incorrect"),
    ("1 - \\frac{1}{e}", "1 - \\frac{1}{\\mathrm{e}}", "correct"),
    # cannot judge
    ("\\boxed{}", "5", "unparseable_answer"),
    ("", "3", "unparseable_answer"),
    ("\\boxed{4}", "", "unparseable_gold"),
]


@pytest.mark.parametrize(("answer", "gold", "status"), CASES)
def test_verify_math_table(answer: str, gold: str, status: str) -> None:
    verdict = verify_math(answer, gold)
    assert verdict.status == status, verdict
    assert verdict.correct == {"correct": True, "incorrect": False, "unparseable_answer": False}.get(status)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer> 12 </answer>", "12"),
        ("<answer>1</answer> later <answer>2</answer>", "2"),
        ("\\boxed{3} <answer>4</answer>", "4"),  # the answer block is the answer; a box in the reasoning is not
        ("<think>7</think><answer> </answer> \\boxed{8}", ""),  # an empty last block is judged: no answer
        ("  just 5  ", "just 5"),
    ],
)
def test_answer_region(completion: str, expected: str) -> None:
    assert answer_region(completion) == expected


@pytest.mark.parametrize(
    ("gold", "why"),
    [
        ("\\frac{1}{2", "1 unclosed '{'"),
        ("(1/2", "1 opening and 0 closing brackets"),
        ("}{", "a '}' closes nothing"),
        ("[0, 1)", None),
        ("\\{1, 2\\}", None),
        ("\\left( \\frac{1}{2}, 3 \\right]", None),
    ],
)
def test_malformed_gold(gold: str, why: str | None) -> None:
    assert malformed(gold) == why


def test_malformed_gold_cannot_be_judged_whatever_the_answer() -> None:
    for gold in ("\\frac{1}{2", "(1/2", "}{"):
        for answer in ("\\boxed{\\frac{1}{2}}", "0.5", "7"):
            verdict = verify_math(answer, gold)
            assert (verdict.status, verdict.correct) == ("unparseable_gold", None), (answer, gold, verdict)
            assert "malformed" in verdict.detail


def test_a_gold_that_divides_by_zero_cannot_be_judged_but_text_still_matches() -> None:
    """math-verify raises comparing nan or zoo and calls the pair unequal: a typo'd gold was a column of 0s."""
    for gold, answer in (("\\frac{0}{0}", "\\boxed{7}"), ("\\frac{1}{0}", "\\infty"), ("1/0", "5")):
        verdict = verify_math(answer, gold)
        assert (verdict.status, verdict.correct) == ("unparseable_gold", None), (gold, answer, verdict)
        assert "undefined number" in verdict.detail
    assert verify_math("\\boxed{\\frac{1}{0}}", "\\frac{1}{0}").correct is True  # the same text
    # Times read as ratios (math-verify's own suite): both sides undefined, the texts decide.
    assert (verify_math("$1:00$", "$12:00$").status, verify_math("$12:00$", "$12:00$").status) == (
        "incorrect",
        "correct",
    )


def test_guard_only_checks_closed_numbers() -> None:
    import sympy

    x = sympy.Symbol("x")
    assert not numerically_different(x + 1, 1 + x)
    assert numerically_different(sympy.Rational(1, 2**99), sympy.Rational(1, 2**98))
    assert numerically_different(1 / sympy.factorial(2004), 1 / sympy.factorial(2006))
    assert not numerically_different(sympy.sqrt(2), sympy.Float("1.41421356"))
    assert not numerically_different(sympy.Rational(1, 3), sympy.Rational(2, 6))


@pytest.mark.parametrize("gold", ["#### 72", "####72", "Natalia sold 48/2 = 24 clips.\n48 + 24 = 72\n#### 72"])
def test_a_gsm8k_gold_is_read_after_its_marker(gold: str) -> None:
    """GSM8K's answers end "#### 72": that gold was read as the text "#### 72", and every answer scored 0."""
    assert verify_math("<answer>72</answer>", gold).status == "correct"
    assert verify_math("<answer>71</answer>", gold).status == "incorrect"


@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("#### 72", "72", "correct"),  # was incorrect: the answer's marker was read as text
        ("<answer>#### 72</answer>", "72", "correct"),
        ("#### 72", "#### 72", "correct"),  # was incorrect
        ("#### 1,200", "1200", "correct"),
        ("She sold 72 clips.\n#### 71", "72", "incorrect"),  # the marked answer decides
        ("#### 71", "#### 72", "incorrect"),
    ],
)
def test_an_answer_is_read_after_its_gsm8k_marker(answer: str, gold: str, status: str) -> None:
    verdict = verify_math(answer, gold)
    assert verdict.status == status, verdict


def test_a_gold_read_only_as_text_cannot_judge_another_answer() -> None:
    """ "# 72" parses to no math: only the same text matches it, so a different answer is null, never 0."""
    verdict = verify_math("<answer>72</answer>", "# 72")
    assert (verdict.status, verdict.correct) == ("unparseable_gold", None)
    assert "could only be read as text" in verdict.detail
