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

The same goes for the other ways a test states a check: the comparisons in the condition of an `if` that raises or
exits (`if f(1) != 3: raise AssertionError`), and in the arguments of a unittest-style assertion method
(`self.assertTrue(f(1) == 3)`), whose two compared arguments are checked too (`self.assertEqual(f(1), 3)`,
`assertAlmostEqual`, `assertIn`, `assertListEqual`, ...: PAIRED), whatever object the method is called on. Such a
method's failure fails the tests however they run it (`unittest.main()`, an unchecked runner, pytest-style functions:
verifiers/frameworks.py).

What this does not stop: code written against this harness (it can rebind the names used here, or set its
`__name__`); see grpo/reward/sandbox/languages.py for the threat model of the sandbox's proof.
"""

from __future__ import annotations

import ast
import functools
import threading

GUARD_NAME = "__grpo_compare__"
LINES_NAME = "__grpo_candidate_lines__"  # set by code.program_for: the candidate's code is the program's lines 1..N
CALL_NAME = "__grpo_assertion__"  # calls a PAIRED method after checking its two compared arguments as GUARD_NAME does
_OPERATORS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
              ast.NotIn: "not in"}  # fmt: skip
# unittest.TestCase's methods that compare their first two arguments (with the aliases unittest still has or had).
PAIRED = frozenset({
    "assertEqual", "assertNotEqual", "assertAlmostEqual", "assertNotAlmostEqual", "assertListEqual",
    "assertTupleEqual", "assertSetEqual", "assertDictEqual", "assertSequenceEqual", "assertMultiLineEqual",
    "assertCountEqual", "assertGreater", "assertGreaterEqual", "assertLess", "assertLessEqual", "assertIn",
    "assertNotIn", "assertDictContainsSubset", "assertItemsEqual", "assertEquals", "assertNotEquals",
    "assertAlmostEquals", "assertNotAlmostEquals", "failUnlessEqual", "failIfEqual", "failUnlessAlmostEqual",
    "failIfAlmostEqual",
})  # fmt: skip
# Where a comparison is the check itself: the arguments of these (assertTrue(a == b)) and of PAIRED.
CHECKING = PAIRED | {"assertTrue", "assertFalse", "assert_", "failUnless", "failIf"}
_EXITS = frozenset({"exit", "quit", "_exit"})  # exit(1), sys.exit(1), os._exit(1)

# Defined after the candidate has run and before the tests (the candidate is `__candidate__`, see code.program_for).
GUARD = f'''
def {GUARD_NAME}_make():
    import operator, sys, types
    ops = {{"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}}
    # What a comparison calls (a list subclass of the candidate's with its own __getitem__ still compares as a list).
    names = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__")
    # Whose code a function is, by where it was written: a class the candidate makes when the tests call it gets the
    # module name of that moment (`__main__`), so the module alone let `def f(): class E: __eq__ = ...` through.
    program, candidate_lines = sys._getframe().f_code.co_filename, globals().get("{LINES_NAME}", 0)

    def written(entry):
        """"candidate" or "tests" for code written in the program (a function, or a property, partialmethod,
        staticmethod, classmethod or partial around one), "__candidate__"'s code wherever it was compiled, else None."""
        for _ in range(5):
            code = getattr(entry, "__code__", None)
            if isinstance(code, types.CodeType):
                if code.co_filename == program:
                    return "candidate" if code.co_firstlineno <= candidate_lines else "tests"
                return "candidate" if getattr(entry, "__module__", None) == "__candidate__" else None
            inner = [getattr(entry, a, None) for a in ("fget", "func", "__func__", "__wrapped__")]
            entry = next((x for x in inner if x is not None), None)
            if entry is None:
                return None
        return None

    def own(kind):
        """Whether the class compares by the candidate's code: a comparison the candidate wrote anywhere in its
        classes, or in a class of the program's any comparison that is no function of the tests' or of a library's
        (`__eq__ = functools.partial(...)`); a dataclass's generated methods are functions of no one's lines."""
        for c in getattr(kind, "__mro__", ()):
            ours = getattr(c, "__module__", None) in ("__candidate__", "__main__")
            for n in names:
                entry = vars(c).get(n)
                if entry is None:
                    continue
                whose = written(entry)
                if whose == "candidate" or (whose is None and ours and not isinstance(entry, types.FunctionType)):
                    return True
        return False

    def foreign(value, budget, depth=0):
        """The candidate's class with comparisons of its own, in value or its items (10,000 items at most, 20 deep),
        else None."""
        kind = type(value)
        if own(kind):
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

    def check(op, left, right):
        mine, theirs = foreign(left, [10_000]), foreign(right, [10_000])
        if (mine is None) != (theirs is None):
            kind = (mine or theirs).__name__
            raise AssertionError(f"`{{op}}` between an object of the candidate's class {{kind}}, which compares by its "
                                 "own methods, and a plain value: not judged equal")

    def compare(op, left, right):
        check(op, left, right)
        return ops[op](left, right)

    # The compared arguments' names in unittest's methods, for those given by keyword (`first=f(1), second=3`).
    compared = {{"first", "second", "member", "container", "a", "b", "list1", "list2", "tuple1", "tuple2", "set1",
                "set2", "seq1", "seq2", "d1", "d2", "subset", "dictionary"}}

    def call(method, /, *args, **kwargs):
        pair = [*args[:2], *(value for key, value in kwargs.items() if key in compared)][:2]
        if len(pair) == 2:
            check(getattr(method, "__name__", "assertion"), *pair)
        return method(*args, **kwargs)

    return compare, call


{GUARD_NAME}, {CALL_NAME} = {GUARD_NAME}_make()
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
    """Every single comparison inside a check (an assert statement, the condition of an `if` that fails the tests,
    the arguments of an assertion method) as a call of the guard, and a PAIRED method's call through CALL_NAME, which
    checks its two compared arguments. `changed`: whether it rewrote anything."""

    def __init__(self) -> None:
        self.changed = False

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        self.changed = True
        node.test = _Guarded().visit(node.test)
        return node

    def visit_If(self, node: ast.If) -> ast.If:
        self.generic_visit(node)
        if _fails(node.body) or _fails(node.orelse):
            self.changed = True
            node.test = _Guarded().visit(node.test)
        return node

    def visit_Call(self, node: ast.Call) -> ast.Call:
        # `x.assertEqual(a, b)` -> `CALL_NAME(x.assertEqual, a, b)`: the method is looked up before its arguments are
        # evaluated, as before; given by keyword or unpacked (`*pair`), its arguments are checked all the same.
        self.generic_visit(node)
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if method not in CHECKING:
            return node
        self.changed = True
        node.args = [_Guarded().visit(arg) for arg in node.args]
        for keyword in node.keywords:
            keyword.value = _Guarded().visit(keyword.value)
        if method in PAIRED:
            return ast.copy_location(
                ast.Call(ast.Name(CALL_NAME, ast.Load()), [node.func, *node.args], node.keywords), node
            )
        return node


def _fails(body: list[ast.stmt]) -> bool:
    """Whether a block ends by failing the tests: a `raise`, or an exit (`sys.exit(1)`)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, ast.Raise):
        return True
    call = last.value if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call) else None
    name = call and (call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None))
    return name in _EXITS


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
    """The assert tests with their checks' comparisons guarded (_Comparisons), the guard defined before them; as they
    are when they do not parse (they fail as written) or hold no check."""
    try:
        tree = parse(tests)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return tests
    rewrite = _Comparisons()
    tree = rewrite.visit(tree)
    if not rewrite.changed:
        return tests
    return GUARD + ast.unparse(ast.fix_missing_locations(tree))
