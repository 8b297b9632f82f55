"""Code verifier: run a candidate program against stdio or assert tests in the sandbox and give each a verdict."""

from __future__ import annotations

import ast
import functools
import math
import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from grpo.reward.output import returned_stderr, returned_stdout, stream_bytes
from grpo.reward.sandbox import ExecResult, Limits, Sandbox
from grpo.reward.sandbox.build_cache import build_checker, build_program
from grpo.reward.sandbox.languages import Launch, run_launch
from grpo.reward.verifiers.assert_guard import LINES_NAME, guarded, parse
from grpo.reward.verifiers.frameworks import harnessed

VERDICTS = ("pass", "fail", "compile_error", "timeout", "runtime_error", "memory_limit", "process_limit",
            "output_limit", "skipped", "checker_error", "sandbox_error")  # fmt: skip
COMPARES = ("lines", "exact", "tokens", "case_insensitive", "float")
CHECKER_REJECTS = frozenset({1, 2, 4, 7, 8})  # testlib's _wa, _pe, _dirt, _points, _unexpected_eof
# How each runtime reports an uncaught error on stderr (C and C++ die of a signal instead, never a reject code).
CRASH_MARKS = {
    "python": re.compile(r"^Traceback \(most recent call last\):", re.MULTILINE),
    "javascript": re.compile(r"^\s+at .+:\d+:\d+\)?$|^\S*Error: |^Uncaught ", re.MULTILINE),
    "typescript": re.compile(r"^\s+at .+:\d+:\d+\)?$|^\S*Error: |^Uncaught ", re.MULTILINE),
    "java": re.compile(r"^Exception in thread ", re.MULTILINE),
    "go": re.compile(r"^panic: |^goroutine \d+ \[", re.MULTILINE),
    "rust": re.compile(r"^thread '.*' panicked at ", re.MULTILINE),
}


def checker_crashed(language: str, stderr: str) -> bool:
    """Whether a checker's stderr shows its runtime's crash report (then its exit code is no verdict)."""
    mark = CRASH_MARKS.get(language)
    return mark is not None and mark.search(stderr) is not None


@dataclass(frozen=True)
class Checker:
    """A special judge (testlib's convention): run as `checker input.txt output.txt answer.txt` with the test's
    input, the program's output and the expected output. testlib's exit codes: 0 accepts; 1 (wrong answer),
    2 (presentation error), 4 (dirt after the answer), 7 (points: partial credit, not a pass) and 8 (unexpected
    end of output) reject; 3 (the checker's own failure) and anything else are a checker failure. What it prints
    on stderr is the verdict's detail. C++ checkers may `#include "testlib.h"` (shipped with the sandbox)."""

    language: str
    code: str


@dataclass(frozen=True)
class Judge:
    """How stdout is compared with the expected output, and whether judging stops at the first failure.

    lines: equal line by line, trailing spaces and trailing blank lines ignored (the default); exact: byte for
    byte; tokens: the same whitespace-separated tokens; case_insensitive: tokens, ignoring case; float: tokens,
    numbers equal within abs_tol or rel_tol (|a − b| ≤ max(abs_tol, rel_tol·|b|)), other tokens exactly.
    """

    compare: str = "lines"
    abs_tol: float = 1e-6
    rel_tol: float = 1e-6
    stop_on_first_failure: bool = False
    checker: Checker | None = None


