"""Limits and runtimes as contest programs meet them, on real sandboxes and toolchains: Python's exit(), the peak
memory after large read-backs, Go's memory, the stdout cap and stderr, deep recursion in Java and node."""

from __future__ import annotations

import pytest

from grpo.reward.sandbox import Limits, Sandbox
from grpo.reward.verifiers.code import Checker, Judge, run_code_tests
from tests.unit.reward.conftest import sandbox_with

GO_TOUCH = (
    'package main\nimport "fmt"\n'
    'func main(){b:=make([]byte,%d<<20);for i:=0;i<len(b);i+=4096{b[i]=1};fmt.Println("ok")}'
)


def test_exit_and_quit_work_as_in_python3(sandbox: Sandbox) -> None:
    """-S skips `site`, which defines them: a solution calling exit() was a NameError (runtime_error)."""
    ok = sandbox.run("n = int(input())\nif n < 0:\n    print(-1)\n    exit()\nprint(n)", "-5")
    assert (ok.status, ok.exit_code, ok.stdout) == ("ok", 0, "-1\n"), ok.stderr
    assert sandbox.run("quit(3)").exit_code == 3
    said = sandbox.run("exit('bye')")
    assert (said.exit_code, said.stderr.strip()) == (1, "bye")


def test_exit_before_the_asserts_still_never_passes(sandbox: Sandbox) -> None:
    """exit() leaves the driver early, as sys.exit(0) does: no proof, so the assert test fails."""
    code = "def add(a, b):\n    return a - b\nexit()\n"
    [result] = run_code_tests(sandbox, code, [{"assert": "assert add(1, 2) == 3"}], timeout_s=5.0)
    assert result.verdict == "fail" and "proof" in result.detail


def test_a_python_checker_may_end_with_exit(sandbox: Sandbox) -> None:
    checker = "import sys\nexit(0 if open(sys.argv[2]).read().split() == open(sys.argv[3]).read().split() else 1)"
    judge = Judge(checker=Checker("python", checker))
    tests = [{"stdin": "", "expected_stdout": "1"}, {"stdin": "", "expected_stdout": "2"}]
    results = run_code_tests(sandbox, "print(1)", tests, timeout_s=10.0, judge=judge)
    assert [r.verdict for r in results] == ["pass", "fail"], [r.detail for r in results]


@pytest.mark.parametrize("init", ["c", "python"])
def test_reading_back_large_files_does_not_raise_later_peaks(init: str) -> None:
    """The worker's size is a floor under every run's peak: after read-backs of 16 MB files it stayed ~50 MB, and a
    print(1) at a 40 MB limit was a memory_limit. One worker, so every run is on the worker that read back."""
    with sandbox_with(init, workers=1) as box:
        before = box.run("print(1)", limits=Limits(memory_mb=40))
        after = []
        for files in (1, 1, 1, 4):  # a request's worth of 16 MB files each, a small run after each
            write = f"for i in range({files}):\n    open(f'big{{i}}.txt', 'w').write('x' * ((16 << 20) - 1))"
            back = box.run(write, limits=Limits(scratch_mb=128), read_back=("big*.txt",))
            assert back.status == "ok" and len(back.files) == files, back.stderr
            after.append(box.run("print(1)", limits=Limits(memory_mb=40)))
        crash = box.run("int main(){int*p=0;return *p;}", language="c", limits=Limits(memory_mb=50))
    assert [(r.status, r.stdout) for r in after] == [("ok", "1\n")] * 4, [r.peak_memory_mb for r in after]
    assert max(r.peak_memory_mb for r in after) < before.peak_memory_mb + 8, [r.peak_memory_mb for r in after]
    assert crash.status == "runtime_error" and crash.peak_memory_mb < 30, crash.peak_memory_mb


@pytest.mark.parametrize(("memory_mb", "touched"), [(16, 0), (32, 0), (64, 18), (256, 200)])
def test_go_runs_within_its_memory_limit(sandbox: Sandbox, memory_mb: int, touched: int) -> None:
    """Go maps writable memory it never touches (hello world failed at 32 MB, 18 MB touched at 64 MB)."""
    result = sandbox.run(GO_TOUCH % touched, language="go", limits=Limits(memory_mb=memory_mb))
    assert (result.status, result.stdout) == ("ok", "ok\n"), result.stderr[:300]
    assert result.peak_memory_mb < memory_mb


@pytest.mark.parametrize("touched", [100, 400])
def test_go_past_its_memory_limit_is_a_memory_limit(sandbox: Sandbox, touched: int) -> None:
    """Within the runtime's allowance, its resident peak; past it, Go's own "cannot allocate memory"."""
    result = sandbox.run(GO_TOUCH % touched, language="go", limits=Limits(memory_mb=64))
    assert result.status == "memory_limit", (result.peak_memory_mb, result.stderr[:300])


def test_stdout_up_to_the_cap_and_no_further(sandbox: Sandbox) -> None:
    """stdout alone counts: 999,969 bytes from Python used to trip a 1,000,000-byte cap with the proof's bytes."""
    whole = sandbox.run("import sys\nsys.stdout.write('a' * 999_969)")
    assert (whole.status, len(whole.stdout), whole.proof) == ("ok", 999_969, True)
    big = sandbox.run("import sys\nsys.stdout.write('a' * (4 << 20))", limits=Limits(max_output_bytes=4 << 20))
    assert (big.status, len(big.stdout)) == ("ok", 4 << 20)
    over = sandbox.run("import sys\nsys.stdout.write('a' * ((4 << 20) + 1))", limits=Limits(max_output_bytes=4 << 20))
    assert over.status == "output_limit" and len(over.stdout) <= 4 << 20


