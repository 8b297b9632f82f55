"""The code verifier: extraction, stdout comparison and verdicts (table-driven), then real sandboxed test runs."""

from __future__ import annotations

import pytest

from grpo.reward.sandbox import ExecResult, Sandbox
from grpo.reward.verifiers.code import (
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
        "def f(): return 1\nassert f() == 1\n",
        "",
    )
    assert program_for("print(input())", {"stdin": "7\n", "expected_stdout": "7"}) == ("print(input())", "7\n")


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
    code = "import time\nn = int(input())\ntime.sleep(n / 10)\nx = bytearray(n * (32 << 20))\nprint('ok')"
    tests = [
        {"stdin": "5", "expected_stdout": "ok"},  # 0.5 s, 160 MiB: fits the request's limits
        {"stdin": "5", "expected_stdout": "ok", "timeout_s": 0.2},  # its own, shorter deadline
        {"stdin": "5", "expected_stdout": "ok", "memory_mb": 64},  # its own, smaller memory
    ]
    results = run_code_tests(sandbox, code, tests, timeout_s=5.0, memory_mb=512)
    assert [r.verdict for r in results] == ["pass", "timeout", "memory_limit"], [r.stderr[-200:] for r in results]
    with pytest.raises(ValueError, match=r"tests\[0\].timeout_s must be a number above 0"):
        run_code_tests(sandbox, code, [{"stdin": "", "expected_stdout": "", "timeout_s": -1}])
