"""Assert tests written for unittest or pytest, judged through the real sandbox as those tools judge them
(grpo/reward/verifiers/frameworks.py): a right answer passes, a wrong one fails, and the candidate gets no new way
to pass."""

from __future__ import annotations

import types
from typing import Any

import pytest

from grpo.reward.sandbox import Sandbox
from grpo.reward.verifiers.code import CodeTestResult, program_for, run_code_tests
from grpo.reward.verifiers.frameworks import forms
from grpo.reward.verifiers.pytest_standin import SOURCE

RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
CASE = "import unittest\n\nclass T(unittest.TestCase):\n    def test_a(self):\n        self.assertEqual(add(1, 2), 3)\n"
MAIN_GUARDED = CASE + "\nif __name__ == '__main__':\n    unittest.main()\n"
PYTEST = "def test_add():\n    assert add(1, 2) == 3\n"

FORMS = {
    "unittest.main()": CASE + "unittest.main()",
    "unittest.main() under the main guard": MAIN_GUARDED,
    "unittest.main(argv, verbosity)": CASE + "unittest.main(argv=['first-arg-is-ignored'], verbosity=2)",
    "unittest.main(exit=False)": CASE + "unittest.main(exit=False)",
    "from unittest import main": CASE + "from unittest import main\nmain(verbosity=0)",
    "unittest.main() in try/except SystemExit": CASE + "try:\n    unittest.main()\nexcept SystemExit:\n    pass",
    "an unchecked runner": CASE + "unittest.TextTestRunner().run(unittest.defaultTestLoader.loadTestsFromTestCase(T))",
    "a TestCase never run": CASE,
    "an IsolatedAsyncioTestCase": CASE.replace("TestCase)", "IsolatedAsyncioTestCase)").replace("def", "async def")
    + "unittest.main()",
    "subTest": "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
    "        for a in (1, 2):\n            with self.subTest(a=a):\n                self.assertEqual(add(a, 2), a + 2)\n"
    "unittest.main()",
    "a pytest function never called": PYTEST,
    "a pytest function the tests call": PYTEST + "test_add()",
    "a pytest function called under the main guard": PYTEST + "if __name__ == '__main__':\n    test_add()",
    "an async pytest function": "async " + PYTEST,
    "a pytest class": "class TestAdd:\n    def test_add(self):\n        assert add(1, 2) == 3\n",
    "KodCode: from solution import": "from solution import add\n\n" + PYTEST,
    "import solution": "import solution\n\ndef test_add():\n    assert solution.add(1, 2) == 3\n",
}


def _run(sandbox: Sandbox, code: str, tests: str) -> CodeTestResult:
    [result] = run_code_tests(sandbox, code, [{"assert": tests}], timeout_s=10.0)
    return result


@pytest.mark.parametrize("tests", FORMS.values(), ids=FORMS.keys())
def test_each_form_passes_the_right_answer_and_fails_the_wrong_one(sandbox: Sandbox, tests: str) -> None:
    """Before: unittest.main() failed every answer; exit=False, unchecked runners, unrun TestCases and uncalled pytest
    functions passed every answer; `from solution import` failed every answer."""
    right, wrong = _run(sandbox, RIGHT, tests), _run(sandbox, WRONG, tests)
    assert right.verdict == "pass", right.stderr[-2000:]
    assert wrong.verdict == "runtime_error", wrong.stderr[-2000:]


def test_every_uncalled_test_runs_and_each_failure_is_named(sandbox: Sandbox) -> None:
    tests = PYTEST + "def test_sub():\n    assert add(2, -1) == 1\ndef test_zero():\n    assert add(0, 0) == 0\n"
    assert _run(sandbox, RIGHT, tests).verdict == "pass"
    wrong = _run(sandbox, WRONG, tests)
    assert wrong.verdict == "runtime_error"
    assert "AssertionError: 2 test(s) failed: test_add, test_sub" in wrong.stderr


def test_a_test_the_tests_call_runs_once(sandbox: Sandbox) -> None:
    """A test the tests call themselves is not called again (a second run could fail where the first passed)."""
    tests = "import os\ndef test_once():\n    os.mkdir('made')\n    assert add(1, 2) == 3\ntest_once()\n"
    assert _run(sandbox, RIGHT, tests).verdict == "pass"


def test_a_test_with_fixtures_fails_saying_so(sandbox: Sandbox) -> None:
    result = _run(sandbox, RIGHT, "def test_add(tmp_path, capsys):\n    assert add(1, 2) == 3\n")
    assert result.verdict == "runtime_error"
    assert "pytest fixtures are not supported: test_add(tmp_path, capsys)" in result.stderr