def test_the_default_stdout_cap_is_megabytes(sandbox: Sandbox) -> None:
    result = sandbox.run("print(*range(1_000_000))")  # 6.9 MB
    assert result.status == "ok" and len(result.stdout) == len(" ".join(map(str, range(1_000_000)))) + 1


def test_stderr_is_kept_bounded_and_does_not_stop_a_run(sandbox: Sandbox) -> None:
    """A correct program with 1.2 MB of debug output on stderr: ok, stderr cut to its first and last lines."""
    program = "import sys\nfor i in range(70000):\n    print('debug line', i, file=sys.stderr)\nprint(42)"
    result = sandbox.run(program, limits=Limits(max_output_bytes=1000))
    assert (result.status, result.stdout) == ("ok", "42\n")
    assert result.stderr.startswith("debug line 0\n") and result.stderr.endswith("debug line 69999\n")
    assert 60_000 < len(result.stderr) < 70_000 and "bytes of stderr cut" in result.stderr


def test_a_batch_counts_stdout_only(sandbox: Sandbox) -> None:
    program = "import sys\nfor i in range(70000):\n    print('debug line', i, file=sys.stderr)\nprint(input())"
    tests = [{"stdin": f"{n}\n", "expected_stdout": str(n)} for n in range(3)]
    assert [r.verdict for r in run_code_tests(sandbox, program, tests, timeout_s=10.0)] == ["pass"] * 3


def test_java_recursion_200000_deep(sandbox: Sandbox) -> None:
    code = (
        "public class Main { static int f(int n) { return n == 0 ? 0 : f(n - 1) + 1; }\n"
        "  public static void main(String[] a) { System.out.println(f(Integer.parseInt(a.length > 0 ? a[0] :"
        " new java.util.Scanner(System.in).next()))); } }"
    )
    for memory_mb in (64, 256):
        result = sandbox.run(code, "200000", language="java", limits=Limits(memory_mb=memory_mb))
        assert (result.status, result.stdout) == ("ok", "200000\n"), result.stderr[:300]
        assert result.peak_memory_mb < memory_mb + 256


def test_java_exceptions_are_reported_as_before(sandbox: Sandbox) -> None:
    code = 'public class Main { public static void main(String[] a) { throw new IllegalStateException("boom"); } }'
    result = sandbox.run(code, language="java")
    assert (result.status, result.exit_code) == ("runtime_error", 1)
    assert 'Exception in thread "main" java.lang.IllegalStateException: boom' in result.stderr


@pytest.mark.parametrize("language", ["javascript", "typescript"])
def test_node_stack_overflow_is_a_catchable_range_error(sandbox: Sandbox, language: str) -> None:
    """V8's stack limit lies within the kernel's: a SIGSEGV with an empty stderr before."""
    code = "function f(n) { return n == 0 ? 0 : f(n - 1) + 1 }\ntry { console.log(f(1e7)) } catch (e) { console.log('caught', e instanceof RangeError) }"
    result = sandbox.run(code, language=language)
    assert (result.status, result.stdout) == ("ok", "caught true\n"), (result.exit_code, result.stderr[:300])
    uncaught = sandbox.run("function f(n) { return n == 0 ? 0 : f(n - 1) + 1 }\nf(1e7)", language=language)
    assert uncaught.exit_code == 1 and "RangeError" in uncaught.stderr


STATIC = (
    "#include <cstdio>\nstatic char a[%d << 20];\n"
    'int main() { long s = 0; for (long i = 0; i < (%d << 20); i += 4096) s += ++a[i]; printf("%%ld\\n", s); }'
)


def test_static_data_past_the_limit_is_a_memory_limit(sandbox: Sandbox) -> None:
    """The kernel refuses the exec (a SIGSEGV before main): that was a runtime_error, single runs and batches alike."""
    tests = [{"stdin": "", "expected_stdout": str(300 << 8)}] * 2
    single = sandbox.run(STATIC % (300, 300), language="cpp", limits=Limits(memory_mb=256))
    assert single.status == "memory_limit", (single.exit_code, single.stderr)
    assert [r.verdict for r in run_code_tests(sandbox, STATIC % (300, 300), tests, "cpp", memory_mb=256)] == [
        "memory_limit"
    ] * 2
    fits = sandbox.run(STATIC % (100, 100), language="cpp", limits=Limits(memory_mb=256))
    assert (fits.status, fits.stdout) == ("ok", f"{100 << 8}\n")
    crash = sandbox.run("int main(){int*p=0;return *p;}", language="c", limits=Limits(memory_mb=256))
    assert crash.status == "runtime_error"


def test_stderr_cut_is_said_even_when_the_kept_tail_is_exactly_full() -> None:
    """The trim while reading can leave exactly STDERR_KEEP_BYTES of tail: the cut was then not said (a CI run
    caught it once, by the size of the output)."""
    from grpo.reward.sandbox.run_output import STDERR_KEEP_BYTES, Output

    err = Output("err")
    err.add(b"h" * STDERR_KEEP_BYTES)
    err.add(b"t" * (2 * STDERR_KEEP_BYTES + 1))  # trimmed to the last STDERR_KEEP_BYTES as it is read
    data = err.data()
    assert data.startswith(b"h" * STDERR_KEEP_BYTES) and data.endswith(b"t" * STDERR_KEEP_BYTES)
    assert f"[... {STDERR_KEEP_BYTES + 1} bytes of stderr cut ...]".encode() in data
    small = Output("err")
    small.add(b"x" * 10)
    assert small.data() == b"x" * 10  # nothing cut, nothing said
