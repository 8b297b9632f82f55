"""Assert tests written for unittest or pytest, judged as those tools judge them.

An assert test is one program: the candidate (module `__candidate__`), then the tests (as `__main__`), then the proof
of completion (grpo/reward/sandbox/languages.py). Test code written for a test runner relies on that runner, which
the program alone does not give: `unittest.main()` exits before the proof (every candidate failed),
`unittest.main(exit=False)` or an unchecked `TextTestRunner().run(suite)` reports failures without raising, and
pytest-style `def test_x(): ...` that nothing calls never runs (every candidate passed). So, for tests that use these
forms, a harness runs around them:

* `unittest.main(...)`, whatever its arguments, runs the tests' cases as it does and exits with 1 when one failed, but
  never exits on success (the proof comes after the tests). Every unittest run in the program is recorded; one that
  recorded a failure, an error or an unexpected success fails the tests, checked or not. TestCase classes the tests
  define and never run are run after them, as `python -m unittest` or pytest would collect them.
* Top-level functions named `test*` the tests define and never call by name, and methods `test*` of classes named
  `Test*` (pytest's collection; not TestCases, not classes with an `__init__`) the tests never instantiate, are called
  after the tests, each once, in the order they are defined; each failure fails the tests. A function the tests call
  by name themselves (`test_f()` at the end, under `if __name__ == "__main__":`) is theirs to run: not called again,
  as a second run can fail where the first passed (a file the test creates) and doubles the time. One with required
  parameters wants pytest fixtures, which do not exist here: it fails the tests, saying so.
* `from solution import f` and `import solution` (KodCode's convention) are the candidate's module.

The candidate's own tests do not count: its TestCases' results and its `test*` functions (their module is
`__candidate__`) are not the tests'. A skip raised through the candidate's code (`raise unittest.SkipTest` in the
function under test) is an error, not a skip. Whatever the candidate raises out of a test ends the run or fails it;
SystemExit from it still ends the program before the proof.

What this does not stop: a candidate that tampers with the unittest machinery the tests share with it while they run
(replacing `TestResult.addFailure` from inside the function under test); see languages.py's threat model. The
unittest module the tests import is at least a fresh one, not one the candidate imported and changed beforehand.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from grpo.reward.verifiers.assert_guard import parse

FINISH_NAME = "__grpo_finish__"
CANDIDATE_MODULES = frozenset({"solution"})  # names under which the tests import the candidate's module

# Defined after the candidate has run and before the tests. `boundary`: the harness's first line; the candidate's
# code is every line of main.py above it (a traceback through those lines went through the candidate's code).
HARNESS = f'''
def {FINISH_NAME}_make(uses_unittest):
    import sys, types
    boundary = sys._getframe().f_code.co_firstlineno
    main = sys.modules["__main__"]
    for name in {sorted(CANDIDATE_MODULES)!r}:
        sys.modules[name] = main  # the candidate's module (it runs in __main__'s namespace, as `__candidate__`)
    results, ran, failures = [], set(), []

    def through_candidate(tb):
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == "main.py" and tb.tb_lineno < boundary:
                return True
            tb = tb.tb_next
        return False

    def theirs(test):
        case = getattr(test, "test_case", test)  # a subTest's case
        return getattr(type(case), "__module__", None) != "__candidate__"

    def failed(result):
        return [str(t) for t, _ in [*result.failures, *result.errors] if theirs(t)] + [
            str(t) for t in result.unexpectedSuccesses if theirs(t)]

    unittest = None
    if uses_unittest:
        # A fresh unittest: not one the candidate imported and changed before the tests ran.
        for name in [n for n in sys.modules if n == "unittest" or n.startswith("unittest.")]:
            del sys.modules[name]
        import unittest, unittest.case
        start_test, add_skip = unittest.TestResult.startTest, unittest.case._addSkip

        def startTest(self, test):
            if not any(r is self for r in results):
                results.append(self)
            ran.add(type(test))
            return start_test(self, test)

        def _addSkip(result, test_case, reason):
            error = sys.exc_info()
            if isinstance(error[1], unittest.SkipTest) and through_candidate(error[2]):
                return result.addError(test_case, error)  # the function under test skipped its own test
            return add_skip(result, test_case, reason)

        class TestProgram(unittest.TestProgram):
            """unittest.main: exits with 1 when a test failed, never on success (the proof comes after the tests)."""

            def runTests(self):
                leave, self.exit = self.exit, False
                super().runTests()
                self.exit = leave
                if leave and failed(self.result):
                    raise SystemExit(1)

        unittest.TestResult.startTest, unittest.case._addSkip = startTest, _addSkip
        unittest.main = unittest.TestProgram = TestProgram
        sys.modules["unittest.main"].main = sys.modules["unittest.main"].TestProgram = TestProgram

    def run(label, make):
        """Call the test `make()` gives (a function, a method of a fresh instance); a failure is recorded."""
        import inspect
        try:
            call = make()
            try:
                parameters = inspect.signature(call).parameters.items()
            except (TypeError, ValueError):
                parameters = ()
            required = [name for name, p in parameters
                        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            if required:
                print(f"pytest fixtures are not supported: {{label}}({{', '.join(required)}})", file=sys.stderr)
                failures.append(label)
                return
            outcome = call()
            if inspect.iscoroutine(outcome):
                import asyncio
                asyncio.run(outcome)
        except Exception as error:
            if unittest and isinstance(error, unittest.SkipTest) and not through_candidate(error.__traceback__):
                return
            import traceback
            print(f"{{label}} failed:", file=sys.stderr)
            traceback.print_exc()
            failures.append(label)

    def collected(called):
        """(line, label, make) of the pytest-style tests the tests define and do not run themselves, in order."""
        out, seen = [], set()
        for name, value in list(vars(main).items()):
            if name in called or getattr(value, "__module__", None) != "__main__":
                continue
            if name.startswith("test") and isinstance(value, types.FunctionType) and id(value) not in seen:
                seen.add(id(value))
                out.append((value.__code__.co_firstlineno, name, lambda value=value: value))
            elif (name.startswith("Test") and isinstance(value, type) and "__init__" not in vars(value)
                    and not (unittest and issubclass(value, unittest.TestCase))):
                for method in dir(value):
                    function = getattr(value, method, None)
                    if method.startswith("test") and isinstance(function, types.FunctionType):
                        out.append((function.__code__.co_firstlineno, f"{{name}}.{{method}}",
                                    lambda value=value, method=method: getattr(value(), method)))
        return sorted(out, key=lambda item: item[0])

    def finish(called):
        if unittest:
            for value in list(vars(main).values()):
                if (isinstance(value, type) and issubclass(value, unittest.TestCase)
                        and value.__module__ == "__main__" and value not in ran):
                    suite = unittest.TestLoader().loadTestsFromTestCase(value)
                    if suite.countTestCases():
                        unittest.TextTestRunner().run(suite)
        for _, label, make in collected(called):
            run(label, make)
        failures.extend(t for result in results for t in failed(result))
        if failures:
            raise AssertionError(f"{{len(failures)}} test(s) failed: {{', '.join(failures[:20])}}")

    return finish
'''


@dataclass(frozen=True)
class Forms:
    """What of unittest and pytest the tests use. `called`: the names the tests call themselves."""

    unittest: bool
    called: frozenset[str]


@functools.lru_cache(maxsize=64)  # the same tests for every candidate of a task
def forms(tests: str) -> Forms | None:
    """The forms the tests use, or None when they need no harness (plain asserts, HumanEval's `check(f)`) or do not
    parse (they fail as written)."""
    try:
        tree = parse(tests)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    uses_unittest = "unittest" in tests
    imports = any(
        (isinstance(node, ast.Import) and any(a.name.split(".")[0] in CANDIDATE_MODULES for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in CANDIDATE_MODULES)
        for node in ast.walk(tree)
    )
    defines = any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name.lower().startswith("test")
        for node in tree.body
    )
    if not (uses_unittest or imports or defines):
        return None
    called = frozenset(
        node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    )
    return Forms(uses_unittest, called)


def harnessed(tests: str, body: str) -> str:
    """`body` (the tests as they run, guarded) inside the harness its forms need; `body` itself when none."""
    found = forms(tests)
    if found is None:
        return body
    called = "{" + ", ".join(repr(name) for name in sorted(found.called)) + "}" if found.called else "()"
    return (
        f"{HARNESS}\n{FINISH_NAME} = {FINISH_NAME}_make({found.unittest})\ndel {FINISH_NAME}_make\n"
        f"{body}\n{FINISH_NAME}(frozenset({called}))"
    )
