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
        # A repeating decimal is its fraction: math-verify read 0.\\overline{3} as 0 (so 1/3 scored 0, and such a
        # gold was unparseable) and 0.1\\overline{6} as 0.1 times a symbol.
        ("\\boxed{0.\\overline{3}}", "\\frac{1}{3}", "correct"),
        ("\\boxed{\\frac{1}{7}}", "0.\\overline{142857}", "correct"),
        ("\\boxed{0.1\\overline{6}}", "\\frac{1}{6}", "correct"),
        ("\\boxed{1.\\overline{27}}", "\\frac{14}{11}", "correct"),
        ("\\boxed{0.\\overline{6}}", "0.\\overline{3}", "incorrect"),
        ("\\boxed{0.\\overline{3}}", "0", "incorrect"),
        ("\\boxed{0.33}", "0.\\overline{3}", "incorrect"),
        # \\varnothing is the empty set, as \\emptyset is (math-verify read it as a symbol).
        ("\\boxed{\\varnothing}", "\\emptyset", "correct"),
        ("\\boxed{\\emptyset}", "\\varnothing", "correct"),
        ("\\boxed{\\varnothing}", "\\{1\\}", "incorrect"),
        # Plain spaces between groups of three digits in a box: one number (was the product 1·000 = 0).
        ("\\boxed{1 000 000}", "1000000", "correct"),
        ("\\boxed{12 345}", "12345", "correct"),
        ("\\boxed{1 000}", "0", "incorrect"),  # was correct
        ("\\boxed{12 345}", "4140", "incorrect"),  # was correct (12·345)
        # ... and in `$...$` or `\\(...\\)` outside a box (was the product 1·000 = 0, so 1000 scored 0).
        ("The answer is $1 000$.", "1000", "correct"),
        ("The answer is $12 345$.", "12345", "correct"),
        ("So \\(1 000 000\\).", "1000000", "correct"),
        ("The answer is $1 001$.", "1000", "incorrect"),
        ("The answer is $1 000$.", "0", "incorrect"),
        ("The answer is $1 2$.", "12", "incorrect"),  # only groups of three digits are thousands
        ("The answer is $12 34$.", "1234", "incorrect"),
        # \\fbox is a box (math-verify found it only inside `$...$`: the answer was unparseable, 0).
        ("The answer is \\fbox{3}.", "3", "correct"),
        ("\\fbox{4}", "3", "incorrect"),
        # Spacing and delimiters latex2sympy cannot read, which math-verify's fallback to a number inside used to absorb
        # (section 17 ends that fallback): `~` is a space, `\\left.` nothing, a leading `\\approx` states the value.
        ("\\boxed{4~\\text{cm}}", "4", "correct"),  # was incorrect
        ("\\boxed{5 \\times 10^{3}~\\text{J}}", "5000", "correct"),  # was incorrect
        ("The answer is $4~\\text{cm}$.", "4", "correct"),
        ("\\boxed{\\left. 5 \\right.}", "5", "correct"),
        ("\\boxed{\\approx 5}", "5", "correct"),
        ("\\boxed{5 ~\\text{cm}}", "6", "incorrect"),
    ],
)
def test_notation_is_normalised(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


# 9. Letters after a number are variables when the gold is algebraic: math-verify strips a trailing "unit" from its
# list (t, h, c, l, s, g, m, d, ab, bc, ...), so gold `4s` was 4 and `\frac{1}{2}ab` was 1/2.
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("\\boxed{4}", "4s", "incorrect"),  # was correct
        ("\\boxed{2}", "2ab", "incorrect"),  # was correct
        ("\\boxed{a^2+b^2-2}", "a^2+b^2-2ab", "incorrect"),  # was correct
        ("\\boxed{\\frac{\\sqrt{3}}{4}}", "\\frac{\\sqrt{3}}{4}s", "incorrect"),  # was correct
        ("$100$", "100t", "incorrect"),  # was correct
        ("\\boxed{4s}", "4s", "correct"),
        ("\\boxed{2ba}", "2ab", "correct"),  # was incorrect (2ba against 2)
        ("\\boxed{\\frac{1}{2}ab}", "\\frac{ab}{2}", "correct"),  # was incorrect (1/2 against ab/2)
        ("\\boxed{\\frac{ab}{2}}", "\\frac{1}{2}ab", "correct"),  # was incorrect
        (R("", "2ab"), "2ab", "correct"),
        ("\\boxed{2 + 3i}", "3i + 2", "correct"),  # i is not a unit: still the imaginary unit
        ("\\boxed{2ab \\text{ cm}^2}", "2ab", "correct"),  # the unit goes, the variables stay
        ("\\boxed{2 \\text{ cm}^2}", "2ab", "incorrect"),
        # Against a number the letters are units, as math-verify reads them.
        ("\\boxed{5m}", "5", "correct"),
        ("\\boxed{5 \\text{ cm}}", "5", "correct"),
        ("\\boxed{5}", "5 \\text{ m}", "correct"),
    ],
)
def test_letters_after_a_number_are_variables_against_an_algebraic_gold(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


# 10. A multiple-choice option with its value (`\textbf{(C)}\ 12`, AMC as NuminaMath boxes it) was the product 12·C:
# neither `C` nor `12` matched such a gold, and that answer scored 0 against the gold `C`.
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("\\boxed{C}", "\\textbf{(C)}\\ 12", "correct"),  # was incorrect
        ("\\boxed{\\textbf{(C)}}", "\\textbf{(C)}\\ 12", "correct"),  # was incorrect
        ("\\boxed{12}", "\\textbf{(C)}\\ 12", "correct"),  # was incorrect
        ("\\boxed{\\textbf{(C)}\\ 12}", "C", "correct"),  # was incorrect
        ("\\boxed{\\textbf{(C) }12}", "\\text{(C)}", "correct"),  # was incorrect
        (R("", "(C) 12"), "12", "correct"),  # was incorrect
        ("\\boxed{\\mathrm{(E)}\\ 2\\sqrt{3}}", "\\sqrt{12}", "correct"),  # was incorrect
        ("\\boxed{\\textbf{(C)}\\ 12}", "\\textbf{(C)}\\ 12", "correct"),
        ("\\boxed{B}", "\\textbf{(C)}\\ 12", "incorrect"),
        ("\\boxed{13}", "\\textbf{(C)}\\ 12", "incorrect"),
        ("\\boxed{\\textbf{(B)}\\ 12}", "\\textbf{(C)}\\ 12", "incorrect"),  # the letter decides
        ("\\boxed{\\textbf{(D)}\\ 12}", "C", "incorrect"),
        ("\\boxed{\\textbf{(C)}\\ 13}", "12", "incorrect"),
        # Two options are no choice: hedging never pays.
        ("\\boxed{\\textbf{(C)}\\ 12}, \\boxed{\\textbf{(D)}\\ 13}", "C", "incorrect"),
        ("\\boxed{\\textbf{(C)}\\ 12 \\text{ or } \\textbf{(D)}\\ 13}", "C", "incorrect"),
        ("\\boxed{C, D}", "\\textbf{(C)}\\ 12", "incorrect"),
        # An option named in prose at the end of the answer (was unparseable_answer: no math in it).
        ("Answer: C", "C", "correct"),
        (R("", "The answer is (C)."), "\\textbf{(C)}\\ 12", "correct"),
        ("**Answer: (A)**", "A", "correct"),
        ("The correct option is (B).", "C", "incorrect"),
        ("The answer is C or D.", "C", "unparseable_answer"),  # no one option
        ("Answer: C, not D", "C", "unparseable_answer"),
    ],
)
def test_a_lettered_option_with_its_value_is_read_as_a_choice(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


# 11. A system's solution (`x = 1, y = 2`) against bare values: math-verify sorted both sides by value, so the swapped
# `2, 1` and `(2, 1)` were paid and `(1, 2)` was not. The values come in the variables' order (by name, or as written).
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("\\boxed{2, 1}", "x=1, y=2", "incorrect"),  # was correct
        ("\\boxed{(2,1)}", "x=1, y=2", "incorrect"),  # was correct
        ("\\boxed{3, \\frac12}", "x=0.5, y=3", "incorrect"),  # was correct
        ("\\boxed{(3,2,1)}", "a=1, b=2, c=3", "incorrect"),
        ("\\boxed{(1,2)}", "x=1, y=2", "correct"),  # was incorrect
        ("\\boxed{1, 2}", "x=1, y=2", "correct"),
        (R("", "1, 2"), "x=1, y=2", "correct"),
        ("\\boxed{(1,2,3)}", "a=1, b=2, c=3", "correct"),
        ("\\boxed{y=2, x=1}", "x=1, y=2", "correct"),  # assignments name their variables: any order
        ("\\boxed{2, 1}", "x=1, x=2", "correct"),  # one variable's roots are a set
    ],
)
def test_a_system_solution_pairs_values_with_variables_in_order(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        # The question copied into the answer: math-verify evaluates it and paid it.
        (R("", "047+586"), "633", "incorrect"),
        (R("", "4821 \\times 317"), "1528257", "incorrect"),
        ("\\boxed{4821*317}", "1,528,257", "incorrect"),
        ("\\boxed{2^{10}}", "1024", "incorrect"),
        ("\\boxed{\\frac{8}{2}}", "4", "incorrect"),
        ("\\boxed{\\sqrt{16}}", "4", "incorrect"),
        ("\\boxed{5!}", "120", "incorrect"),
        ("\\boxed{\\left(9+1\\right)}", "10", "incorrect"),
        # The number itself, however written, still is.
        (R("", "633"), "633", "correct"),
        ("\\boxed{1,528,257}", "1528257", "correct"),
        ("\\boxed{-5}", "-5", "correct"),
        ("\\boxed{x = -5}", "-5", "correct"),
        ("\\boxed{3 \\times 6 = 18}", "18", "correct"),  # an equation that states the number
        ("The answer is $18 = 3 \\times 6$.", "18", "correct"),
        ("\\boxed{x = 3 \\times 6}", "18", "incorrect"),
        ("\\boxed{1.2 \\times 10^{3}}", "1200", "correct"),
        ("\\boxed{10^{16}}", "10000000000000000", "correct"),  # a power of ten is how large numbers are written
        ("\\boxed{30^\\circ}", "30", "correct"),
        ("\\boxed{633 \\text{ apples}}", "#### 633", "correct"),
        # Only an integer gold asks for the number: other golds keep math-verify's equivalence.
        ("\\boxed{2^{10}}", "2^{10}", "correct"),
        ("\\boxed{\\frac{1}{2}}", "0.5", "correct"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", "correct"),
        ("\\boxed{586+47}", "586+47", "correct"),
    ],
)
def test_an_integer_gold_wants_the_number_not_an_expression_for_it(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


def test_allow_unevaluated_pays_an_expression_as_math_verify_does() -> None:
    from grpo.reward.verifiers.math_types import MathOptions

    assert verify_math(R("", "047+586"), "633", MathOptions(allow_unevaluated=True)).correct is True
    assert verify_math(R("", "047+587"), "633", MathOptions(allow_unevaluated=True)).correct is False


# 12. A label in the box before the answer (`\\boxed{\\text{The answer is } 3}`) was read as a symbol times the answer.
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        (R("", "\\boxed{\\text{The answer is } 3}"), "3", "correct"),  # was incorrect
        ("\\boxed{\\text{Answer: } 3}", "3", "correct"),  # was incorrect
        ("\\boxed{\\textbf{Final answer:} \\frac{1}{2}}", "0.5", "correct"),  # was incorrect
        (R("", "\\boxed{\\text{The answer is } 4}"), "3", "incorrect"),
        ("\\boxed{\\text{The answer is not } 3}", "3", "incorrect"),  # a label that says more stays
        ("\\boxed{\\text{at most } 3}", "3", "incorrect"),
        ("\\boxed{\\text{The answer is } 3 \\text{ or } 4}", "3", "incorrect"),
    ],
)
def test_an_answer_label_in_a_box_is_not_part_of_the_answer(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


# 13. Scientific notation in plain text (`1.2e3`) was 1.2·e·3, or 1.2 in a sentence; in LaTeX `e` stays Euler's number.
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        (R("", "1.2e3"), "1200", "correct"),  # was incorrect
        (R("", "The answer is 1.2e3."), "1200", "correct"),  # was incorrect
        ("The answer is 2.5E-3.", "0.0025", "correct"),  # was incorrect (2.5)
        (R("", "2.5e-3"), "0.0025", "correct"),  # was incorrect (2.5e − 3)
        (R("", "1.5e10"), "1.5 \\times 10^{10}", "correct"),
        (R("", "1200"), "1.2e3", "correct"),  # a gold so written: was incorrect
        (R("", "1.3e3"), "1200", "incorrect"),
        (R("", "The answer is 1.3e3."), "1200", "incorrect"),
        (R("", "2.6E-3"), "0.0025", "incorrect"),
        (R("", "1.25e1"), "12", "incorrect"),
        # Euler's number keeps its meaning: no exponent digits, a power, or `2e-1` (2e − 1, read as LaTeX).
        ("\\boxed{2e}", "2e", "correct"),
        ("\\boxed{5.436563656918}", "2e", "correct"),
        ("\\boxed{2}", "2e", "incorrect"),
        ("\\boxed{3e^2}", "3e^{2}", "correct"),
        ("\\boxed{300}", "3e^{2}", "incorrect"),
        (R("", "2e-1"), "2e - 1", "correct"),
        (R("", "2e-1"), "0.2", "incorrect"),
        # Alone in a box, too (was 1.2·e·3): a box with more in it keeps Euler's e, as above.
        ("\\boxed{1.2e3}", "1200", "correct"),  # was incorrect
        ("\\boxed{1.5e10}", "1.5 \\times 10^{10}", "correct"),  # was incorrect
        ("\\boxed{1.3e3}", "1200", "incorrect"),
    ],
)
def test_scientific_notation_in_plain_text_is_a_number(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


def test_scientific_notation_is_the_number_an_integer_gold_wants() -> None:
    assert judged(R("", "1.2e3"), "1200") == ("correct", True)  # not "an expression for the integer gold"


# 14. `i` is the imaginary unit against a closed non-real number (math-verify reads it as a variable).
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        (R("", "i"), "\\sqrt{-1}", "correct"),  # was incorrect
        ("\\boxed{2i}", "\\sqrt{-4}", "correct"),  # was incorrect
        ("\\boxed{\\sqrt{-1}}", "i", "correct"),  # was incorrect
        ("\\boxed{1+i\\sqrt{3}}", "1+\\sqrt{-3}", "correct"),  # was incorrect
        ("\\boxed{-i}", "\\sqrt{-1}", "incorrect"),
        ("\\boxed{3i}", "\\sqrt{-4}", "incorrect"),
        ("\\boxed{1-i\\sqrt{3}}", "1+\\sqrt{-3}", "incorrect"),
        ("\\boxed{ix}", "\\sqrt{-1}", "incorrect"),  # `i` with another variable is not rewritten
        ("\\boxed{i}", "1", "incorrect"),
    ],
)
def test_i_is_the_imaginary_unit_against_a_non_real_gold(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


# 15. A decimal is the exact number it writes: math-verify multiplied out a binary float, so `6.022 \times 10^{23}` was
# 602200000000000027262976 and matched neither the integer it writes nor `6.022e23`.
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        (R("", "602200000000000000000000"), "6.022 \\times 10^{23}", "correct"),  # was incorrect
        ("\\boxed{6.022 \\times 10^{23}}", "602200000000000000000000", "correct"),  # was incorrect
        (R("", "6.022e23"), "6.022 \\times 10^{23}", "correct"),  # was incorrect
        ("\\boxed{6.02 \\times 10^{23}}", "6.022 \\times 10^{23}", "incorrect"),
        (R("", "602200000000000000000001"), "6.022 \\times 10^{23}", "incorrect"),
        # Only the digits written count: a float's approximation of 2^64 is not 2^64.
        ("\\boxed{1.8446744073709552 \\times 10^{19}}", "18446744073709551616", "incorrect"),
        ("\\boxed{1.6 \\times 10^{-30}}", "1.5 \\times 10^{-30}", "incorrect"),
    ],
)
def test_a_decimal_is_the_exact_number_it_writes(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)