# A fence's indentation (where only whitespace precedes it on its line) is taken from its code's lines, as
# CommonMark does: a fence in a list item is indented, the code in it is not.
_FENCE = re.compile(r"(^[ \t]*)?```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL | re.MULTILINE)
_ALIASES = {
    "python": {"python", "py", "python3", "py3"},
    "c": {"c"},
    "cpp": {"cpp", "c++", "cc", "cxx"},
    "java": {"java"},
    "javascript": {"javascript", "js", "node", "nodejs"},
    "typescript": {"typescript", "ts"},
    "go": {"go", "golang"},
    "rust": {"rust", "rs"},
    "bash": {"bash", "sh", "shell"},
}


@dataclass
class CodeTestResult:
    """The verdict of one test, with what the program did."""

    verdict: str
    """pass | fail | timeout | runtime_error | memory_limit | process_limit | output_limit | sandbox_error"""
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    detail: str = ""
    """Why the verdict is what it is, in words (empty for a pass)."""
    cpu_s: float = 0.0
    peak_memory_mb: float = 0.0
    stdout_encoding: str = "utf-8"
    """utf-8: `stdout` is its text; base64: its bytes were not UTF-8 and `stdout` is their base64."""
    stdout_bytes: int = 0
    """Bytes the program wrote to stdout; `stdout` holds their head and tail when `stdout_truncated`."""
    stdout_truncated: bool = False
    stderr_bytes: int = 0
    stderr_truncated: bool = False


def result_for(verdict: str, result: ExecResult, detail: str, keep: int | None = None) -> CodeTestResult:
    """`verdict` with what the program did: each stream cut to its first and last halves of `keep` bytes (None:
    whole), so that a request's results hold no more than the reply returns (grpo.reward.output)."""
    limit = sys.maxsize if keep is None else keep
    out, err = returned_stdout(result.stdout, result.stdout_raw, limit), returned_stderr(result.stderr, limit)
    return CodeTestResult(
        verdict, result.exit_code, out.text, err.text, result.wall_s, detail, result.cpu_s, result.peak_memory_mb,
        out.encoding, out.total, out.truncated, err.total, err.truncated,
    )  # fmt: skip


def message_result(verdict: str, stderr: str, detail: str = "", keep: int | None = None) -> CodeTestResult:
    """A test that did not run, with why on stderr (a sandbox failure, a checker that could not be built)."""
    return result_for(verdict, ExecResult(verdict, None, "", stderr, 0.0), detail, keep)


def extract_code(completion: str, language: str = "python") -> str:
    """The last fenced code block (preferring blocks tagged with `language`), else the text itself.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nDone.")
    'print(1)\\n'
    """
    blocks = [(tag.lower(), _outdented(body, len(indent))) for indent, tag, body in _FENCE.findall(completion)]
    if not blocks:
        return completion
    names = _ALIASES.get(language, {language})
    tagged = [body for tag, body in blocks if tag in names]
    return (tagged or [body for _, body in blocks])[-1]


def _outdented(body: str, indent: int) -> str:
    """`body` with up to `indent` leading spaces or tabs taken from each line."""
    if not indent:
        return body
    lines = body.split("\n")
    return "\n".join(line[min(indent, len(line) - len(line.lstrip(" \t"))) :] for line in lines)


def _lines(text: str) -> list[str]:
    out = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while out and not out[-1]:
        out.pop()
    return out


def _close(actual: str, expected: str, abs_tol: float, rel_tol: float) -> bool:
    if actual == expected:
        return True
    try:
        a, e = float(actual), float(expected)
    except ValueError:
        return False
    if math.isnan(a) or math.isnan(e):  # any NaN is the expected NaN, as testlib's doubleCompare ("-nan": glibc)
        return math.isnan(a) and math.isnan(e)
    if math.isinf(a) or math.isinf(e):
        return a == e
    bound = max(abs_tol, rel_tol * abs(e))
    # Reading the decimals, the tolerance itself and the subtraction each round by half an ulp: without this slack
    # an answer exactly at the tolerance in decimal ("0.000015" against "0.000014") failed (testlib adds 1e-15).
    slack = 2 * (math.ulp(a) + math.ulp(e) + math.ulp(bound))
    return abs(a - e) <= bound + slack


def stdout_matches(actual: str, expected: str, judge: Judge | None = None) -> bool:
    """Whether the program's output is the expected one under `judge.compare` (see Judge)."""
    mode = judge.compare if judge else "lines"
    if mode == "exact":
        return actual == expected
    if mode == "lines":
        return _lines(actual) == _lines(expected)
    got, want = actual.split(), expected.split()
    if len(got) != len(want):
        return False
    if mode == "tokens":
        return got == want
    if mode == "case_insensitive":
        return [t.casefold() for t in got] == [t.casefold() for t in want]
    if mode == "float" and judge is not None:
        return all(_close(g, w, judge.abs_tol, judge.rel_tol) for g, w in zip(got, want, strict=True))
    raise ValueError(f"unknown compare mode {mode!r}; choose one of {COMPARES}")


EXCERPT_CHARS = 100  # what a wrong answer's detail shows of each side where they differ
END = "the end of the output"


def first_difference(actual: str, expected: str, judge: Judge | None = None) -> str:
    """Where the output first differs from the expected one under `judge.compare`, as judges say it: the line
    (lines, exact) or token (tokens, case_insensitive, float: with the tolerance it missed) and both sides, each cut to
    EXCERPT_CHARS around the difference; "" when they match.

    >>> first_difference("1\\n2\\n4\\n", "1\\n2\\n3\\n")
    "line 3: expected '3', got '4'"
    """
    mode = judge.compare if judge else "lines"
    if mode in ("lines", "exact"):
        split = _lines if mode == "lines" else _exact_lines
        got, want = split(actual), split(expected)
        index = _first_unequal(got, want, lambda g, w: g == w)
        return "" if index is None else _line_difference(index, got, want)
    got, want = actual.split(), expected.split()
    if mode == "tokens":
        index = _first_unequal(got, want, lambda g, w: g == w)
    elif mode == "case_insensitive":
        index = _first_unequal(got, want, lambda g, w: g.casefold() == w.casefold())
    elif mode == "float" and judge is not None:
        index = _first_unequal(got, want, lambda g, w: _close(g, w, judge.abs_tol, judge.rel_tol))
    else:
        raise ValueError(f"unknown compare mode {mode!r}; choose one of {COMPARES}")
    return "" if index is None else _token_difference(index, got, want, judge)


def _exact_lines(text: str) -> list[str]:
    """The lines of `text` with their line ends (only "\\n" ends a line), so that a "\\r" or a missing last newline
    shows."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _first_unequal(got: list[str], want: list[str], same: Callable[[str, str], bool]) -> int | None:
    """The first index where the two differ, or where the shorter one ends; None when they agree throughout."""
    for index, (g, w) in enumerate(zip(got, want, strict=False)):
        if not same(g, w):
            return index
    return None if len(got) == len(want) else min(len(got), len(want))


def _differ_at(a: str, b: str) -> int:
    """The first character where `a` and `b` differ (the shorter one's length when it begins the other). Compared
    a block at a time: a line may be megabytes."""
    end, block, at = min(len(a), len(b)), 4096, 0
    while at < end and a[at : at + block] == b[at : at + block]:
        at += block
    return next((i for i in range(at, min(end, at + block)) if a[i] != b[i]), end)


def _excerpt(text: str, at: int) -> str:
    """`text` quoted with its escapes shown (a stray "\\r", a byte that is not UTF-8), cut to EXCERPT_CHARS from
    a little before `at`; … marks where it goes on."""
    start = max(0, at - EXCERPT_CHARS // 2) if len(text) > EXCERPT_CHARS else 0
    piece = text[start : start + EXCERPT_CHARS]
    return ("…" if start else "") + repr(piece) + ("…" if start + EXCERPT_CHARS < len(text) else "")


def _sides(index: int, got: list[str], want: list[str]) -> tuple[int, str, str]:
    """(where they differ in the item, expected shown, got shown) of item `index`."""
    if index >= len(got):
        return 0, _excerpt(want[index], 0), END
    if index >= len(want):
        return 0, END, _excerpt(got[index], 0)
    at = _differ_at(got[index], want[index])
    return at, _excerpt(want[index], at), _excerpt(got[index], at)


def _line_difference(index: int, got: list[str], want: list[str]) -> str:
    at, expected, actual = _sides(index, got, want)
    long = any(index < len(side) and len(side[index]) > EXCERPT_CHARS for side in (got, want))
    where = f"line {index + 1}, column {at + 1}" if long else f"line {index + 1}"
    return f"{where}: expected {expected}, got {actual}"


def _token_difference(index: int, got: list[str], want: list[str], judge: Judge | None) -> str:
    _, expected, actual = _sides(index, got, want)
    said = f"token {index + 1}: expected {expected}, got {actual}"
    if judge is None or index >= min(len(got), len(want)):
        return said
    if judge.compare == "case_insensitive":
        return f"{said} (ignoring case)"
    return said + (_missed_tolerance(got[index], want[index], judge) if judge.compare == "float" else "")


def _missed_tolerance(got: str, want: str, judge: Judge) -> str:
    """How far two numbers are apart against the tolerance they missed ("" when one is not a finite number)."""
    try:
        a, e = float(got), float(want)
    except ValueError:
        return ""
    if not (math.isfinite(a) and math.isfinite(e)):
        return ""
    return (
        f": they differ by {abs(a - e):.4g}, more than max(abs_tol {judge.abs_tol:g}, "
        f"rel_tol {judge.rel_tol:g} × {abs(e):.7g})"
    )


def judged_text(result: ExecResult) -> str:
    """The stdout a test's expected output is compared with: exact, a byte that is not UTF-8 read as a lone
    surrogate (which equals no character of an expected output), never as U+FFFD (which one could hold)."""
    return result.stdout if result.stdout_raw is None else result.stdout_raw.decode("utf-8", "surrogateescape")


def verdict_for(result: ExecResult, test: dict[str, Any], judge: Judge | None = None) -> tuple[str, str]:
    """Map one sandbox result to (verdict, detail) for `test` (stdio or assert)."""
    if result.status != "ok":
        return result.status, f"program ended with status {result.status} (exit code {result.exit_code})"
    if "assert" in test:
        if not result.proof:
            return "fail", "the program exited before the tests ran to completion (no proof of completion)"
        return "pass", ""
    actual = judged_text(result)
    if stdout_matches(actual, test["expected_stdout"], judge):
        return "pass", ""
    where = first_difference(actual, test["expected_stdout"], judge)
    return "fail", f"stdout does not match the expected output ({judge.compare if judge else 'lines'})" + (
        f": {where}" if where else ""
    )


def validate_tests(tests: list[dict[str, Any]]) -> None:
    """Raise ValueError naming the first test that is neither {stdin, expected_stdout} nor {assert}."""
    for i, test in enumerate(tests):
        if not isinstance(test, dict):
            raise ValueError(f"tests[{i}] must be an object")
        if "assert" in test:
            if not isinstance(test["assert"], str):
                raise ValueError(f"tests[{i}].assert must be a string")
        elif not isinstance(test.get("expected_stdout"), str) or not isinstance(test.get("stdin", ""), str):
            raise ValueError(f"tests[{i}] needs 'stdin' and 'expected_stdout' strings, or an 'assert' string")
        for key, low in (("timeout_s", 0.0), ("memory_mb", 16)):
            value = test.get(key)
            if value is not None and not (isinstance(value, int | float) and value > low):
                raise ValueError(f"tests[{i}].{key} must be a number above {low}, got {value!r}")


CANDIDATE_NAME = "__candidate__"  # the candidate's `__name__` in an assert program


def program_for(code: str, test: dict[str, Any]) -> tuple[str, str]:
    """(program, stdin) for one test: assert tests run after the candidate in the same program, the candidate as a
    module that is not `__main__` (as HumanEval's harness runs it: its `if __name__ == "__main__":` demo, which may
    read stdin or exit, is not the function under test), the tests as `__main__` (their own guard runs), their
    comparisons guarded against the candidate's always-equal objects (assert_guard); tests written for unittest or
    pytest (`unittest.main()`, `def test_x():`, `from solution import f`) inside the harness that judges them as
    those tools do (frameworks)."""
    if "assert" in test:
        tests, candidate = test["assert"], _not_main(code)
        lines = len(re.findall(r"\r\n|\r|\n", candidate)) + 1  # as Python counts them (assert_guard reads it)
        program = (
            f"{candidate}\n__name__ = '__main__'\n{LINES_NAME} = {lines}\n" + harnessed(tests, guarded(tests)) + "\n"
        )
        return program, test.get("stdin", "")
    return code, test.get("stdin", "")


@functools.lru_cache(maxsize=16)  # parsed once per candidate, not once per assert test (200,000 chars: 0.15 s)
def _not_main(code: str) -> str:
    """`code` with `__name__` set to CANDIDATE_NAME before its first statement that is not its docstring or a
    `from __future__` import (which must come first); `code` itself when it does not parse (it fails either way)."""
    if re.search("\r(?!\n)", code):  # a line end Python reads and str.split("\n") does not: left as it is
        return code
    try:
        body = parse(code).body
    # ValueError: a null byte; RecursionError, MemoryError: an expression nested too deep (`-` 100,000 times), which
    # the sandboxed run fails as well; never this service's failure
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code
    after = 0  # lines of the prelude
    for i, node in enumerate(body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not (docstring or (isinstance(node, ast.ImportFrom) and node.module == "__future__")):
            break
        after = node.end_lineno or after
    # The module is registered under that name too: dataclasses and pickle look a class's module up by name.
    alias = (
        f"__name__ = {CANDIDATE_NAME!r}; __import__('sys').modules[__name__] = __import__('sys').modules['__main__']"
    )
    lines = code.split("\n")
    return "\n".join([*lines[:after], alias, *lines[after:]])


def run_code_tests(
    sandbox: Sandbox,
    code: str,
    tests: list[dict[str, Any]],
    language: str = "python",
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    judge: Judge | None = None,
    keep_output_bytes: int | None = None,
) -> list[CodeTestResult]:
    """Build once (compiled languages), then run every test in its own sandboxed process.

    One result per test, in order; when the build fails every test is `compile_error` with the compiler's message.
    Stdin/stdout tests of the program as given run as batches (`_batched`); assert tests, tests with their own
    limits and tests judged by a checker run one sandbox run each, `sandbox.workers` at a time. With
    `judge.stop_on_first_failure` every test after the first that does not pass is `skipped` (not run).
    `keep_output_bytes`: each result keeps that much of each stream, its head and tail (`result_for`), cut as soon
    as the test is judged on its whole stdout; None keeps them whole.
    """
    judge = judge or Judge()
    validate_tests(tests)
    if language not in sandbox.languages:
        raise ValueError(f"language {language!r} is not available here; available: {sorted(sandbox.languages)}")
    if language != "python" and any("assert" in t for t in tests):
        raise ValueError(f"assert tests are Python programs; give {language} stdin/expected_stdout tests")
    checker = judge.checker
    if checker is not None and checker.language not in sandbox.languages:
        raise ValueError(
            f"checker language {checker.language!r} is not available here; available: {sorted(sandbox.languages)}"
        )
    failed, built = build_program(sandbox, language, code)  # kept between requests (build_cache.py)
    if failed is not None:
        verdict = "compile_error" if failed.status == "compile_error" else failed.status
        detail = "the program did not compile" if verdict == "compile_error" else "the build could not run"
        return [result_for(verdict, failed, detail, keep_output_bytes)] * len(tests)
    checker_built: dict[str, bytes] = {}
    if checker is not None:
        failed, checker_built = build_checker(sandbox, checker.language, checker.code)  # built once per process
        if failed is not None:
            detail = f"the checker could not be built: {failed.stderr[-500:]}"
            return [message_result("checker_error", failed.stderr, detail, keep_output_bytes)] * len(tests)
    tools = sandbox.languages[language]

    def check(test: dict[str, Any], stdin: str, output: bytes) -> tuple[str, str]:
        assert checker is not None
        files = {
            "input.txt": stdin.encode(),
            "output.txt": output,
            "answer.txt": test["expected_stdout"].encode(),
        }
        launch = run_launch(checker.language, checker.code, sandbox.languages[checker.language], 512, checker_built)
        launch = replace(launch, argv=[*launch.argv, *files], binary_files={**launch.binary_files, **files})
        said = sandbox.execute(launch, "", Limits(timeout_s=max(timeout_s, 10.0), memory_mb=512))
        message = (said.stderr or said.stdout).strip()[:500]
        if said.status == "ok":
            return "pass", ""
        # A runtime's crash exits with a reject's code too (Python, node, Java: 1; Go's panic: 2): its last words
        # mark a crash, not a rejection.
        crashed = checker_crashed(checker.language, said.stderr)
        if said.status == "runtime_error" and said.exit_code in CHECKER_REJECTS and not crashed:
            return "fail", f"the checker rejected the output: {message}"
        return "checker_error", f"the checker failed ({said.status}, exit code {said.exit_code}): {message}"

    def judged(test: dict[str, Any], stdin: str, result: ExecResult) -> CodeTestResult:
        verdict, detail = verdict_for(result, test, judge)
        if checker is not None and "expected_stdout" in test and result.status == "ok":
            verdict, detail = check(test, stdin, stream_bytes(result.stdout, result.stdout_raw))  # exact bytes
        return result_for(verdict, result, detail, keep_output_bytes)

    def one(test: dict[str, Any]) -> CodeTestResult:
        program, stdin = program_for(code, test)
        own = Limits(timeout_s=test.get("timeout_s", timeout_s), memory_mb=test.get("memory_mb", memory_mb))
        return judged(
            test, stdin, sandbox.execute(run_launch(language, program, tools, own.memory_mb, built), stdin, own)
        )

    width = max(1, sandbox.workers)
    if checker is None and _one_program(tests):
        return _batched(
            sandbox, run_launch(language, code, tools, memory_mb, built), tests, judged, judge, timeout_s, memory_mb
        )
    if len(tests) <= 1:
        return [one(test) for test in tests]
    with ThreadPoolExecutor(max_workers=min(len(tests), width)) as pool:
        if not judge.stop_on_first_failure:
            return list(pool.map(one, tests))
        out: list[CodeTestResult] = []
        for start in range(0, len(tests), width):
            out += pool.map(one, tests[start : start + width])
            bad = next((i for i, r in enumerate(out) if r.verdict != "pass"), None)
            if bad is not None:
                return out[: bad + 1] + _skipped(bad, len(tests) - bad - 1)
        return out


def _one_program(tests: list[dict[str, Any]]) -> bool:
    """Every test runs the same program under the same limits (stdin/stdout tests): a batch can run them."""
    return not any("assert" in t or "timeout_s" in t or "memory_mb" in t for t in tests)


def _skipped(bad: int, count: int) -> list[CodeTestResult]:
    return [CodeTestResult("skipped", None, "", "", 0.0, f"not run: test {bad} did not pass")] * count


def _batched(
    sandbox: Sandbox,
    launch: Launch,
    tests: list[dict[str, Any]],
    judged: Callable[[dict[str, Any], str, ExecResult], CodeTestResult],
    judge: Judge,
    timeout_s: float,
    memory_mb: int,
) -> list[CodeTestResult]:
    """The tests of one program as batches (`Sandbox.execute_many`): one in order when judging stops at the first
    failure, else one per sandbox worker, concurrently, each over a contiguous slice of the tests."""
    if not tests:
        return []
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    stdins = [test.get("stdin", "") for test in tests]
    if judge.stop_on_first_failure:
        out: list[CodeTestResult] = []
        runs = sandbox.execute_many(launch, stdins, limits, stream=True)
        try:
            for test, stdin, result in zip(tests, stdins, runs, strict=False):
                out.append(judged(test, stdin, result))
                if out[-1].verdict != "pass":
                    return out + _skipped(len(out) - 1, len(tests) - len(out))
        finally:
            runs.close()
        return out
    size = math.ceil(len(tests) / max(1, min(sandbox.workers, len(tests))))
    slices = [range(i, min(i + size, len(tests))) for i in range(0, len(tests), size)]

    def run(part: range) -> list[CodeTestResult]:
        # Judged as they come: each result's whole output is let go once judged (512 floods held were 8 GiB).
        runs = sandbox.execute_many(launch, [stdins[i] for i in part], limits)
        return [judged(tests[i], stdins[i], result) for i, result in zip(part, runs, strict=True)]

    with ThreadPoolExecutor(max_workers=len(slices)) as pool:
        return [result for part in pool.map(run, slices) for result in part]
