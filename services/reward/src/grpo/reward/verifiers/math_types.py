"""The math verifier's options and verdict: plain data, so the service's main process builds the one and reads the
other without importing sympy and math-verify (only its worker processes verify: grpo.reward.math_tasks)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MathOptions:
    """math-verify's comparison settings, per request (the defaults are math-verify's own)."""

    extraction: tuple[str, ...] = ("latex", "expr")  # parsers for both sides: LaTeX, plain expressions
    precision: int = 6  # decimal places numbers are rounded to before comparing
    strict: bool = True  # False: variable and function names may differ (f(x) equals f(y))
    allow_set_relation_comp: bool = False  # a gold set/interval may equal a relation (x ∈ [a, b] vs a ≤ x ≤ b)
    allow_unevaluated: bool = False  # an integer gold may be matched by an expression for it (`586+47`)
    answer_tag: str = "answer"  # the block the final answer is read from (a Score item's format check may rename it)


@dataclass(frozen=True)
class MathVerdict:
    """The outcome of one verification; `correct` is None when the verifier cannot judge."""

    status: str
    correct: bool | None
    extracted_answer: str = ""
    detail: str = ""
