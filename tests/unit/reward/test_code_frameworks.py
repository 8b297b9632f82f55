"""Assert tests written for unittest or pytest, judged through the real sandbox as those tools judge them
(grpo/reward/verifiers/frameworks.py): a right answer passes, a wrong one fails, and the candidate gets no new way
to pass."""

from __future__ import annotations

import pytest

from grpo.reward.sandbox import Sandbox
from grpo.reward.verifiers.code import CodeTestResult, program_for, run_code_tests
from grpo.reward.verifiers.frameworks import forms

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