# 16. A hedge offers several values for one answer ("either 3 or 4"). math-verify read one of them (the first after
# "answer is", else the last; `\lor` it could not read at all, so the box's last number), and a hedge was paid whenever
# that one was the gold: a policy learns to hedge. Each of these was paid for 3 or for 4; now neither. Beside each, the
# same answer committed to 4, which is still read and paid.
HEDGES = [
    ("The answer is either 3 or 4.", "The answer is 4."),
    ("The answer is 3 or 4.", "The answer is 4."),
    ("Either 3 or 4.", "4."),
    ("It's either 3 or 4.", "It's 4."),
    ("The answer is 3 (or 4).", "The answer is 4 (or 2^2)."),
    ("The answer is 3, or possibly 4.", "The answer is 4, or equivalently 2^2."),
    ("3 or possibly 4", "4"),
    ("3, but possibly 4", "4"),
    ("Maybe 3, maybe 4.", "Surely 4."),
    ("3 and/or 4", "4"),
    ("The answer is 3 and 4.", "The answer is 4 and only 4."),
    ("The answer is 3, 4.", "The answer is 4."),
    ("The answer is $3$ (or $4$).", "The answer is $4$."),
    ("$3$ or possibly $4$", "$4$"),
    ("\\boxed{3}, or possibly 4", "\\boxed{4}, or 2^2"),
    ("The answer is 3 or \\boxed{4}", "The answer is \\boxed{4}"),
    ("\\boxed{3 \\lor 4}", "\\boxed{4}"),
    ("\\boxed{3 \\vee 4}", "\\boxed{4}"),
    ("\\boxed{3 \\quad \\lor \\quad 4}", "\\boxed{\\quad 4}"),
    ("$3 \\lor 4$", "$4$"),
    ("\\[3 \\vee 4\\]", "\\[4\\]"),
    ("So the answer is 3 \\lor 4", "So the answer is 4"),
    ("x = 3 \\lor x = 4", "x = 4"),
    ("\\boxed{x = 3 \\lor x = 4}", "\\boxed{x = 4}"),
    ("The answer is x = 3 or x = 4.", "The answer is x = 4."),
    ("\\boxed{3\\text{ (or 4)}}", "\\boxed{4\\text{ (or 2^2)}}"),
    ("\\boxed{3 \\text{ (or } 4\\text{)}}", "\\boxed{4 \\text{ (or } 2^2\\text{)}}"),
    ("\\boxed{3\\ (\\text{or}\\ 4)}", "\\boxed{4}"),
    ("\\boxed{3 ~\\text{or}~ 4}", "\\boxed{~4}"),
    ("\\boxed{3 \\operatorname{or} 4}", "\\boxed{4}"),
]


