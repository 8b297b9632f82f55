"""A gold that solves a system (`x = 1, y = 2`) against an answer that lists bare values (`1, 2`, `(1, 2)`).

math-verify sorts both sides by value before pairing them, so `\\boxed{2, 1}` and `\\boxed{(2, 1)}` matched the gold
`x = 1, y = 2` (the values swapped between the variables), while `\\boxed{(1, 2)}` did not. Here the listed values
must come in the variables' order: by name (x, y; a, b, c), or as the gold writes them.
"""

from __future__ import annotations

from typing import Any

import sympy
from sympy.core.relational import Relational


def assigned_values(gold: Any) -> list[list[Any]] | None:
    """The values of a gold system in the orders an answer may list them (by name, as written), else None."""
    if not isinstance(gold, sympy.FiniteSet) or len(gold) < 2:
        return None
    equations = list(getattr(gold, "_unsorted_args", gold.args))
    if not all(isinstance(eq, sympy.Eq) and isinstance(eq.lhs, sympy.Symbol) for eq in equations):
        return None
    if len({eq.lhs for eq in equations}) != len(equations):  # `x = 1, x = 2`: the roots, a set
        return None
    by_name = sorted(equations, key=lambda eq: eq.lhs.name)
    return [[eq.rhs for eq in by_name], [eq.rhs for eq in equations]]


def listed_values(answer: Any) -> list[Any] | None:
    """An answer's bare values in the order written (`2, 1`, `(2, 1)`, `(1, 2)` read as an interval), else None."""
    if isinstance(answer, sympy.Tuple):
        values = list(answer.args)
    elif isinstance(answer, sympy.FiniteSet) and hasattr(answer, "_unsorted_args"):
        values = list(answer._unsorted_args)
    elif isinstance(answer, sympy.Interval) and answer.left_open and answer.right_open:
        values = [answer.start, answer.end]
    else:
        return None
    return None if any(isinstance(value, Relational) for value in values) else values
