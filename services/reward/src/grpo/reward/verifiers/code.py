"""Code verifier: run a candidate program against stdio or assert tests in the sandbox and give each a verdict."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from grpo.reward.sandbox import ExecResult, Limits, Sandbox
from grpo.reward.sandbox.languages import build, run_launch

VERDICTS = (
    "pass",
    "fail",
    "compile_error",
    "timeout",
    "runtime_error",
    "memory_limit",
    "output_limit",
    "sandbox_error",
)
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_ALIASES = {
    "python": {"python", "py", "python3", "py3"},
    "c": {"c"},
    "cpp": {"cpp", "c++", "cc", "cxx"},
    "java": {"java"},
    "javascript": {"javascript", "js", "node", "nodejs"},
    "bash": {"bash", "sh", "shell"},
}


@dataclass
class CodeTestResult:
    """The verdict of one test, with what the program did."""

    verdict: str
    """pass | fail | timeout | runtime_error | memory_limit | output_limit | sandbox_error"""
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    detail: str = ""
    """Why the verdict is what it is, in words (empty for a pass)."""
    cpu_s: float = 0.0
    peak_memory_mb: float = 0.0


def extract_code(completion: str, language: str = "python") -> str:
    """The last fenced code block (preferring blocks tagged with `language`), else the text itself.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nDone.")
    'print(1)\\n'
    """
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(completion)]
    if not blocks:
        return completion
    names = _ALIASES.get(language, {language})
    tagged = [body for tag, body in blocks if tag in names]
    return (tagged or [body for _, body in blocks])[-1]


def stdout_matches(actual: str, expected: str) -> bool:
    """Equal line by line, ignoring trailing whitespace per line and trailing blank lines; line counts must match."""

    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(actual) == lines(expected)


def verdict_for(result: ExecResult, test: dict[str, Any]) -> tuple[str, str]:
    """Map one sandbox result to (verdict, detail) for `test` (stdio or assert)."""
    if result.status != "ok":
        return result.status, f"program ended with status {result.status} (exit code {result.exit_code})"
    if "assert" in test:
        if not result.proof:
            return "fail", "the program exited before the tests ran to completion (no proof of completion)"
        return "pass", ""
    if stdout_matches(result.stdout, test["expected_stdout"]):
        return "pass", ""
    return "fail", "stdout does not match the expected output"


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


def program_for(code: str, test: dict[str, Any]) -> tuple[str, str]:
    """(program, stdin) for one test: assert tests run after the candidate in the same program."""
    if "assert" in test:
        return code + "\n" + test["assert"] + "\n", test.get("stdin", "")
    return code, test.get("stdin", "")


def run_code_tests(
    sandbox: Sandbox,
    code: str,
    tests: list[dict[str, Any]],
    language: str = "python",
    timeout_s: float = 10.0,
    memory_mb: int = 512,
) -> list[CodeTestResult]:
    """Build once (compiled languages), then run every test in its own sandboxed process, concurrently.

    One result per test, in order; when the build fails every test is `compile_error` with the compiler's message.
    """
    validate_tests(tests)
    if language not in sandbox.languages:
        raise ValueError(f"language {language!r} is not available here; available: {sorted(sandbox.languages)}")
    if language != "python" and any("assert" in t for t in tests):
        raise ValueError(f"assert tests are Python programs; give {language} stdin/expected_stdout tests")
    limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    failed, built = build(sandbox, language, code)
    if failed is not None:
        verdict = "compile_error" if failed.status == "compile_error" else failed.status
        detail = "the program did not compile" if verdict == "compile_error" else "the build could not run"
        return [CodeTestResult(verdict, failed.exit_code, failed.stdout, failed.stderr, failed.wall_s, detail)] * len(
            tests
        )
    tools = sandbox.languages[language]

    def one(test: dict[str, Any]) -> CodeTestResult:
        program, stdin = program_for(code, test)
        result = sandbox.execute(run_launch(language, program, tools, limits.memory_mb, built), stdin, limits)
        verdict, detail = verdict_for(result, test)
        return CodeTestResult(
            verdict, result.exit_code, result.stdout, result.stderr, result.wall_s, detail, result.cpu_s,
            result.peak_memory_mb,
        )  # fmt: skip

    if len(tests) <= 1:
        return [one(test) for test in tests]
    with ThreadPoolExecutor(max_workers=min(len(tests), max(1, sandbox.workers))) as pool:
        return list(pool.map(one, tests))
