"""A batch: one program run on many inputs in one namespace (zygote.py, "A batch"), for real.

What a batch must keep from single runs: every verdict, every attack contained, and each run starting from the
same state; what it adds, a supervisor that shares the runs' uid, must be out of their reach.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path

import pytest

from grpo.reward.sandbox import DEFAULT_IDLE_FACTOR, Limits, Sandbox
from grpo.reward.sandbox.confine import BATCH_UID_OFFSET
from grpo.reward.sandbox.languages import build, run_launch
from grpo.reward.sandbox.namespace import NamespaceSandbox
from grpo.reward.verifiers.code import Judge, run_code_tests
from tests.unit.reward.test_sandbox_languages import (
    CRASH,
    HOG,
    LANGUAGES,
    READ_REPO,
    REVERSE,
    SPIN,
    WRITE_USR,
    connect_program,
)

FAST = Limits(timeout_s=5.0, memory_mb=256)


def batch(sandbox: Sandbox, language: str, program: str, stdins: list[str], limits: Limits = FAST) -> list:
    failed, built = build(sandbox, language, program)
    assert failed is None, failed
    launch = run_launch(language, program, sandbox.languages[language], limits.memory_mb, built)
    return list(sandbox.execute_many(launch, stdins, limits))


@pytest.mark.parametrize("language", (*LANGUAGES, "python"))
def test_every_verdict_in_a_batch(sandbox: Sandbox, language: str) -> None:
    """ok, runtime error, timeout and memory limit, each twice in one batch: a run that had to be killed leaves
    the batch able to run the next one, with the same verdict."""
    if language == "python":
        programs = {"ok": "print(input()[::-1])", "crash": "raise SystemExit(3)", "spin": "while True: pass",
                    "hog": "x = []\nwhile True: x.append(bytearray(1 << 20))"}  # fmt: skip
    else:
        programs = {"ok": REVERSE[language], "crash": CRASH[language], "spin": SPIN[language], "hog": HOG[language]}
    assert [r.stdout for r in batch(sandbox, language, programs["ok"], ["abc\n", "grpo\n"])] == ["cba\n", "oprg\n"]
    crashed = batch(sandbox, language, programs["crash"], ["", ""])
    assert [r.status for r in crashed] == ["runtime_error"] * 2 and crashed[0].exit_code != 0, crashed
    spun = batch(sandbox, language, programs["spin"], ["", ""], Limits(timeout_s=1.5))
    assert [r.status for r in spun] == ["timeout"] * 2, spun
    # Killed at 1.5 s of CPU; on a loaded host that takes longer, up to the wall-clock limit (3 x 1.5 s), never more.
    assert all(1.4 < r.wall_s < 1.5 * DEFAULT_IDLE_FACTOR + 0.5 for r in spun), [r.wall_s for r in spun]
    hogs = batch(sandbox, language, programs["hog"], ["", ""], Limits(timeout_s=20.0, memory_mb=128))
    assert [r.status for r in hogs] == ["memory_limit"] * 2, [(r.status, r.exit_code, r.stderr[-300:]) for r in hogs]


@pytest.mark.parametrize("language", LANGUAGES)
def test_attacks_are_contained_in_a_batch(sandbox: Sandbox, language: str, listener: int) -> None:
    for program, expected in (
        (connect_program(language, listener), "refused"),
        (READ_REPO[language], "hidden"),
        (WRITE_USR[language], "refused"),
    ):
        results = batch(sandbox, language, program, ["", ""])
        assert [(r.status, r.stdout.strip()) for r in results] == [("ok", expected)] * 2, (program, results)
    assert not Path("/usr/grpo-attack").exists()


# Run "1" leaves what it can: files in the working directory, /tmp and /dev/shm, and processes that outlive it.
# Run "2" reports what it finds.
LEAVE_AND_LOOK = """read step
if [ "$step" = 1 ]; then
  echo x > left.txt; echo x > /tmp/left-tmp; echo x > /dev/shm/left-shm; mkdir -p d; chmod 000 d
  setsid sleep 100 < /dev/null > /dev/null 2>&1 &
  (sleep 100 < /dev/null > /dev/null 2>&1 &)
  echo left
else
  ls -A | tr '\\n' ' '; echo
  for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 100' || true