@pytest.mark.parametrize(("answer", "committed"), HEDGES)
def test_a_hedge_is_wrong_whichever_of_its_values_is_the_gold(answer: str, committed: str) -> None:
    for completion in (answer, R("", answer)):
        check(completion, "3", "incorrect")
        check(completion, "4", "incorrect")
    check(committed, "4", "correct")
    check(R("", committed), "4", "correct")
    check(committed, "3", "incorrect")


# A hedge is read as the set of its values, so a gold that is that set or disjunction still matches it. One value said
# twice, or values named before the answer, are no hedge; nor is a logic formula (`p \lor q`, compared as written).
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("The answer is 3 or 4.", "3, 4", "correct"),  # was incorrect (3)
        ("The answer is either 3 or 4.", "\\{3,4\\}", "correct"),  # was incorrect
        ("The roots are 3 and 4.", "3, 4", "correct"),  # was incorrect (4)
        ("\\boxed{3 \\lor 4}", "3, 4", "correct"),  # was incorrect
        ("\\boxed{x = 3 \\lor x = 4}", "x=3 \\text{ or } x=4", "correct"),  # was incorrect
        ("The answer is x = 3 or x = 4.", "x=3 \\text{ or } x=4", "correct"),  # was incorrect
        ("\\boxed{\\text{either } 3 \\text{ or } 4}", "3, 4", "correct"),  # was incorrect
        ("\\boxed{3 \\text{ or } 4}", "3 \\lor 4", "correct"),  # was unparseable_gold
        ("\\boxed{x=3 \\text{ or } x=4}", "x=3 \\text{ or } x=4", "correct"),
        ("\\boxed{3 \\lor 4}", "3 \\lor 4", "correct"),
        ("\\boxed{3, 4}", "3, 4", "correct"),
        ("\\boxed{\\{3,4\\}}", "\\{3,4\\}", "correct"),
        # Cut off inside its box, a list may go on: no set is stated (a truncated answer is never paid).
        ("\\boxed{-2, 1", "-2, 1", "incorrect"),
        ("The answer is \\boxed{3 \\lor 4", "3, 4", "incorrect"),
        # Not hedges: the answer is one value.
        ("either way, the answer is 4", "4", "correct"),
        ("either way, the answer is 4", "3", "incorrect"),
        ("The answer is 4 (or 2^2).", "4", "correct"),
        ("The answer is $\\frac12$ (or $0.5$).", "\\frac{1}{2}", "correct"),
        ("Let n be 3 or 4. Only n=4 works, so the answer is 4.", "4", "correct"),
        ("\\boxed{2}. It takes 2 or 3 steps.", "2", "correct"),
        ("The answer is 2 (it takes 2 or 3 steps).", "2", "correct"),
        ("The answer is 12 and 3 of them are red.", "12", "correct"),
        # A logic formula keeps its `\lor`, and is compared as written.
        ("\\boxed{p \\lor q}", "p \\lor q", "correct"),
        ("\\boxed{\\neg p \\vee q}", "\\neg p \\vee q", "correct"),
        ("\\boxed{x_1 \\lor x_2}", "x_1 \\lor x_2", "correct"),
        ("\\boxed{p \\land q}", "p \\lor q", "unparseable_gold"),
    ],
)
def test_a_hedge_is_read_as_the_set_of_its_values(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)
    check(R("", answer), gold, status)


