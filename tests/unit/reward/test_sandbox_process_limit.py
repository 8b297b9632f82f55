"""A run that meets its process limit (max_processes, RLIMIT_NPROC: processes and threads) is `process_limit`, on
real sandboxes and toolchains (issue 33).

Java's "java.lang.OutOfMemoryError: unable to create native thread" was judged `memory_limit` (the marker of
every JVM out-of-memory error), and the other runtimes' refusals a plain `runtime_error`: neither says which limit
the program met.
"""

from __future__ import annotations

import typing

import pytest

from grpo.reward.sandbox import STATUSES, ExecResult, Limits, Sandbox
from grpo.reward.sandbox.languages import build, run_launch
from grpo.reward.sandbox.verdicts import classify
from grpo.reward.schemas import ExecStatus, Verdict
from grpo.reward.verifiers.code import VERDICTS, run_code_tests

LIMITS = Limits(timeout_s=10.0, memory_mb=256, max_processes=32)

# Threads (or processes) that wait, started until the runtime is refused one; the refusal is left to the runtime,
# as a contest program would, or reported the way that language's programs usually do (C: perror / strerror).
BOMBS = {
    "java": "public class Main{public static void main(String[] a){while(true){"
    "Thread t=new Thread(()->{try{Thread.sleep(100000);}catch(InterruptedException e){}});"
    "t.setDaemon(true);t.start();}}}",
    "python": "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()",
    "python_fork": "import os, time\nwhile True:\n    if os.fork() == 0:\n        time.sleep(100)\n        os._exit(0)",
    "c": "#include <pthread.h>\n#include <stdio.h>\n#include <string.h>\n#include <unistd.h>\n"
    "static void *wait_(void *x){ (void)x; pause(); return 0; }\n"
    "int main(void){ for(;;){ pthread_t t; int e = pthread_create(&t, 0, wait_, 0);"
    ' if (e) { fprintf(stderr, "pthread_create: %s\\n", strerror(e)); return 1; } } }',
    "c_fork": "#include <stdio.h>\n#include <sys/types.h>\n#include <unistd.h>\n"
    'int main(void){ for(;;){ pid_t p = fork(); if (p < 0) { perror("fork"); return 1; } if (p == 0) pause(); } }',
    "go": 'package main\nimport ("runtime"; "time")\n'
    "func main(){ for i := 0; i < 1000; i++ { go func(){ runtime.LockOSThread(); time.Sleep(time.Hour) }() };"
    " time.Sleep(5 * time.Second) }",
    "rust": "fn main(){ loop { std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(100))); } }",
}


def _single_and_batch(sandbox: Sandbox, case: str) -> list[ExecResult]:
    language = case.split("_")[0]
    program = BOMBS[case]
    failed, built = build(sandbox, language, program)
    assert failed is None, failed
    launch = run_launch(language, program, sandbox.languages[language], LIMITS.memory_mb, built)
    return [sandbox.execute(launch, "", LIMITS), *sandbox.execute_many(launch, ["", ""], LIMITS)]


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_a_thread_or_fork_refused_at_the_process_limit_is_a_process_limit(sandbox: Sandbox, case: str) -> None:
    results = _single_and_batch(sandbox, case)
    seen = [(r.status, r.exit_code != 0) for r in results]
    assert seen == [("process_limit", True)] * 3, [(r.status, r.exit_code, r.stderr[-400:]) for r in results]


def test_a_java_thread_bomb_is_judged_process_limit_not_memory_limit(sandbox: Sandbox) -> None:
    """The verdict of a judged test, and the runs beside it keep theirs: Java's heap running out is still
    memory_limit."""
    tests = [{"stdin": "", "expected_stdout": ""}] * 2
    bombed = run_code_tests(sandbox, BOMBS["java"], tests, "java", timeout_s=10.0)
    assert [r.verdict for r in bombed] == ["process_limit"] * 2, [(r.verdict, r.stderr[-300:]) for r in bombed]
    hog = "public class Main{public static void main(String[] a){java.util.List<long[]> l=new java.util.ArrayList<>();" \
        "while(true) l.add(new long[1<<17]);}}"  # fmt: skip
    hogged = run_code_tests(sandbox, hog, tests, "java", timeout_s=20.0, memory_mb=128)
    assert [r.verdict for r in hogged] == ["memory_limit"] * 2, [(r.verdict, r.stderr[-300:]) for r in hogged]


def test_every_status_and_verdict_is_one_the_api_can_answer() -> None:
    """A status the sandbox gives or a verdict the verifier gives that the schemas do not list fails the response
    (a 500 for the caller): the enumerations stay one list."""
    assert set(typing.get_args(ExecStatus)) == {*STATUSES, "compile_error"}
    assert set(typing.get_args(Verdict)) == set(VERDICTS)
    assert "process_limit" in STATUSES


@pytest.mark.parametrize(
    ("stderr", "peak_mb", "status"),
    [
        ('Exception in thread "main" java.lang.OutOfMemoryError: unable to create native thread: possibly out of '
         "memory or process/resource limits reached", 40.0, "process_limit"),
        ("java.lang.OutOfMemoryError: unable to create new native thread", 40.0, "process_limit"),  # JDK 8
        ("java.lang.OutOfMemoryError: unable to create native thread", 95.0, "memory_limit"),  # at the limit
        ('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space', 40.0, "memory_limit"),
        ('Exception in thread "main" java.io.IOException: Resource temporarily unavailable', 40.0, "runtime_error"),
        ("Traceback (most recent call last):\n  File \"main.py\", line 3, in <module>\n    data = sock.recv(10)\n"
         "BlockingIOError: [Errno 11] Resource temporarily unavailable", 12.0, "runtime_error"),
        ("main.sh: fork: retry: Resource temporarily unavailable", 12.0, "process_limit"),
        ("Error: spawn /bin/sh EAGAIN", 12.0, "process_limit"),
    ],
)  # fmt: skip
def test_how_a_refused_process_is_told_from_other_failures(stderr: str, peak_mb: float, status: str) -> None:
    """What the runs above do not show: a JVM refused a thread at its memory limit, and EAGAIN from I/O."""
    reply = {"exit_code": 1, "verdict": None, "stdout": "", "stderr": stderr, "peak_mb": peak_mb}
    assert classify({**reply, "memory_limit_mb": 100.0, "cpu_s": 0.1, "cpu_limit_s": 10})[0] == status
