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
  as a second run can fail where the first passed (a file the test creates) and doubles the time. A parameter that
  is neither parametrized nor a fixture the tests define (nor `capsys`) fails the test, saying "pytest fixtures are
  not supported: test_x(name)".
* `from solution import f` and `import solution` (KodCode's convention) are the candidate's module.
* Tests that import pytest (not installed in the sandbox) get a fresh stand-in (pytest_standin.py), registered after
  the candidate has run: `raises`, `approx`, `fail`, `skip`, `xfail`, `param`, `fixture`, `main` (nothing) and
  `mark.<name>`. Collected tests run as pytest runs them: each `parametrize` case (stacked ones: their cross product),
  named `test_x[1-2]` when it fails; `skip`, `skipif` and `xfail` marks (an xfail test that fails does not fail the
  tests; one with `strict=True` that passes does); fixtures by name, made afresh for each test (`scope` is ignored),
  a generator's teardown after it; `autouse` and `usefixtures`; a Test class's `setup_method`/`teardown_method`.

The candidate's own tests do not count: its TestCases' results and its `test*` functions (their module is
`__candidate__`) are not the tests'. A skip raised through the candidate's code (`raise unittest.SkipTest` or
`pytest.skip()` in the function under test) is an error, not a skip; so is a `pytest.skip`/`pytest.xfail` that the
tests' code did not call by name (`map(pytest.skip, ...)` returned for the tests to iterate). The candidate cannot
import pytest while it is defined (there is none then, as before); its own `pytest` in sys.modules is replaced.
Whatever the candidate raises out of a test ends the run or fails it; SystemExit from it still ends the program before
the proof.

What this does not stop: a candidate that tampers with the unittest machinery the tests share with it while they run
(replacing `TestResult.addFailure` from inside the function under test); see languages.py's threat model. The
unittest module the tests import is at least a fresh one, not one the candidate imported and changed beforehand.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from grpo.reward.verifiers.assert_guard import parse
from grpo.reward.verifiers.pytest_standin import SOURCE

FINISH_NAME = "__grpo_finish__"
CANDIDATE_MODULES = frozenset({"solution"})  # names under which the tests import the candidate's module

# Defined after the candidate has run and before the tests. `boundary`: the harness's first line; the candidate's
# code is every line of main.py above it (a traceback through those lines went through the candidate's code).
HARNESS = f'''
def {FINISH_NAME}_make(uses_unittest, uses_pytest, pytest_source):
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

    standin = None
    if uses_pytest:
        # A fresh stand-in (pytest_standin.py): not a `pytest` the candidate put in sys.modules beforehand.
        standin = types.ModuleType("pytest")
        exec(compile(pytest_source, "<pytest>", "exec"), vars(standin))
        sys.modules["pytest"] = standin
    outcomes = (standin._Skipped, standin._XFailed, standin._Failed) if standin else ()
    fixtures = {{}}

    def marks_of(*owners):
        return [m for owner in owners for m in (standin._marks(owner) if standin else ())]

    def holds(mark):
        """Whether a skipif or xfail mark's conditions hold (any of them; none: it holds)."""
        conditions = [*mark.args, *([mark.kwargs["condition"]] if "condition" in mark.kwargs else [])]
        if not conditions:
            return True
        import os, platform
        scope = {{"os": os, "sys": sys, "platform": platform, **vars(main)}}
        return any(eval(c, scope) if isinstance(c, str) else c for c in conditions)

    def required(call):
        import inspect
        try:
            parameters = inspect.signature(call).parameters.items()
        except (TypeError, ValueError):
            return []
        return [name for name, p in parameters
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def arguments(call, params, marks, teardown, missing):
        """The test's arguments: its parametrized values, else the fixtures of those names (each made once per test,
        a generator's teardown left in `teardown`); a name that is neither goes in `missing`."""
        import inspect
        made = {{}}

        def value_of(name, stack):
            if name in params:
                return params[name]
            if name in made:
                return made[name]
            found = fixtures.get(name) or (standin and standin._builtin.get(name))
            if found is None or found.params is not None or name in stack:
                missing.append(name)
                return None
            kwargs = {{n: value_of(n, stack | {{name}}) for n in required(found.function)}}
            if missing:
                return None
            if inspect.isgeneratorfunction(found.function):
                generator = found.function(**kwargs)
                teardown.append(generator)
                made[name] = next(generator)
            else:
                made[name] = found.function(**kwargs)
            return made[name]

        for name in [*(f.name for f in fixtures.values() if f.autouse),
                     *(n for m in marks if m.name == "usefixtures" for n in m.args)]:
            value_of(name, frozenset())
        out = {{name: value_of(name, frozenset()) for name in required(call)}}
        try:
            named = inspect.signature(call).parameters
        except (TypeError, ValueError):
            named = {{}}
        return {{**{{k: v for k, v in params.items() if k in named}}, **out}}

    def outcome(error, xfail):
        """'skip', 'xfail' or 'fail' for what a test raised; a skip or xfail raised through the candidate's code is a
        failure, as is any failure of an xfail test the mark's `raises` does not name."""
        if not through_candidate(error.__traceback__):
            if unittest and isinstance(error, unittest.SkipTest):
                return "skip"
            for kind, name in ((standin and standin._Skipped, "skip"), (standin and standin._XFailed, "xfail")):
                code = getattr(error, "_caller", None)
                if (kind and isinstance(error, kind) and isinstance(code, types.CodeType)
                        and code.co_filename == "main.py" and code.co_firstlineno > boundary and name in code.co_names):
                    return name
        if xfail is not None and isinstance(error, xfail.kwargs.get("raises") or BaseException):
            return "xfail"
        return "fail"

    def run(label, make, params=None, marks=()):
        """Call the test `make()` gives (a function, a method of a fresh instance, after its `setup_method`) with its
        parametrized values and fixtures, as its marks say (skip, skipif, xfail); a failure is recorded. What went
        wrong is printed after the fixtures' teardown (`capsys` holds stderr until then)."""
        import inspect, traceback
        if any(m.name == "skip" or (m.name == "skipif" and holds(m)) for m in marks):
            return
        xfail = next((m for m in marks if m.name == "xfail" and holds(m)), None)
        if xfail is not None and xfail.kwargs.get("run", True) is False:
            return
        teardown, missing, said = [], [], []
        try:
            call = make()
            values = arguments(call, params or {{}}, marks, teardown, missing)
            if missing:
                said.append(f"pytest fixtures are not supported: {{label}}({{', '.join(missing)}})\\n")
            else:
                try:
                    result = call(**values)
                    if inspect.iscoroutine(result):
                        import asyncio
                        asyncio.run(result)
                finally:
                    after = getattr(getattr(call, "__self__", None), "teardown_method", None)
                    if after is not None:
                        after(*([call] if required(after) else []))
                if xfail is not None and xfail.kwargs.get("strict") is True:
                    said.append(f"{{label}} passed, marked xfail(strict=True)\\n")
        except (Exception, *outcomes) as error:
            if outcome(error, xfail) == "fail":
                said.append(f"{{label}} failed:\\n{{traceback.format_exc()}}")
        finally:
            for generator in reversed(teardown):
                try:
                    next(generator)
                    raise RuntimeError("a fixture yielded twice")
                except StopIteration:
                    pass
                except (Exception, *outcomes):
                    said.append(f"{{label}} failed in a fixture's teardown:\\n{{traceback.format_exc()}}")
        if said:
            print("".join(said), end="", file=sys.stderr)
            failures.append(label)

    def instance(cls, method):
        """A fresh instance's test method, after the instance's `setup_method` (pytest's xunit-style setup)."""
        made = cls()
        call = getattr(made, method)
        before = getattr(made, "setup_method", None)
        if before is not None:
            before(*([call] if required(before) else []))
        return call

    def collected(called):
        """(line, label, make, marks) of the pytest-style tests the tests define and do not run themselves, in
        order."""
        out, seen = [], set()
        module = marks_of(main)  # `pytestmark = ...` at the tests' top level
        for name, value in list(vars(main).items()):
            if name in called or getattr(value, "__module__", None) != "__main__":
                continue
            if standin and standin._fixture_of(value):
                continue
            if name.startswith("test") and isinstance(value, types.FunctionType) and id(value) not in seen:
                seen.add(id(value))
                out.append((value.__code__.co_firstlineno, name, lambda value=value: value,
                            [*module, *marks_of(value)]))
            elif (name.startswith("Test") and isinstance(value, type) and "__init__" not in vars(value)
                    and not (unittest and issubclass(value, unittest.TestCase))):
                for method in dir(value):
                    function = getattr(value, method, None)
                    if (method.startswith("test") and isinstance(function, types.FunctionType)
                            and not (standin and standin._fixture_of(function))):
                        out.append((function.__code__.co_firstlineno, f"{{name}}.{{method}}",
                                    lambda value=value, method=method: instance(value, method),
                                    [*module, *marks_of(value, function)]))
        return sorted(out, key=lambda item: item[0])

    def finish(called):
        if unittest:
            for value in list(vars(main).values()):
                if (isinstance(value, type) and issubclass(value, unittest.TestCase)
                        and value.__module__ == "__main__" and value not in ran):
                    suite = unittest.TestLoader().loadTestsFromTestCase(value)
                    if suite.countTestCases():
                        unittest.TextTestRunner().run(suite)
        if standin:
            for value in list(vars(main).values()):
                found = standin._fixture_of(value)
                if found and getattr(value, "__module__", None) == "__main__":
                    fixtures[found.name] = found
        for _, label, make, marks in collected(called):
            cases = standin._parametrized(marks) if standin else [("", {{}}, [])]
            for case, params, more in cases:
                run(f"{{label}}[{{case}}]" if case else label, make, params, [*marks, *more])
        failures.extend(t for result in results for t in failed(result))
        if failures:
            raise AssertionError(f"{{len(failures)}} test(s) failed: {{', '.join(failures[:20])}}")

    return finish
'''


@dataclass(frozen=True)
class Forms:
    """What of unittest and pytest the tests use. `pytest`: they import it (they get the stand-in); `called`: the names
    the tests call themselves."""

    unittest: bool
    called: frozenset[str]
    pytest: bool = False


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
    uses_pytest = any(
        (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "pytest" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pytest")
        for node in ast.walk(tree)
    )
    if not (uses_unittest or imports or defines or uses_pytest):
        return None
    called = frozenset(
        node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    )
    return Forms(uses_unittest, called, uses_pytest)


def harnessed(tests: str, body: str) -> str:
    """`body` (the tests as they run, guarded) inside the harness its forms need; `body` itself when none."""
    found = forms(tests)
    if found is None:
        return body
    pytest_source = SOURCE if found.pytest else ""
    called = "{" + ", ".join(repr(name) for name in sorted(found.called)) + "}" if found.called else "()"
    return (
        f"{HARNESS}\n{FINISH_NAME} = {FINISH_NAME}_make({found.unittest}, {found.pytest}, {pytest_source!r})\ndel {FINISH_NAME}_make\n"
        f"{body}\n{FINISH_NAME}(frozenset({called}))"
    )