def test_a_skip_in_the_tests_is_a_skip(sandbox: Sandbox) -> None:
    tests = CASE + "    @unittest.skip('later')\n    def test_b(self):\n        self.assertEqual(add(1, 2), 4)\n"
    tests += "def test_skipped():\n    raise unittest.SkipTest('not here')\nunittest.main()"
    assert _run(sandbox, RIGHT, tests).verdict == "pass"


ALWAYS_EQUAL = (
    "class E:\n    def __eq__(s, o): return True\n    def __ne__(s, o): return False\ndef add(a, b): return E()\n"
)


@pytest.mark.parametrize(
    ("code", "tests"),
    [
        # The candidate exits or skips from inside the function under test.
        ("def add(a, b):\n    raise SystemExit(0)\n", MAIN_GUARDED),
        ("import sys\ndef add(a, b):\n    sys.exit(0)\n", PYTEST),
        ("import os\ndef add(a, b):\n    os._exit(0)\n", CASE + "unittest.main(exit=False)"),
        ("import unittest\ndef add(a, b):\n    raise unittest.SkipTest('no')\n", MAIN_GUARDED),
        ("import unittest\ndef add(a, b):\n    raise unittest.SkipTest('no')\n", "import unittest\n" + PYTEST),
        ("import unittest\ndef add(a, b):\n    unittest.main()\n    return 0\n", MAIN_GUARDED),
        # The candidate calls unittest.main() itself, or changes unittest before the tests import it.
        ("import unittest\nunittest.main()\n" + RIGHT, MAIN_GUARDED),
        (
            "import unittest\nunittest.TestResult.addFailure = lambda *a: None\n"
            "unittest.TestResult.wasSuccessful = lambda s: True\n" + WRONG,
            MAIN_GUARDED,
        ),
        # The candidate's own passing tests are not the tests'.
        (WRONG + "def test_add():\n    assert True\n", "from solution import add\n" + PYTEST),
        (WRONG + "import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n        pass\n", MAIN_GUARDED),
        # An object built to equal anything, in the tests the harness runs.
        (ALWAYS_EQUAL, MAIN_GUARDED),
        (ALWAYS_EQUAL, PYTEST),
        (ALWAYS_EQUAL, "class TestAdd:\n    def test_add(self):\n        assert add(1, 2) == 3\n"),
    ],
)
def test_the_candidate_gets_no_new_way_to_pass(sandbox: Sandbox, code: str, tests: str) -> None:
    result = _run(sandbox, code, tests)
    assert result.verdict in ("fail", "runtime_error"), result.stderr[-2000:]


def test_the_candidates_own_failing_tests_do_not_fail_a_right_answer(sandbox: Sandbox) -> None:
    """Its examples (a TestCase, test functions) may be wrong: the tests' verdict is on the tests' own cases."""
    code = RIGHT + (
        "import unittest\nclass Mine(unittest.TestCase):\n    def test_m(self):\n        self.assertEqual(add(1, 1), 3)\n"
        "def test_mine():\n    assert add(1, 1) == 3\n"
    )
    assert _run(sandbox, code, MAIN_GUARDED).verdict == "pass"
    assert _run(sandbox, code, "from solution import add\n" + PYTEST).verdict == "pass"


def test_tests_without_these_forms_run_as_written() -> None:
    """HumanEval's `check(candidate)` and plain asserts need no harness: their program is unchanged."""
    for tests in ("def check(candidate):\n    assert candidate(1, 2) == 3\n\ncheck(add)", "assert add(1, 2) == 3"):
        assert forms(tests) is None
        assert "__grpo_finish__" not in program_for(RIGHT, {"assert": tests})[0]
    assert forms("assert (") is None  # does not parse: fails as written
    found = forms(PYTEST + "def test_sub():\n    pass\ntest_sub()")
    assert found is not None and "test_sub" in found.called and "test_add" not in found.called