fi
"""


def test_a_run_sees_nothing_an_earlier_run_left(sandbox: Sandbox) -> None:
    results = batch(sandbox, "bash", LEAVE_AND_LOOK, ["1\n", "2\n", "1\n", "2\n"])
    assert [r.status for r in results] == ["ok"] * 4, results
    assert [r.stdout for r in results] == ["left\n", "main.sh \n0\n"] * 2


TAMPER = """read step
rm -f main.sh 2>/dev/null; echo 'echo hijacked' >> main.sh 2>/dev/null; chmod 777 main.sh 2>/dev/null
mv main.sh other.sh 2>/dev/null; ln -sf /bin/true main.sh 2>/dev/null
echo "run $step"
"""


def test_a_run_cannot_change_the_program_for_the_next(sandbox: Sandbox) -> None:
    results = batch(sandbox, "bash", TAMPER, ["1\n", "2\n", "3\n"])
    assert [r.stdout for r in results] == ["run 1\n", "run 2\n", "run 3\n"], results


REACH_SUPERVISOR = r"""#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    struct rlimit none = {0, 0};
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    printf("kill %d\n", kill(1, SIGKILL));
    printf("term %d\n", kill(1, SIGTERM));
    printf("int %d\n", kill(1, SIGINT));
    printf("group %d\n", kill(0, SIGINT) + kill(0, SIGTERM));
    int pidfd = syscall(SYS_pidfd_open, 1, 0);
    printf("pidfd %d\n", (int)syscall(SYS_pidfd_send_signal, pidfd, SIGINT, NULL, 0));
    printf("prlimit %d\n", prlimit(1, RLIMIT_NOFILE, &none, NULL));
    printf("mem %d\n", open("/proc/1/mem", O_RDWR) >= 0);
    printf("fd %d\n", open("/proc/1/fd/0", O_RDONLY) >= 0);
    printf("own %d\n", prlimit(0, RLIMIT_NOFILE, NULL, &none));
    return 0;
}
"""


def test_the_supervisor_is_out_of_the_runs_reach(sandbox: Sandbox) -> None:
    """It shares the runs' uid, yet signals, prlimit on it and its memory and fds are all refused; a run's own
    prlimit (how libc's setrlimit works) still is allowed, and the batch goes on."""
    results = batch(sandbox, "c", REACH_SUPERVISOR, ["", "", ""])
    # kill(1) "succeeds": init drops what it has no handler for, and the supervisor has none (not even Python's).
    expected = "kill 0\nterm 0\nint 0\ngroup 0\npidfd 0\nprlimit -1\nmem 0\nfd 0\nown 0\n"
    assert [(r.status, r.stdout) for r in results] == [("ok", expected)] * 3, results


RENICE = r"""#include <stdio.h>
#include <sys/resource.h>
int main(void) {
    printf("%d\n", getpriority(PRIO_PROCESS, 0));
    setpriority(PRIO_PROCESS, 1, 19);
    return 0;
}
"""


def test_a_run_that_changes_the_supervisors_scheduling_does_not_pass_it_on(sandbox: Sandbox) -> None:
    """The same uid may renice the supervisor, whose nice level its next spawn would inherit: a fresh namespace."""
    results = batch(sandbox, "c", RENICE, ["", "", ""])
    assert [r.stdout for r in results] == ["0\n"] * 3, results


def test_a_timeout_or_a_flood_mid_batch_costs_only_that_run(sandbox: Sandbox) -> None:
    program = "import sys\nw = input()\nif w == 'spin':\n    while True: pass\nif w == 'flood':\n    while True: print('x' * 1000)\nprint(w)"
    results = batch(sandbox, "python", program, ["a\n", "spin\n", "b\n", "flood\n", "c\n"], Limits(timeout_s=2.0))
    assert [r.status for r in results] == ["ok", "timeout", "ok", "output_limit", "ok"], results
    assert [r.stdout for r in results[::2]] == ["a\n", "b\n", "c\n"]


def test_a_queued_run_waits_its_turn_and_gets_its_whole_time(sandbox: Sandbox) -> None:
    """The supervisor holds the next run while one runs: runs never overlap, and a run queued behind a slow one
    still gets its full time limit (together they take longer than one limit plus the zygote's slack)."""
    program = "import time\nstart = time.monotonic()\ntime.sleep(float(input()))\nprint(start, time.monotonic())"
    results = batch(sandbox, "python", program, ["3.0", "3.0", "0"], Limits(timeout_s=3.6))  # 6 s > 3.6 + 2
    assert [r.status for r in results] == ["ok"] * 3, results
    spans = [tuple(map(float, r.stdout.split())) for r in results]
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans)), spans
    walls = [r.wall_s for r in results]  # each run's own time, not the time it waited in the queue
    assert 3.0 <= walls[0] < 3.6 and 3.0 <= walls[1] < 3.6 and walls[2] < 1.0, walls


