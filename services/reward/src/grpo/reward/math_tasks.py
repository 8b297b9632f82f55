"""What the main process hands the math workers: named here, so naming them costs the main process no sympy.

A pool task's function travels by reference (its module and name, as pickle writes it), and pickling it imports
its module in the sender: handing over grpo.reward.verifiers.math.verify_math itself made the main process import
sympy and math-verify (~40 MB RSS) only to name it. The workers' forkserver preloads that module, so the import
below is a look-up in sys.modules there, not an import.
"""

from __future__ import annotations

from grpo.reward.verifiers.math_types import MathOptions, MathVerdict


def verify_math(answer: str, gold: str, options: MathOptions | None = None) -> MathVerdict:
    """grpo.reward.verifiers.math.verify_math, in the worker that runs it."""
    from grpo.reward.verifiers.math import verify_math as verify

    return verify(answer, gold, options)


def check_gold(gold: str, options: MathOptions | None = None) -> MathVerdict:
    """grpo.reward.verifiers.math.check_gold, in the worker that runs it."""
    from grpo.reward.verifiers.math import check_gold as check

    return check(gold, options)
