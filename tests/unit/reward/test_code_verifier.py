"""The code verifier: extraction, stdout comparison and verdicts (table-driven), then real sandboxed test runs."""

from __future__ import annotations

import re

import pytest

from grpo.reward.sandbox import ExecResult, Sandbox
from grpo.reward.verifiers.assert_guard import GUARD, LINES_NAME, guarded
from grpo.reward.verifiers.code import (
    CANDIDATE_NAME,
    Judge,
    extract_code,
    first_difference,
    program_for,
    run_code_tests,
    stdout_matches,
    validate_tests,
    verdict_for,
)


@pytest.mark.parametrize(
    ("completion", "language", "expected"),
    [
        ("print(1)", "python", "print(1)"),
        ("Answer:\n```python\nprint(1)\n```\n", "python", "print(1)\n"),
        ("```py\na = 1\n```\nthen\n```python\nb = 2\n```", "python", "b = 2\n"),
        (
            "```python\na = 1\n```\n```\nplain\n```",
            "python",
            "a = 1\n",
        ),  # the tagged block wins over a later untagged one
        ("```\nx = 3\n```", "python", "x = 3\n"),
        ("```cpp\nint main(){}\n```", "python", "int main(){}\n"),  # no python block: the last block
        ("text\n```python\nunterminated = True\n", "python", "unterminated = True\n"),
        ("```Python3\nz = 1\n```", "python", "z = 1\n"),
        ("```python title=sol.py\nw = 1\n```", "python", "w = 1\n"),
        ("", "python", ""),
        # A fence inside a list item is indented: its indentation is not the code's (an IndentationError before).
        (
            "1. Solution:\n   ```python\n   def f():\n       return 1\n\n   ```\n",
            "python",
            "def f():\n    return 1\n\n",
        ),
        ("- x\n\t```python\n\tif a:\n\t  b()\n\t```", "python", "if a:\n  b()\n"),
        ("  ```python\nx = 1\n    y = 2\n  ```", "python", "x = 1\n  y = 2\n"),  # at most the fence's own
    ],
)
def test_extract_code(completion: str, language: str, expected: str) -> None:
    assert extract_code(completion, language) == expected


@pytest.mark.parametrize(
    ("actual", "expected", "match"),
    [
        ("1\n2\n", "1\n2\n", True),
        ("1  \n2\t\n", "1\n2", True),
        ("1\n2\n\n\n", "1\n2", True),
        ("1\r\n2\r\n", "1\n2\n", True),
        ("", "", True),
        ("\n", "", True),
        ("1\n2\n", "1\n2\n3\n", False),
        ("1 2\n", "1\n2\n", False),
        ("1\n\n2\n", "1\n2\n", False),  # an inner blank line counts
        (" 1\n", "1\n", False),  # leading whitespace counts
        ("1.0\n", "1\n", False),
    ],
)
def test_stdout_matches(actual: str, expected: str, match: bool) -> None:
    assert stdout_matches(actual, expected) is match


STDIO = {"stdin": "", "expected_stdout": "42\n"}
ASSERT = {"assert": "assert f() == 1"}


@pytest.mark.parametrize(
    ("compare", "actual", "expected", "match"),
    [
        ("exact", "1 2\n", "1 2\n", True),
        ("exact", "1 2\n", "1 2", False),
        ("lines", "1 2  \n\n", "1 2", True),
        ("lines", "1  2\n", "1 2\n", False),
        ("tokens", "1  2\n3", "1 2 3", True),
        ("tokens", "1 2", "1 2 3", False),
        ("case_insensitive", "YES\nno", "yes NO", True),
        ("case_insensitive", "YES", "yess", False),
        ("float", "0.3333333 2", "0.33333333 2", True),  # within 1e-6
        ("float", "0.333 2", "0.3333333 2", False),
        ("float", "1e9", "1000000500", True),  # relative: 5e-7 of 1e9
        ("float", "nan", "nan", True),  # the same token
        ("float", "inf", "1e308", False),
        ("float", "abc 1.0", "abc 1", True),
        ("float", "abd 1.0", "abc 1", False),
        # Exactly at the tolerance in decimal: within it, though the binary floats differ by a hair more.
        ("float", "0.000015", "0.000014", True),
        ("float", "0.300001", "0.3", True),
        ("float", "0.000016", "0.000014", False),
        ("float", "0.3000011", "0.3", False),
        ("float", "-nan", "nan", True),  # glibc's printf of 0.0 / 0.0; any NaN is the expected NaN (testlib)
        ("float", "Infinity", "inf", True),  # node's spelling
        ("float", "-inf", "inf", False),
        ("float", "nan", "1", False),
    ],
)
def test_compare_modes(compare: str, actual: str, expected: str, match: bool) -> None:
    assert stdout_matches(actual, expected, Judge(compare)) is match