def test_a_single_run_right_after_a_batch_has_a_scratch_of_its_own() -> None:
    """A zygote prepares the next single run as soon as a reply is out, while the service may already send a
    batch; the prepared run must not end up with the batch's scratch (root's files, not its own)."""
    sandbox = NamespaceSandbox(workers=1)
    try:
        look = run_launch(
            "python",
            "import os\nprint(sorted(os.listdir('.')), open('x', 'w').write('x'))",
            sandbox.languages["python"],
            256,
        )
        other = run_launch("python", "print(input())", sandbox.languages["python"], 256)
        seen = set()
        for _ in range(15):
            seen.add(sandbox.execute(look, "", FAST).stdout)
            assert [r.stdout for r in sandbox.execute_many(other, ["b\n", "c\n"], FAST)] == ["b\n", "c\n"]
        assert len(seen) == 1 and "1" in next(iter(seen)), seen  # the same listing, and its write worked
    finally:
        sandbox.close()


def test_one_stdin_is_a_prepared_single_run_not_a_batch(sandbox: Sandbox) -> None:
    """A batch's set-up and tear-down cost more than a single run the worker prepared ahead: one stdin (a one-test
    request) runs as that: its program is pid 2, the one child of its namespace's init, where a batch's runs
    are the supervisor's children one after another (pids 2, 3, 4, ...)."""
    launch = run_launch("python", "import os\nprint(os.getpid())", sandbox.languages["python"], 256)
    assert [r.stdout for r in sandbox.execute_many(launch, [""], FAST)] == ["2\n"]
    assert [r.stdout for r in sandbox.execute_many(launch, ["", "", ""], FAST)] != ["2\n"] * 3


def test_a_batch_run_gets_sigpipe_at_its_default_like_a_single_run(sandbox: Sandbox) -> None:
    launch = run_launch("bash", "yes | head -1; echo ${PIPESTATUS[0]}", sandbox.languages["bash"], 256)
    assert [(r.stdout, r.stderr) for r in sandbox.execute_many(launch, ["", ""], FAST)] == [("y\n141\n", "")] * 2


def test_a_batch_runs_as_a_named_user_like_a_single_run(sandbox: Sandbox) -> None:
    """A batch has a uid of its own; it too is `sandbox` in the sandbox's /etc/passwd and /etc/group."""
    program = "import grp, os, pwd\nprint(pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name)"
    assert sandbox.run(program, limits=FAST).stdout == "sandbox sandbox\n"
    assert [r.stdout for r in batch(sandbox, "python", program, ["", ""])] == ["sandbox sandbox\n"] * 2


def test_stop_on_first_failure_does_not_run_the_rest(sandbox: Sandbox) -> None:
    """Judging stops at the first failure: the tests after it are `skipped` and never started (each would
    sleep 3 s, so the whole judging finishing sooner proves it)."""
    program = "import time\nw = input()\nif w == 'slow':\n    time.sleep(3)\nprint(w)"
    tests = [{"stdin": "a\n", "expected_stdout": "a"}, {"stdin": "b\n", "expected_stdout": "not b"}]
    tests += [{"stdin": "slow\n", "expected_stdout": "slow"}] * 3
    started = time.monotonic()
    results = run_code_tests(sandbox, program, tests, "python", judge=Judge(stop_on_first_failure=True))
    assert [r.verdict for r in results] == ["pass", "fail", "skipped", "skipped", "skipped"]
    assert time.monotonic() - started < 2.5
    after = sandbox.run("print(6 * 7)", limits=FAST)  # the zygotes are back in the pool, in step
    assert after.stdout == "42\n"


