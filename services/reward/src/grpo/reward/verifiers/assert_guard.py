"""Assert tests that an object built to equal anything cannot pass.

A candidate shares its interpreter with its assert tests (HumanEval's contract), so it can return an object whose
`__eq__` always answers True (`class AlwaysEqual`) and pass `assert f(1) == 3`; with `__lt__`, `__sub__` and
`__abs__` too it passes `assert abs(f(1) - 3) < 1e-6`. That is a reward hack a policy trained on these tests can find.

Each comparison in the tests' `assert` statements (`==`, `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in`; not `is`, which
calls nothing) is rewritten into a call that compares as Python does, unless exactly one side holds an object whose
class the candidate defined with comparisons of its own (a method of the candidate's module, `__candidate__`): then
the assertion fails, saying why. Objects of the candidate's classes on both sides compare as usual (a `ListNode` with
its own `__eq__` against one the tests built with it), as do plain values, the tests' own helpers (`Approx(0.5)`) and
the candidate's namedtuples and dataclasses (their comparisons are not the candidate's code).

What this does not stop: code written against this harness (it can rebind the names used here, or set its
`__name__`); see grpo/reward/sandbox/languages.py for the threat model of the sandbox's proof.
"""

from __future__ import annotations

import ast
import functools
import threading

GUARD_NAME = "__grpo_compare__"
_OPERATORS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
              ast.NotIn: "not in"}  # fmt: skip

# Defined after the candidate has run and before the tests (the candidate is `__candidate__`, see code.program_for).
GUARD = f'''
def {GUARD_NAME}_make():
    import operator
    ops = {{"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}}
    # What a comparison calls (a list subclass of the candidate's with its own __getitem__ still compares as a list).
    names = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__")

    def foreign(value, budget, depth=0):
        """The candidate's class with comparisons of its own, in value or its items (10,000 items at most, 20 deep),
        else None."""
        kind = type(value)
        if any(getattr(getattr(kind, n, None), "__module__", None) == "__candidate__" for n in names):
            return kind
        if kind in (list, tuple, set, frozenset, dict) and budget[0] > 0 and depth < 20:
            for item in (*value.keys(), *value.values()) if kind is dict else value:
                budget[0] -= 1
                if budget[0] <= 0:
                    break
                found = foreign(item, budget, depth + 1)
                if found:
                    return found
        return None

    def compare(op, left, right):
        mine, theirs = foreign(left, [10_000]), foreign(right, [10_000])
        if (mine is None) != (theirs is None):
            kind = (mine or theirs).__name__
            raise AssertionError(f"`{{op}}` between an object of the candidate's class {{kind}}, which compares by its "
                                 "own methods, and a plain value: not judged equal")
        return ops[op](left, right)

    return compare


{GUARD_NAME} = {GUARD_NAME}_make()
del {GUARD_NAME}_make
'''


# ast.parse from several threads at once (the sandbox's) raised "SystemError: AST constructor recursion depth
# mismatch" (CPython gh-106905, fixed after 3.11), a sandbox_error for one HumanEval test in ~3 runs under load.
_PARSING = threading.Lock()


def parse(source: str) -> ast.Module:
    """ast.parse, one thread at a time."""
    with _PARSING:
        return ast.parse(source)


class _Comparisons(ast.NodeTransformer):
    """Every single comparison inside an assert statement, as a call of the guard."""

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        node.test = _Guarded().visit(node.test)
        return node


class _Guarded(ast.NodeTransformer):
    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        operator = _OPERATORS.get(type(node.ops[0]))
        if len(node.ops) != 1 or operator is None:  # `is`, and chains (`a < b < c`: evaluated once each, lazily)
            return node
        call = ast.Call(ast.Name(GUARD_NAME, ast.Load()), [ast.Constant(operator), node.left, node.comparators[0]], [])
        return ast.copy_location(call, node)


@functools.lru_cache(maxsize=64)  # the same tests for every candidate of a task
def guarded(tests: str) -> str:
    """The assert tests with their comparisons guarded, the guard defined before them; as they are when they do not
    parse (they fail as written) or hold no assert statement."""
    try:
        tree = parse(tests)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return tests
    if not any(isinstance(node, ast.Assert) for node in ast.walk(tree)):
        return tests
    return GUARD + ast.unparse(ast.fix_missing_locations(_Comparisons().visit(tree)))