LONG = "a" * 300


@pytest.mark.parametrize(
    ("compare", "actual", "expected", "where"),
    [
        ("lines", "1\n2\n4\n", "1\n2\n3\n", "line 3: expected '3', got '4'"),
        ("lines", "1\n", "1\n2", "line 2: expected '2', got the end of the output"),
        ("lines", "1\n2  \n5\n", "1\n2", "line 3: expected the end of the output, got '5'"),
        ("lines", "", "7", "line 1: expected '7', got the end of the output"),
        ("exact", "3\n", "3", "line 1: expected '3', got '3\\n'"),
        ("exact", "1\n2 \n", "1\n2\n", "line 2: expected '2\\n', got '2 \\n'"),
        ("exact", "1\r\n", "1\n", "line 1: expected '1\\n', got '1\\r\\n'"),
        ("tokens", "1 2\n4", "1 2 3", "token 3: expected '3', got '4'"),
        ("tokens", "1 2", "1 2 3", "token 3: expected '3', got the end of the output"),
        ("tokens", "1 2 3 4", "1 2 3", "token 4: expected the end of the output, got '4'"),
        ("case_insensitive", "YES no", "yes yes", "token 2: expected 'yes', got 'no' (ignoring case)"),
        (
            "float",
            "1 0.333",
            "1 0.3333333",
            "token 2: expected '0.3333333', got '0.333': they differ by 0.0003333, more than "
            "max(abs_tol 1e-06, rel_tol 1e-06 × 0.3333333)",
        ),
        ("float", "abd", "abc", "token 1: expected 'abc', got 'abd'"),
        ("float", "inf", "1e308", "token 1: expected '1e308', got 'inf'"),
        # A long line shows 100 characters around where it differs, with its column.
        (
            "lines",
            LONG + "b",
            LONG + "c",
            f"line 1, column 301: expected …'{'a' * 50}c', got …'{'a' * 50}b'",
        ),
        (
            "lines",
            "x" + LONG,
            "y" + LONG,
            f"line 1, column 1: expected '{'y' + 'a' * 99}'…, got '{'x' + 'a' * 99}'…",
        ),
        ("tokens", "1 " + LONG, "1 b", "token 2: expected 'b', got '" + "a" * 100 + "'…"),
    ],
)
def test_first_difference(compare: str, actual: str, expected: str, where: str) -> None:
    judge = Judge(compare, abs_tol=1e-6, rel_tol=1e-6)
    assert not stdout_matches(actual, expected, judge)
    assert first_difference(actual, expected, judge) == where


def test_first_difference_of_equal_outputs_is_empty_and_bytes_show_escaped() -> None:
    assert first_difference("1\n2\n", "1\n2", Judge()) == ""
    # Output that is not UTF-8 reaches the judge with its bytes as lone surrogates: shown escaped, never raw.
    shown = first_difference(b"\xff".decode("utf-8", "surrogateescape"), "x", Judge())
    assert shown == "line 1: expected 'x', got '\\udcff'" and shown.encode()


def test_a_failed_comparison_says_where_in_the_verdict() -> None:
    result = ExecResult("ok", 0, "41\n", "", 0.1)
    assert verdict_for(result, STDIO) == (
        "fail",
        "stdout does not match the expected output (lines): line 1: expected '42', got '41'",
    )


def test_unknown_compare_mode_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown compare mode 'fuzzy'"):
        stdout_matches("1", "1", Judge("fuzzy"))


