"""Signals a program sends itself, on real sandboxes: it sees what a normal process sees, in a single run and in a
batch alike (issue 33).

A single run's program was its PID namespace's init, and an init drops every signal it has no handler for, even its
own: `raise(SIGTERM)` and a self-SIGKILL were ignored and the program went on (status ok), and `abort()` ended in
the SIGSEGV of glibc's last resort (exit -11), where a batch reported -6. Now neither mode's program is an init.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from grpo.reward.sandbox import ExecResult, Limits, Sandbox
from grpo.reward.sandbox.languages import build, run_launch
from grpo.reward.sandbox.namespace import NamespaceSandbox
from tests.unit.reward.conftest import sandbox_with

FAST = Limits(timeout_s=10.0, memory_mb=256)

# (language, program, the exit code, what it prints): each would print "after" if its signal were dropped.
SELF_SIGNALLED = {
    "c_raise_sigterm": (
        "c",
        '#include <signal.h>\n#include <stdio.h>\nint main(void){ raise(SIGTERM); puts("after"); return 0; }',
        -signal.SIGTERM,
        "",
    ),
    "c_failed_assert": (
        "c",
        '#include <assert.h>\n#include <stdio.h>\nint main(void){ assert(1 + 1 == 3); puts("after"); return 0; }',
        -signal.SIGABRT,
        "",
    ),
    "c_self_sigkill": (
        "c",
        "#include <signal.h>\n#include <stdio.h>\n#include <unistd.h>\n"
        'int main(void){ kill(getpid(), SIGKILL); puts("after"); return 0; }',
        -signal.SIGKILL,
        "",
    ),
    "cpp_uncaught_exception": (
        "cpp",
        '#include <cstdio>\n#include <stdexcept>\nint main(){ throw std::runtime_error("boom"); std::puts("after"); }',
        -signal.SIGABRT,
        "",
    ),
    "python_self_sigkill": (
        "python",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\nprint('after')",
        -signal.SIGKILL,
        "",
    ),
    "python_raise_sigterm": (
        "python",
        "import signal\nsignal.raise_signal(signal.SIGTERM)\nprint('after')",
        -signal.SIGTERM,
        "",
    ),
    "python_abort": ("python", "import os\nos.abort()\nprint('after')", -signal.SIGABRT, ""),
    # A handler the program installs still runs, as it always did (an init's handlers run too).
    "c_handled_sigterm": (
        "c",
        "#include <signal.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
        'static void on_term(int s){ (void)s; puts("handled"); exit(0); }\n'
        "int main(void){ signal(SIGTERM, on_term); raise(SIGTERM); return 1; }",
        0,
        "handled\n",
    ),
}


@pytest.fixture(scope="module", params=["c", "python"])
def box(request: pytest.FixtureRequest) -> Iterator[NamespaceSandbox]:
    """Single runs start from init.c, or (where it cannot be built) from the forked Python init: both alike."""
    with sandbox_with(request.param, workers=1) as sandbox:
        assert isinstance(sandbox, NamespaceSandbox)
        assert (sandbox.init is not None) == (request.param == "c")
        yield sandbox


def _single_and_batch(sandbox: Sandbox, language: str, program: str, limits: Limits = FAST) -> list[ExecResult]:
    """One single run (execute), then a batch of two (execute_many): the three results."""
    failed, built = build(sandbox, language, program)
    assert failed is None, failed
    launch = run_launch(language, program, sandbox.languages[language], limits.memory_mb, built)
    return [sandbox.execute(launch, "", limits), *sandbox.execute_many(launch, ["", ""], limits)]


@pytest.mark.parametrize("case", sorted(SELF_SIGNALLED))
def test_a_signal_a_program_sends_itself_acts_as_outside_the_sandbox(box: NamespaceSandbox, case: str) -> None:
    language, program, exit_code, stdout = SELF_SIGNALLED[case]
    status = "ok" if exit_code == 0 else "runtime_error"
    results = _single_and_batch(box, language, program)
    seen = [(r.status, r.exit_code, r.stdout) for r in results]
    assert seen == [(status, exit_code, stdout)] * 3, [
        (*s, r.stderr[-300:]) for s, r in zip(seen, results, strict=True)
    ]


def test_the_program_is_not_its_namespaces_init(box: NamespaceSandbox) -> None:
    """Neither a single run's program nor a batch's is PID 1 (an init, whose unhandled signals are dropped)."""
    results = _single_and_batch(box, "python", "import os\nprint(os.getpid() != 1, os.getppid() == 1)")
    assert [(r.status, r.stdout) for r in results] == [("ok", "True True\n")] * 3, results


def test_max_processes_counts_the_same_in_a_single_run_and_a_batch(box: NamespaceSandbox) -> None:
    """The init (a single run's) or the supervisor (a batch's) is not one of the program's processes: it may have
    max_processes of its own alive at once, itself included, in either mode."""
    program = (
        "import os, time\nn = 1\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)"
    )
    results = _single_and_batch(box, "python", program, Limits(timeout_s=10.0, memory_mb=256, max_processes=8))
    assert [(r.status, r.stdout) for r in results] == [("ok", "8\n")] * 3, results


REACH_INIT = r"""#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    struct rlimit none = {0, 0};
    int sigs[] = {SIGKILL, SIGSTOP, SIGTERM, SIGINT, SIGSEGV, SIGCHLD}, sent = 0;
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    for (int i = 0; i < 6; i++) sent += kill(1, sigs[i]) == 0;
    printf("sent %d\n", sent);
    printf("group %d\n", kill(0, SIGINT) + kill(0, SIGTERM));
    int pidfd = syscall(SYS_pidfd_open, 1, 0);
    printf("pidfd %d\n", (int)syscall(SYS_pidfd_send_signal, pidfd, SIGINT, NULL, 0));
    printf("prlimit %d\n", prlimit(1, RLIMIT_NOFILE, &none, NULL));
    printf("mem %d\n", open("/proc/1/mem", O_RDWR) >= 0);
    printf("status pipe %d\n", open("/proc/1/fd/6", O_WRONLY) >= 0);
    printf("environ %d\n", open("/proc/1/environ", O_RDONLY) >= 0);
    return 3;
}
"""


def test_the_init_is_out_of_the_programs_reach(box: NamespaceSandbox) -> None:
    """A single run's init stays beside its program under the same uid, as a batch's supervisor does: every
    signal sent to it is dropped (SIGKILL and SIGSTOP too: it is its namespace's init, with no handler; the Python
    init has no SIGINT handler either), prlimit on it is refused, its memory and fds (the status pipe, on which it
    reports the program's exit) cannot be opened, and it reports the program's own exit code."""
    results = _single_and_batch(box, "c", REACH_INIT)
    expected = "sent 6\ngroup 0\npidfd 0\nprlimit -1\nmem 0\nstatus pipe 0\nenviron 0\n"
    assert [(r.status, r.exit_code, r.stdout) for r in results] == [("runtime_error", 3, expected)] * 3, results