# 17. Math that cannot be read as a whole is not read piecemeal: math-verify gave up on `\boxed{3 \mid 4}` and took
# the last number inside it, so any operator it cannot read between two values was a hedge paid for the second.
@pytest.mark.parametrize(
    ("answer", "gold", "status"),
    [
        ("\\boxed{3 \\mid 4}", "4", "incorrect"),  # was correct
        ("\\boxed{3 | 4}", "4", "incorrect"),  # was correct
        ("\\boxed{3 \\land 4}", "4", "incorrect"),  # was correct
        ("\\boxed{3 \\wedge 4}", "4", "incorrect"),  # was correct
        ("\\boxed{3 \\cup 4}", "4", "incorrect"),  # was correct
        ("\\boxed{3 \\text{ (possibly } 4)}", "4", "incorrect"),  # was correct
        ("\\boxed{3 \\sqcup 4}", "4", "incorrect"),  # was correct
        ("\\boxed{2x \\lor 3x}", "3", "incorrect"),  # was correct: the 3 of `3x`
        ("The answer is $3 \\cup 4$.", "3", "incorrect"),  # was correct: `$3` read as 3 dollars
        # Readable math around it is still read.
        ("So we get 5. $\\Box$", "5", "correct"),
        ("$5$; $\\text{QED}\\,\\Box$", "5", "correct"),
        ("The answer is $p \\lor q$.", "p \\lor q", "correct"),
    ],
)
def test_a_number_is_not_read_from_inside_math_that_cannot_be_read(answer: str, gold: str, status: str) -> None:
    check(answer, gold, status)