def test_an_infrastructure_failure_is_a_sandbox_error_for_every_run(sandbox: Sandbox) -> None:
    launch = run_launch("c", "", sandbox.languages["c"], 256, {"main": b"not an executable"})
    broken = replace(launch, argv=["/scratch/missing"])
    results = list(sandbox.execute_many(broken, ["", "", ""], FAST))
    assert [r.status for r in results] == ["sandbox_error"] * 3, results
    assert "sandbox failure" in results[0].stderr
    assert sandbox.run("print(1)", limits=FAST).stdout == "1\n"


def test_small_memory_limits_run_one_namespace_per_run(sandbox: Sandbox) -> None:
    """Below BATCH_MIN_MEMORY_MB the supervisor would not fit under the runs' limit: single runs, same results."""
    results = batch(sandbox, "c", REVERSE["c"], ["ab\n", "cd\n"], Limits(timeout_s=5.0, memory_mb=32))
    assert [r.stdout for r in results] == ["ba\n", "dc\n"]
    # At the floor, under an address-space limit (Python), the supervisor itself still fits.
    results = batch(sandbox, "python", "print(input()[::-1])", ["ab\n", "cd\n"], Limits(timeout_s=5.0, memory_mb=64))
    assert [(r.status, r.stdout) for r in results] == [("ok", "ba\n"), ("ok", "dc\n")], results


def test_judging_many_tests_runs_them_as_batches(sandbox: Sandbox) -> None:
    """run_code_tests over 40 stdin tests: every verdict right, in order, across the workers' slices."""
    tests = [{"stdin": f"w{i}\n", "expected_stdout": f"{str(i)[::-1]}w" if i % 7 else "wrong"} for i in range(40)]
    results = run_code_tests(sandbox, REVERSE["c"], tests, "c", timeout_s=5.0, memory_mb=256)
    assert [r.verdict for r in results] == ["fail" if i % 7 == 0 else "pass" for i in range(40)]
    assert all(r.cpu_s > 0 and r.peak_memory_mb > 0 for r in results)


SLEEP_THEN_PRINT = "import time\ntime.sleep(float(input()))\nprint('done')"


def _uid(pid: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def _kill_during_second_run(sandbox: Sandbox, target: str) -> list:
    """Run a 4-run batch whose second run sleeps 3 s; 1 s in, SIGKILL the zygote or its batch supervisor."""
    import os
    import signal
    import threading

    launch = run_launch("python", SLEEP_THEN_PRINT, sandbox.languages["python"], 256)
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(sandbox.execute_many(launch, ["0", "3", "0", "0"], FAST)))
    worker.start()
    time.sleep(1.0)
    for zygote in list(sandbox._all):  # type: ignore[attr-defined]
        pid = zygote.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        # Each zygote's children: the next single run's init, waiting; the busy one's also its batch supervisor,
        # of the batch's own uid (rootless, one uid for all: a fork of the zygote, where the init is init.c).
        if zygote.rootless:
            own = Path(f"/proc/{pid}/cmdline").read_bytes()
            supervisors = [child for child in children if Path(f"/proc/{child}/cmdline").read_bytes() == own]
        else:
            supervisors = [child for child in children if _uid(child) == zygote.uid + BATCH_UID_OFFSET]
        if supervisors:
            os.kill(pid if target == "zygote" else int(supervisors[0]), signal.SIGKILL)
    worker.join(30)
    assert not worker.is_alive()
    return out


def test_a_killed_supervisor_costs_its_run_only(sandbox: Sandbox) -> None:
    results = _kill_during_second_run(sandbox, "supervisor")
    assert [r.status for r in results] == ["ok", "sandbox_error", "ok", "ok"], results
    assert "supervisor" in results[1].stderr


def test_a_killed_zygote_fails_the_rest_as_sandbox_errors_and_is_replaced(sandbox: Sandbox) -> None:
    results = _kill_during_second_run(sandbox, "zygote")
    statuses = [r.status for r in results]
    assert len(statuses) == 4 and statuses[1:] == ["sandbox_error"] * 3, results  # never a verdict on the program
    assert statuses[0] in ("ok", "sandbox_error")  # the first one's reply may have been held back
    assert sandbox.run("print(6 * 7)", limits=FAST).stdout == "42\n"
    deadline = time.monotonic() + 10  # the successor is started by the pool's spawner thread
    while len(sandbox._all) < sandbox.workers and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.05)
    assert len(sandbox._all) == sandbox.workers  # type: ignore[attr-defined]