# `import pytest` (KodCode's test files): the harness gives the tests a stand-in (verifiers/pytest_standin.py).
DIV = "def div(a, b):\n    if b == 0:\n        raise ValueError('division by zero')\n    return a / b\n"
WRONG_DIV = "def div(a, b):\n    return a // b if b else 0\n"
USES = "import pytest\nfrom solution import div\n\n"
KODCODE = """import pytest
from solution import div


@pytest.fixture
def numbers():
    return [(6, 3, 2.0), (1, 3, 0.333333333)]


@pytest.fixture
def pairs(numbers):
    yield [(a, b) for a, b, _ in numbers]


def test_numbers(numbers):
    for a, b, q in numbers:
        assert div(a, b) == pytest.approx(q)


def test_pairs(pairs):
    assert [div(a, b) for a, b in pairs] == pytest.approx([2, 1 / 3])


@pytest.mark.parametrize("a, b, expected", [(4, 2, 2), (9, 3, 3), pytest.param(1, 8, 0.125, id="eighth")])
def test_div(a, b, expected):
    assert div(a, b) == expected


@pytest.mark.parametrize("b", [0])
def test_zero(b):
    with pytest.raises(ValueError, match=r"by zero") as info:
        div(1, b)
    assert "zero" in str(info.value) and info.type is ValueError


class TestDiv:
    @pytest.mark.parametrize(["a", "b"], [(1, 2), (3, 4)])
    def test_close(self, a, b, numbers):
        assert {"q": div(a, b)} == pytest.approx({"q": a / b})


if __name__ == "__main__":
    pytest.main([__file__])
"""
PYTEST_FORMS = {
    "raises": USES + "def test_zero():\n    with pytest.raises(ValueError):\n        div(1, 0)\n",
    "raises match": USES
    + "def test_zero():\n    with pytest.raises(ValueError, match='by zero$'):\n        div(1, 0)\n",
    "raises a tuple": USES + "def test_zero():\n    with pytest.raises((TypeError, ValueError)):\n        div(1, 0)\n",
    "raises, called": USES + "def test_zero():\n    pytest.raises(ValueError, div, 1, 0)\n",
    "from pytest import": "from pytest import raises, approx\n\ndef test_zero():\n    with raises(ValueError):\n"
    "        div(1, 0)\n    assert div(1, 3) == approx(0.3333333)\n",
    "approx": USES + "def test_third():\n    assert div(1, 3) == pytest.approx(0.3333333)\n",
    "approx, reflected and !=": USES + "def test_third():\n    assert pytest.approx(0.3333333) == div(1, 3)\n"
    "    assert div(1, 3) != pytest.approx(0.34)\n",
    "approx of a list, tuple, dict": USES
    + "def test_third():\n    assert [div(1, 3), div(1, 2)] == pytest.approx([1 / 3, 0.5])\n"
    "    assert (div(2, 3),) == pytest.approx((0.6666667,), rel=1e-6)\n"
    "    assert {'a': div(1, 4)} == pytest.approx({'a': 0.25}, abs=1e-9)\n",
    "approx in plain asserts": "import pytest\nassert div(1, 3) == pytest.approx(1 / 3)\n",
    "parametrize": USES + "@pytest.mark.parametrize('a,b,q', [(6, 3, 2), (1, 4, 0.25)])\n"
    "def test_q(a, b, q):\n    assert div(a, b) == q\n",
    "parametrize, names as a list, ids": USES
    + "@pytest.mark.parametrize(['a', 'b'], [(1, 4), (3, 4)], ids=['x', 'y'])\n"
    "def test_q(a, b):\n    assert div(a, b) * 4 == a\n",
    "stacked parametrize": USES + "@pytest.mark.parametrize('a', [1, 3])\n@pytest.mark.parametrize('b', [2, 4])\n"
    "def test_q(a, b):\n    assert div(a, b) * b == pytest.approx(a)\n",
    "a parametrized method": USES + "class TestQ:\n    @pytest.mark.parametrize('b', [2, 4])\n"
    "    def test_q(self, b):\n        assert div(1, b) == 1 / b\n",
    "skip, skipif, xfail": USES + "@pytest.mark.skip(reason='no')\ndef test_s():\n    assert False\n"
    "@pytest.mark.skipif(True, reason='no')\ndef test_si():\n    assert False\n"
    "@pytest.mark.xfail\ndef test_x():\n    assert div(1, 0) == 0\ndef test_real():\n    assert div(1, 2) == 0.5\n",
    "pytest.skip() and an unknown mark": USES + "@pytest.mark.slow\ndef test_s():\n    pytest.skip('later')\n"
    "    assert False\n@pytest.mark.slow\ndef test_real():\n    assert div(1, 2) == 0.5\n",
    "fixture": USES
    + "@pytest.fixture\ndef pair():\n    return (1, 2)\ndef test_f(pair):\n    assert div(*pair) == 0.5\n",
    "fixture(scope=...) on a fixture": USES + "@pytest.fixture(scope='module')\ndef one():\n    return 1\n"
    "@pytest.fixture()\ndef pair(one):\n    return (one, 2)\ndef test_f(pair):\n    assert div(*pair) == 0.5\n",
    "yield fixture": USES
    + "@pytest.fixture\ndef pair():\n    yield (1, 2)\ndef test_f(pair):\n    assert div(*pair) == 0.5\n",
    "capsys": USES + "def test_p(capsys):\n    print(div(1, 2))\n    assert capsys.readouterr().out == '0.5\\n'\n",
    "setup_method": USES + "class TestQ:\n    def setup_method(self, method):\n        self.b = 4\n"
    "    def test_q(self):\n        assert div(1, self.b) == 0.25\n",
    "KodCode: a whole file": KODCODE,
}