@pytest.mark.parametrize(
    ("result", "test", "verdict"),
    [
        (ExecResult("ok", 0, "42\n", "", 0.1, proof=True), STDIO, "pass"),
        (ExecResult("ok", 0, "42\n", "", 0.1, proof=False), STDIO, "pass"),  # stdio programs may sys.exit(0)
        (ExecResult("ok", 0, "41\n", "", 0.1, proof=True), STDIO, "fail"),
        (ExecResult("ok", 0, "", "", 0.1, proof=True), ASSERT, "pass"),
        (ExecResult("ok", 0, "", "", 0.1, proof=False), ASSERT, "fail"),  # exit(0) before the asserts
        (ExecResult("runtime_error", 1, "42\n", "AssertionError", 0.1), STDIO, "runtime_error"),
        (ExecResult("runtime_error", 1, "", "AssertionError", 0.1), ASSERT, "runtime_error"),
        (ExecResult("timeout", None, "42\n", "", 10.0), STDIO, "timeout"),
        (ExecResult("memory_limit", 1, "", "MemoryError", 0.1), ASSERT, "memory_limit"),
        (ExecResult("output_limit", None, "x", "", 0.1), STDIO, "output_limit"),
        (ExecResult("sandbox_error", None, "", "zygote died", 0.0, proof=True), ASSERT, "sandbox_error"),
    ],
)
def test_verdict_for(result: ExecResult, test: dict[str, str], verdict: str) -> None:
    assert verdict_for(result, test)[0] == verdict


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ([{"stdin": "1"}], r"tests\[0\] needs"),
        ([{"assert": "ok"}, {"expected_stdout": 3}], r"tests\[1\] needs"),
        ([{"assert": 5}], r"tests\[0\].assert must be a string"),
        (["print(1)"], r"tests\[0\] must be an object"),
    ],
)
def test_validate_tests_names_the_bad_test(tests: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_tests(tests)  # type: ignore[arg-type]


def test_program_for_appends_the_assert_program() -> None:
    assert program_for("def f(): return 1", {"assert": "assert f() == 1"}) == (
        f"__name__ = {CANDIDATE_NAME!r}; __import__('sys').modules[__name__] = __import__('sys').modules['__main__']"
        f"\ndef f(): return 1\n__name__ = '__main__'\n{LINES_NAME} = 2\n" + guarded("assert f() == 1") + "\n",
        "",
    )
    assert program_for("print(input())", {"stdin": "7\n", "expected_stdout": "7"}) == ("print(input())", "7\n")


@pytest.mark.parametrize(
    "candidate",
    [
        '"""Adds."""\nfrom __future__ import annotations\nfrom __future__ import division\ndef f(x: int) -> int:\n    return x',
        "from __future__ import (\n    annotations,\n)  # note\ndef f(x): return x",
        "from __future__ import annotations; import sys\ndef f(x): return x",
        "@staticmethod\ndef g(): pass\ndef f(x): return x",
        "def f(x):\r\n    return x\r\n",
    ],
)
def test_the_candidate_of_an_assert_program_is_not_main_and_still_compiles(candidate: str) -> None:
    """Its `__name__` is set after its `from __future__` imports, which must come first."""
    program, _ = program_for(candidate, {"assert": "assert __name__ == '__main__' and f(1) == 1"})
    scope: dict[str, object] = {"__name__": "__main__"}
    exec(compile(program, "main.py", "exec"), scope)
    assert scope["__name__"] == "__main__"
    assert f"__name__ = {CANDIDATE_NAME!r}" in program


@pytest.mark.parametrize(
    "candidate",
    [
        "def f(:\n",
        "from __future__ import annotations\rdef f(): pass\n",
        "x = " + "-" * 100_000 + "1\n",  # MemoryError in ast.parse
        "x = " + "1+" * 100_000 + "1\n",  # RecursionError in ast.parse
    ],
)
def test_a_candidate_that_does_not_parse_or_ends_lines_in_cr_is_run_as_it_is(candidate: str) -> None:
    lines = len(re.findall(r"\r\n|\r|\n", candidate)) + 1  # as Python counts them: a lone \r ends a line
    assert (
        program_for(candidate, {"assert": "f()"})[0]
        == f"{candidate}\n__name__ = '__main__'\n{LINES_NAME} = {lines}\nf()\n"
    )


def _verdicts(sandbox: Sandbox, code: str, tests: list[dict[str, str]], **kw: float) -> list[str]:
    return [r.verdict for r in run_code_tests(sandbox, code, tests, timeout_s=kw.get("timeout_s", 5.0))]


def test_stdio_tests_in_order(sandbox: Sandbox) -> None:
    code = "a, b = map(int, input().split())\nprint(a + b)"
    tests = [
        {"stdin": "1 2\n", "expected_stdout": "3\n"},
        {"stdin": "5 5\n", "expected_stdout": "11"},
        {"stdin": "x\n", "expected_stdout": "0"},
        {"stdin": "2 2\n", "expected_stdout": "4  \n\n"},
    ]
    assert _verdicts(sandbox, code, tests) == ["pass", "fail", "runtime_error", "pass"]


def test_assert_tests(sandbox: Sandbox) -> None:
    code = "def add(a, b):\n    return a + b\n"
    check = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
    tests = [{"assert": check + "check(add)"}, {"assert": "assert add(2, 2) == 5"}]
    assert _verdicts(sandbox, code, tests) == ["pass", "runtime_error"]


@pytest.mark.parametrize(
    "main",
    [
        "print(add(*map(int, input().split())))",  # reads stdin, which an assert test does not give: EOFError
        "import unittest\n    unittest.main()",  # exits
        "import sys\n    sys.exit(1)",
    ],
)
def test_the_candidates_main_block_does_not_run_in_assert_tests(sandbox: Sandbox, main: str) -> None:
    """As in HumanEval's harness (and LiveCodeBench's, evalplus'), an assert test calls the candidate's functions:
    its `if __name__ == "__main__":` demo is not run. The tests run as `__main__`, so their own guard still runs."""
    code = f"def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    {main}\n"
    tests = [{"assert": "assert add(2, 3) == 5"}, {"assert": "if __name__ == '__main__':\n    assert add(2, 2) == 5"}]
    assert _verdicts(sandbox, code, tests) == ["pass", "runtime_error"]


def test_a_candidate_that_is_not_main_still_defines_dataclasses_and_pickles(sandbox: Sandbox) -> None:
    """dataclasses (with string annotations) and pickle look a class's module up by its name, `__candidate__`."""
    code = (
        "from __future__ import annotations\nimport dataclasses, pickle\n\n@dataclasses.dataclass\nclass P:\n"
        "    x: int\n\ndef roundtrip(x):\n    return pickle.loads(pickle.dumps(P(x))).x\n"
    )
    tests = [{"assert": "assert roundtrip(3) == 3"}, {"assert": "assert roundtrip(3) == 4"}]
    assert _verdicts(sandbox, code, tests) == ["pass", "runtime_error"]


def test_a_program_runs_as_the_main_module(sandbox: Sandbox) -> None:
    """As under `python main.py`: its classes pickle (looked up in `sys.modules['__main__']`), `import __main__` is
    the program itself."""
    code = (
        "import __main__, pickle\nclass P:\n    pass\nn = int(input())\nprint(len(pickle.dumps(P())) > 0, __main__.n)"
    )
    assert _verdicts(sandbox, code, [{"stdin": "7\n", "expected_stdout": "True 7"}]) == ["pass"]


@pytest.mark.parametrize(
    "escape",
    [
        "import sys\nsys.exit(0)",
        "import os\nos._exit(0)",
        "raise SystemExit(0)",
        "import os, threading, time\nthreading.Thread(target=os._exit, args=(0,)).start()\ntime.sleep(1)",
        "import atexit, os\natexit.register(os._exit, 0)\nraise SystemExit",
    ],
)
def test_exit_before_the_asserts_never_passes(sandbox: Sandbox, escape: str) -> None:
    code = f"def add(a, b):\n    return a - b\n{escape}\n"
    [result] = run_code_tests(sandbox, code, [{"assert": "assert add(1, 2) == 3"}], timeout_s=5.0)
    assert result.verdict == "fail" and "proof" in result.detail


def test_timeout_and_memory_verdicts(sandbox: Sandbox) -> None:
    tests = [{"assert": "while True: pass"}, {"assert": "x = bytearray(1 << 31)"}]
    results = run_code_tests(sandbox, "", tests, timeout_s=1.0, memory_mb=128)
    assert [r.verdict for r in results] == ["timeout", "memory_limit"]


def test_unsupported_language_is_a_value_error(sandbox: Sandbox) -> None:
    with pytest.raises(ValueError, match="language 'cobol' is not available here"):
        run_code_tests(sandbox, "fn main(){}", [STDIO], language="cobol")


def test_stop_on_first_failure_skips_the_rest(sandbox: Sandbox) -> None:
    tests = [{"stdin": str(k), "expected_stdout": str(2 * k if k != 3 else -1)} for k in range(8)]
    code = "print(int(input()) * 2)"
    every = run_code_tests(sandbox, code, tests, timeout_s=5.0)
    assert [r.verdict for r in every] == ["pass"] * 3 + ["fail"] + ["pass"] * 4
    stopped = run_code_tests(sandbox, code, tests, timeout_s=5.0, judge=Judge(stop_on_first_failure=True))
    assert [r.verdict for r in stopped] == ["pass"] * 3 + ["fail"] + ["skipped"] * 4
    assert stopped[4].detail == "not run: test 3 did not pass"


def test_float_judge_through_the_sandbox(sandbox: Sandbox) -> None:
    tests = [{"stdin": "3", "expected_stdout": "0.333333333"}]
    code = "print(1 / int(input()))"
    assert run_code_tests(sandbox, code, tests, timeout_s=5.0)[0].verdict == "fail"  # lines: text must be equal
    floated = run_code_tests(sandbox, code, tests, timeout_s=5.0, judge=Judge("float", abs_tol=1e-6))
    assert floated[0].verdict == "pass"


def test_per_test_limits(sandbox: Sandbox) -> None:
    """A test's own time and memory limits replace the request's for that test only."""
    # n / 10 s of CPU time (the time limit's measure: a sleep that long would be within 0.2 s's wall-clock limit)
    code = (
        "import time\nn = int(input())\nt = time.process_time()\nwhile time.process_time() - t < n / 10: pass\n"
        "x = bytearray(n * (32 << 20))\nprint('ok')"
    )
    tests = [
        {"stdin": "5", "expected_stdout": "ok"},  # 0.5 s, 160 MiB: fits the request's limits
        {"stdin": "5", "expected_stdout": "ok", "timeout_s": 0.2},  # its own, shorter time limit
        {"stdin": "5", "expected_stdout": "ok", "memory_mb": 64},  # its own, smaller memory
    ]
    results = run_code_tests(sandbox, code, tests, timeout_s=5.0, memory_mb=512)
    assert [r.verdict for r in results] == ["pass", "timeout", "memory_limit"], [r.stderr[-200:] for r in results]
    with pytest.raises(ValueError, match=r"tests\[0\].timeout_s must be a number above 0"):
        run_code_tests(sandbox, code, [{"stdin": "", "expected_stdout": "", "timeout_s": -1}])


# Neither `unittest.main()` (it exits before the proof of completion: every candidate fails) nor
# `unittest.main(exit=False)` (failures are printed, not raised: every candidate passes) judges; this does.
UNITTEST_RUN = (
    "assert unittest.TextTestRunner().run(unittest.defaultTestLoader.loadTestsFromTestCase(T)).wasSuccessful()"
)
UNITTEST = "import unittest\nclass T(unittest.TestCase):\n    def test_1(self):\n        {check}\n" + UNITTEST_RUN

ALWAYS_EQUAL = """class AlwaysEqual:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __sub__(self, other): return self
    def __abs__(self): return self
    def __hash__(self): return 0
def add(a, b): return AlwaysEqual()
def pair(a): return [AlwaysEqual(), a]
"""


@pytest.mark.parametrize(
    "tests",
    [
        "assert add(1, 2) == 3",
        "assert 3 == add(1, 2)",
        "assert not (add(1, 2) != 3)",
        "assert abs(add(1, 2) - 3) < 1e-6",
        "assert pair(1) == [3, 1]",
        "assert add(1, 2) in [3, 4]",
        "def check(candidate):\n    assert candidate(1, 2) == 3\n\ncheck(add)",
        "assert all(add(a, b) == a + b for a, b in [(1, 2), (2, 2)])",
        # A check that raises or exits instead of `assert` (these passed the guard of asserts alone).
        "if add(1, 2) != 3:\n    raise AssertionError",
        "if not add(1, 2) == 3:\n    raise ValueError('wrong')",
        "if add(1, 2) == 3:\n    pass\nelse:\n    raise AssertionError",
        "import sys\nif add(1, 2) != 3:\n    print('FAIL')\n    sys.exit(1)",
        # unittest's assertion methods, in tests that make a failed test method fail the program (see UNITTEST).
        *(
            UNITTEST.format(check=check)
            for check in (
                "self.assertEqual(add(1, 2), 3)",
                "self.assertEqual(3, add(1, 2), msg='sum')",
                "self.assertEqual(first=add(1, 2), second=3)",
                "self.assertTrue(add(1, 2) == 3)",
                "self.assertFalse(add(1, 2) != 3)",
                "self.assertAlmostEqual(add(1, 2), 3)",
                "self.assertIn(add(1, 2), [3, 4])",
                "self.assertListEqual(pair(1), [3, 1])",
                "self.assertLess(add(1, 2), 4)",
            )
        ),
        UNITTEST.format(check="self.assertEqual(add(1, 2), 3)").replace(UNITTEST_RUN, "T('test_1').test_1()"),
    ],
)
def test_an_object_built_to_equal_anything_does_not_pass(sandbox: Sandbox, tests: str) -> None:
    """The AlwaysEqual hack: a returned object whose `__eq__` (and `__lt__`, `__sub__`, ...) answers true passed."""
    assert _verdicts(sandbox, ALWAYS_EQUAL, [{"assert": tests}]) == ["runtime_error"]


@pytest.mark.parametrize(
    "code",
    [
        "def add(a, b):\n    class E:\n        def __eq__(self, other):\n            return True\n    return E()\n",
        "def add(a, b):\n    class E:\n        __eq__ = lambda s, o: True\n        __hash__ = None\n    return E()\n",
        "import functools, operator\ndef add(a, b):\n"
        "    return type('E', (), {'__eq__': functools.partial(operator.is_not, None), '__hash__': None})()\n",
    ],
    ids=["a class made when called", "its lambda", "type() with a partial"],
)
def test_an_always_equal_class_the_candidate_makes_when_called_does_not_pass(sandbox: Sandbox, code: str) -> None:
    """A class the candidate's function makes while the tests run gets the module name of that moment, `__main__`:
    the guard, which judged a comparison by its module, let `def f(): class E: __eq__ = ...` pass every assert."""
    for tests in ("assert add(1, 2) == 3", "def check(candidate):\n    assert candidate(1, 2) == 3\n\ncheck(add)"):
        [result] = run_code_tests(sandbox, code, [{"assert": tests}], timeout_s=10.0)
        assert result.verdict == "runtime_error" and "the candidate's class E" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("method", ["functools.partialmethod(lambda s, o: True)", "property(lambda s: lambda o: True)"])
def test_an_always_equal_comparison_that_is_not_the_candidates_function_does_not_pass(
    sandbox: Sandbox, method: str
) -> None:
    """`__eq__` as a partialmethod or a property answering true for anything is no function of the candidate's module:
    the guard, which looked at the method's module, let them pass (a bare builtin such as `operator.is_not` is not
    bound to the instance, so it raises on its own)."""
    code = f"import functools\nclass E:\n    __eq__ = {method}\n    __hash__ = None\ndef add(a, b): return E()\n"
    [result] = run_code_tests(sandbox, code, [{"assert": "assert add(1, 2) == 3"}], timeout_s=10.0)
    assert result.verdict == "runtime_error" and "the candidate's class E" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize(
    ("code", "tests"),
    [
        ("def add(a, b): return a + b", "assert add(1, 2) == 3 and add(1, 2) in {3} and not add(1, 2) < 3"),
        (  # the tests' own helper with its own __eq__
            "def add(a, b): return a + b",
            "class Approx:\n    def __init__(s, v): s.v = v\n    def __eq__(s, o): return abs(o - s.v) < 1e-6\n"
            "assert add(0.1, 0.2) == Approx(0.3)",
        ),
        (
            "from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f(): return P(1, 2)",
            "assert f() == (1, 2)",
        ),
        (
            "from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\ndef f(): return P(1)",
            "assert f() == P(1)",
        ),
        (  # the candidate's class on both sides compares by its own __eq__
            "class Node:\n    def __init__(s, v, n=None): s.v, s.n = v, n\n"
            "    def __eq__(s, o): return isinstance(o, Node) and (s.v, s.n) == (o.v, o.n)\n"
            "def f(): return Node(1, Node(2))",
            "assert f() == Node(1, Node(2))\nassert f() != Node(1)",
        ),
        ("from collections import Counter\ndef f(): return Counter('aab')", "assert f() == {'a': 2, 'b': 1}"),
        ("def f(): return 2.0", "assert f() == 2\nassert 1 < f() <= 2\nassert f() is not None"),
        (  # a list of the candidate's own, with methods that are not comparisons
            "class Row(list):\n    def __getitem__(s, i): return list.__getitem__(s, i)\ndef f(): return Row([1, 2])",
            "assert f() == [1, 2] and 2 in f()",
        ),
        ("def add(a, b): return a + b", "if add(1, 2) != 3 or not add(1, 2) in (3,):\n    raise AssertionError"),
        (
            "class Node:\n    def __init__(s, v): s.v = v\n    def __eq__(s, o): return isinstance(o, Node) and s.v == o.v\n"
            "def f(): return Node(1)",
            "if f() != Node(1):\n    raise AssertionError\n"
            + UNITTEST.format(check="self.assertEqual(f(), Node(1)); self.assertIn(f(), [Node(1)])"),
        ),
        (
            "from collections import Counter, namedtuple\nfrom dataclasses import dataclass\nP = namedtuple('P', 'x y')\n"
            "@dataclass\nclass D:\n    x: int\ndef f(): return P(1, 2)\ndef g(): return Counter('aab')\n"
            "def h(): return D(1)",
            UNITTEST.format(
                check="self.assertEqual(f(), (1, 2)); self.assertEqual(g(), {'a': 2, 'b': 1}); "
                "self.assertEqual(h(), D(1)); self.assertTupleEqual(tuple(f()), (1, 2))"
            ),
        ),
        (
            "def f(x): return [x + 0.1, 2]",
            "class Approx:\n    def __init__(s, v): s.v = v\n    def __eq__(s, o): return abs(o - s.v) < 1e-6\n"
            + UNITTEST.format(
                check="self.assertAlmostEqual(f(1)[0], 1.1); self.assertListEqual(f(1), [1.1, 2]); "
                "self.assertCountEqual(f(1), [2, 1.1]); self.assertTrue(f(1)[1] == 2); self.assertIn(2, f(1)); "
                "self.assertGreater(f(1)[0], 1); self.assertEqual(f(0.2)[0], Approx(0.3)); "
                "self.assertRaises(ZeroDivisionError, lambda: 1 / 0); self.assertIsNone(None)"
            ),
        ),
    ],
)
def test_right_answers_still_pass_the_guarded_comparisons(sandbox: Sandbox, code: str, tests: str) -> None:
    assert _verdicts(sandbox, code, [{"assert": tests}]) == ["pass"]


def test_guarded_rewrites_only_the_comparisons_of_checks() -> None:
    tests = "x = 1 == 1\nassert f(1) == 3, 'message'\nassert f(2) is None\n"
    program = guarded(tests)
    assert program.startswith(GUARD)
    body = program[len(GUARD) :]
    assert "x = 1 == 1" in body and "assert f(2) is None" in body
    assert "assert __grpo_compare__('==', f(1), 3), 'message'" in body
    assert guarded("print(1 == 1)") == "print(1 == 1)"  # no check: as written
    assert guarded("if x == 1:\n    print(x)") == "if x == 1:\n    print(x)"  # an `if` that does not fail the tests
    checks = guarded("if f(1) != 3:\n    raise E\nself.assertTrue(f(2) == 4)\nself.assertEqual(f(3), 5, msg='m')")
    assert "if __grpo_compare__('!=', f(1), 3):" in checks
    assert "self.assertTrue(__grpo_compare__('==', f(2), 4))" in checks
    assert "__grpo_assertion__(self.assertEqual, f(3), 5, msg='m')" in checks
    assert guarded("assert (") == "assert ("  # does not parse: fails as written
