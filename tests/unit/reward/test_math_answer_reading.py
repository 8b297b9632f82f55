"""Reviewed grading defects of the math verifier, each through verify_math: which answer is read, and how."""

from __future__ import annotations

import pytest

from grpo.reward.verifiers.math import verify_math

R = "<think>{}</think><answer>{}</answer>".format
SCORES = {"correct": True, "incorrect": False, "unparseable_answer": False}


def judged(answer: str, gold: str) -> tuple[str, bool | None]:
    verdict = verify_math(answer, gold)
    return verdict.status, verdict.correct


def check(answer: str, gold: str, status: str) -> None:
    assert judged(answer, gold) == (status, SCORES.get(status)), verify_math(answer, gold)


# 1. A "final answer is" sentence after an intermediate box is the answer (whichever comes last decides).
INTERMEDIATE = (
    "Step 1 gives \\boxed{5} (the number of pairs). Then multiply by the other factor: the final answer is $7$."
)


@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        (INTERMEDIATE, "7", "correct"),
        (INTERMEDIATE, "5", "incorrect"),  # was correct: the intermediate box won
        (R("", INTERMEDIATE), "5", "incorrect"),
        (R("", "Step 1 gives \\boxed{5}. The final answer is 7."), "7", "correct"),
        (R("", "Step 1 gives \\boxed{5}. The final answer is 7."), "5", "incorrect"),
        ("The final answer is $7$, so \\boxed{5} after all.", "5", "correct"),  # a box after the sentence wins
        ("Hence the final answer is \\boxed{7}.", "7", "correct"),
        ("We get \\boxed{5}. The final answer is above.", "5", "correct"),  # nothing after it: the box stays
    ],
)
def test_a_final_answer_sentence_after_a_box_wins(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


# 2. An empty last <answer> block is no answer: a box in the reasoning must not be graded instead.
@pytest.mark.parametrize(
    "completion",
    [
        R("so it is \\boxed{72}", ""),
        R("so it is \\boxed{72}", "  \n "),
        "<answer>72</answer><answer> </answer> \\boxed{72}",
    ],
)
def test_an_empty_answer_block_is_unparseable(completion: str) -> None:
    check(completion, "72", "unparseable_answer")


# 3. An interval is not the set of its endpoints (math-verify counts (0,1) equal to {0, 1}).
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("\\boxed{\\{0,1\\}}", "(0,1)", "incorrect"),
        ("\\boxed{-\\infty, 2}", "(-\\infty, 2)", "incorrect"),
        ("\\boxed{(0,1)}", "\\{0,1\\}", "incorrect"),
        ("\\boxed{\\{3,4\\}}", "(3,4)", "incorrect"),
        ("\\boxed{1, 0}", "(0,1)", "incorrect"),  # not even the pair, read in order
        ("\\boxed{(0, 1)}", "(0,1)", "correct"),
        ("\\boxed{\\{1, 0\\}}", "\\{0,1\\}", "correct"),
        ("\\boxed{(-\\infty, 2) \\cup (3, \\infty)}", "(-\\infty,2)\\cup(3,\\infty)", "correct"),
        ("${1,3}$", "$(1,3)$", "correct"),  # math-verify's suite: `(1,3)` may be an ordered pair, listed in order
    ],
)
def test_an_interval_is_not_a_set_of_points(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


# 5. Short prose in the answer block is prose, not a product of letters (x·i·s·72) or a ratio (a/72).
@pytest.mark.parametrize(
    ("answer", "gold"),
    [
        ("It is 72.", "72"),
        ("So 72.", "72"),
        ("x is 72", "72"),
        ("= 72", "72"),
        ("A: 72", "72"),
        ("It's 72", "72"),
        ("So n = 72.", "72"),
        ("He is 4", "4"),
        ("So it is -3", "-3"),
    ],
)
def test_short_prose_answers_are_read_as_prose(answer: str, gold: str) -> None:
    check(R("ok", answer), gold, "correct")
    check(R("ok", answer.replace(gold, "9")), gold, "incorrect")


@pytest.mark.parametrize(("answer", "gold"), [("e^{it}", "e^{it}"), ("x \\in S", "x \\in S"), ("ab+c", "c+ab")])
def test_bare_latex_with_letter_pairs_is_still_latex(answer: str, gold: str) -> None:
    check(answer, gold, "correct")


# 6. An escaped dollar is a currency sign, not a math delimiter.
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("\\boxed{18.90}", "\\$18.90", "correct"),
        ("\\boxed{19.90}", "\\$18.90", "incorrect"),  # was unparseable_gold (null) against every answer
        ("\\boxed{4}", "\\$4", "correct"),
        ("\\boxed{5}", "\\$4", "incorrect"),
        (R("", "The total is \\$18."), "#### 18", "correct"),  # was unparseable_answer
        (R("", "The total is \\$17."), "#### 18", "incorrect"),
        ("worth $\\boxed{\\$16,\\!386.20}$ in the end", "16386.20", "correct"),
    ],
)
def test_escaped_dollars_are_currency(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


# 7. A gold of words only, that reads as no math, is compared as words.
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        (R("", "Yes"), "Yes", "correct"),
        (R("", "yes"), "Yes", "correct"),
        (R("", "\\boxed{Yes}"), "Yes", "correct"),
        (R("", "\\boxed{\\text{Yes}}."), "Yes", "correct"),
        (R("", "No"), "Yes", "incorrect"),
        (R("", "\\boxed{No}"), "Yes", "incorrect"),
        (R("", "\\boxed{72}"), "Yes", "incorrect"),
    ],
)
def test_a_words_only_gold_is_compared_as_words(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


def test_a_gold_with_digits_and_no_math_still_cannot_judge() -> None:
    assert judged("<answer>72</answer>", "# 72") == ("unparseable_gold", None)


# 8. Notation normalised before parsing.
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("\\boxed{72.}", "72", "correct"),
        ("\\boxed{1\\,000}", "1000", "correct"),
        ("\\boxed{1\\ 000}", "1000", "correct"),
        ("\\boxed{1\\,000}", "1001", "incorrect"),
        (R("", "30°"), "30", "correct"),
        (R("", "30°"), "30^\\circ", "correct"),
        ("\\boxed{72.5}", "72", "incorrect"),
    ],
)
def test_notation_is_normalised(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)