@pytest.mark.parametrize("tests", PYTEST_FORMS.values(), ids=PYTEST_FORMS.keys())
def test_each_pytest_form_passes_the_right_answer_and_fails_the_wrong_one(sandbox: Sandbox, tests: str) -> None:
    """Before: `import pytest` failed in the sandbox (no pytest there), every answer, right or wrong."""
    right, wrong = _run(sandbox, DIV, tests), _run(sandbox, WRONG_DIV, tests)
    assert right.verdict == "pass", right.stderr[-2000:]
    assert wrong.verdict == "runtime_error", wrong.stderr[-2000:]


def test_a_failing_parametrized_case_is_named(sandbox: Sandbox) -> None:
    tests = USES + "@pytest.mark.parametrize('a', [1, 3])\n@pytest.mark.parametrize('b', [2, 4])\n"
    tests += "def test_q(a, b):\n    assert div(a, b) == a / b\n"
    wrong = _run(sandbox, "def div(a, b):\n    return 0.5 if a == 1 else a / b\n", tests)
    assert "AssertionError: 1 test(s) failed: test_q[4-1]" in wrong.stderr, wrong.stderr[-2000:]


def test_xfail_skip_and_fixtures_as_pytest_runs_them(sandbox: Sandbox) -> None:
    """A strict xfail that passes fails; a failing xfail naming another exception fails; a teardown runs after its
    test, and one that fails fails the tests; a test wanting an unknown or parametrized fixture fails, saying so."""
    assert _run(sandbox, DIV, USES + "@pytest.mark.xfail(strict=True)\ndef test_x():\n    pass\n").verdict != "pass"
    raises = USES + "@pytest.mark.xfail(raises=KeyError)\ndef test_x():\n    div(1, 0)\n"
    assert _run(sandbox, DIV, raises).verdict == "runtime_error"
    assert _run(sandbox, DIV, raises.replace("KeyError", "ValueError")).verdict == "pass"
    log = USES + "log = []\n@pytest.fixture\ndef logged():\n    log.append('set')\n    yield\n    log.append('down')\n"
    log += "def test_a(logged):\n    assert log == ['set']\ndef test_b():\n    assert log == ['set', 'down']\n"
    assert _run(sandbox, DIV, log).verdict == "pass"
    down = (
        USES
        + "@pytest.fixture\ndef broken():\n    yield 1\n    raise OSError('teardown')\ndef test_a(broken):\n    pass\n"
    )
    result = _run(sandbox, DIV, down)
    assert result.verdict == "runtime_error" and "test_a failed in a fixture's teardown" in result.stderr
    printed = _run(sandbox, WRONG_DIV, PYTEST_FORMS["capsys"])  # the failure shows, after the capture ends
    assert "test_p failed:" in printed.stderr and "readouterr" in printed.stderr, printed.stderr[-2000:]
    unknown = USES + "@pytest.fixture(params=[1, 2])\ndef p(request):\n    return request.param\n"
    unknown += "def test_a(p, tmp_path):\n    pass\n"
    result = _run(sandbox, DIV, unknown)
    assert "pytest fixtures are not supported: test_a(p, tmp_path)" in result.stderr, result.stderr[-2000:]


SKIPS = "def div(a, b):\n    import pytest\n\n    pytest.{}('no')\n"
MAP_SKIP = "def div(a, b):\n    import pytest\n\n    return map(pytest.skip, ['no'])\n"
LYING_FLOAT = (
    "class F(float):\n    def __sub__(s, o): return F(0)\n    __rsub__ = __sub__\n    def __abs__(s): return 0.0\n"
    "def div(a, b): return F(99)\n"
)
LYING_LIST = (
    "class L(list):\n    def __len__(s): return 2\n    def __iter__(s): return iter([0.5, 2.0])\n"
    "    def __getitem__(s, i): return [0.5, 2.0][i]\ndef div(a, b): return L([9])\n"
)
OWN_PYTEST = (
    "import sys, types\nfake = types.ModuleType('pytest')\nclass R:\n    def __enter__(s): return s\n"
    "    def __exit__(s, *a): return True\nfake.raises = lambda *a, **k: R()\nfake.approx = lambda x, **k: x\n"
    "sys.modules['pytest'] = fake\n"
)


@pytest.mark.parametrize(
    ("code", "tests"),
    [
        # The candidate's own `pytest`, put in sys.modules before the tests, is not the one they get.
        (OWN_PYTEST + WRONG_DIV, PYTEST_FORMS["raises"]),
        # The candidate imports pytest itself: there is none while it runs (the stand-in is the tests').
        ("import pytest\n" + DIV, PYTEST_FORMS["raises"]),
        # It skips, xfails or passes its own test from inside the function under test.
        (SKIPS.format("skip"), PYTEST_FORMS["approx"]),
        (SKIPS.format("xfail"), PYTEST_FORMS["approx"]),
        (SKIPS.format("skip"), PYTEST_FORMS["parametrize"]),
        (MAP_SKIP, USES + "def test_l():\n    assert list(div(1, 2)) == [0.5]\n"),
        # It raises what the tests do not expect, or exits, inside `pytest.raises`.
        ("def div(a, b):\n    raise TypeError('no')\n", PYTEST_FORMS["raises"]),
        ("def div(a, b):\n    raise SystemExit(0)\n", PYTEST_FORMS["raises"]),
        ("def div(a, b):\n    raise ValueError('by zero!')\n", PYTEST_FORMS["raises match"]),
        # Values that would make `approx` lie, or equal anything.
        (ALWAYS_EQUAL.replace("add", "div"), PYTEST_FORMS["approx"]),
        (ALWAYS_EQUAL.replace("add", "div"), PYTEST_FORMS["approx, reflected and !="]),
        (ALWAYS_EQUAL.replace("add", "div"), PYTEST_FORMS["approx in plain asserts"]),
        (LYING_FLOAT, PYTEST_FORMS["approx"]),
        (LYING_LIST, USES + "def test_l():\n    assert div(1, 2) == pytest.approx([0.5, 2.0])\n"),
        # Its own tests and fixtures are not the tests'.
        (WRONG_DIV + "def test_div():\n    assert True\n", PYTEST_FORMS["fixture"]),
    ],
)
def test_the_candidate_gets_no_way_to_pass_through_the_pytest_standin(sandbox: Sandbox, code: str, tests: str) -> None:
    result = _run(sandbox, code, tests)
    assert result.verdict in ("fail", "runtime_error"), result.stderr[-2000:]


def test_the_standin_is_given_only_to_tests_that_import_pytest() -> None:
    assert "class _Skipped" not in program_for(RIGHT, {"assert": PYTEST})[0]
    assert "class _Skipped" in program_for(RIGHT, {"assert": "import pytest\n" + PYTEST})[0]
    found = forms("import pytest\nassert add(1, 2) == pytest.approx(3)")
    assert found is not None and found.pytest
    assert not (forms(PYTEST) or found).pytest


def _standin() -> Any:
    module = types.ModuleType("pytest")
    exec(compile(SOURCE, "<pytest>", "exec"), vars(module))
    return module


@pytest.mark.parametrize(
    ("actual", "expected", "kwargs", "equal"),
    [
        (0.1 + 0.2, 0.3, {}, True),
        (1.0 + 1e-7, 1.0, {}, True),  # rel 1e-6
        (1.0 + 1e-5, 1.0, {}, False),
        (1e-13, 0.0, {}, True),  # abs 1e-12
        (1e-11, 0.0, {}, False),
        (1.05, 1.0, {"rel": 0.1}, True),
        (1.05, 1.0, {"abs": 0.01}, False),  # abs alone: no relative tolerance
        (float("inf"), float("inf"), {}, True),
        (1e300, float("inf"), {}, False),
        (float("nan"), float("nan"), {}, False),
        (float("nan"), float("nan"), {"nan_ok": True}, True),
        (True, 1, {}, True),
        (1, True, {}, False),  # approx(True) is no number, as in pytest
        ([1.0, 2.0], (1.0, 2.0000001), {}, True),
        ([1.0], [1.0, 2.0], {}, False),
        ({"a": 1.0}, {"a": 1.0000001}, {}, True),
        ({"a": 1.0}, {"b": 1.0}, {}, False),
        ("x", "x", {}, True),
        (None, 1.0, {}, False),
    ],
)
def test_approx_as_pytest(actual: Any, expected: Any, kwargs: dict[str, Any], equal: bool) -> None:
    approx = _standin().approx(expected, **kwargs)
    assert (actual == approx) is equal and (approx == actual) is equal and (actual != approx) is not equal
