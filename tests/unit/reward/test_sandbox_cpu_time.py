"""A run's time limit is CPU time, its wall-clock limit idle_factor x that (run_output.py), for real.

On a host running more than it has CPUs (the reward server runs a sandboxed run per CPU beside its math workers),
a correct program waits for a CPU: judged on wall time it was a timeout at random (three tries of six tests:
0, 4 and 0 timed out, each timed-out run having used 0.5 s of CPU under a 1 s limit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from grpo.reward.sandbox import Limits, Sandbox, make_sandbox
from grpo.reward.sandbox.namespace import NamespaceSandbox
from grpo.reward.verifiers.code import run_code_tests
from tests.support import sandbox_mode
from tests.unit.reward.conftest import sandbox_with
from tests.unit.reward.helpers import descendants

LIMIT = Limits(timeout_s=1.0)
# 0.4 s of CPU, measured by the program itself: well inside its 1 s limit however long it waits for a CPU.
NEEDS_CPU = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nprint('ok')"
HOGS = 3  # busy loops beside the runs on their CPU: a run gets about a quarter of it


@pytest.fixture(scope="module")
def box() -> Iterator[NamespaceSandbox]:
    """One worker, so that every run is on the zygote `crowded` pins."""
    sandbox = make_sandbox(workers=1, **sandbox_mode.options())
    assert isinstance(sandbox, NamespaceSandbox)
    yield sandbox
    sandbox.close()


@contextmanager
def crowded(sandbox: NamespaceSandbox) -> Iterator[None]:
    """Every run of `sandbox` on one CPU shared with HOGS busy loops, as on an oversubscribed host. The zygotes and
    what they have started already (a prepared run's init) are pinned; their later runs inherit it."""
    cpu = min(os.sched_getaffinity(0))
    # Each in a session of its own, as the zygotes are: the kernel's autogroups share a CPU between sessions first.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(HOGS)]
    pinned = {pid for z in sandbox._all for pid in (z.pid, *descendants(z.pid))}
    before = {pid: os.sched_getaffinity(pid) for pid in pinned}
    try:
        for pid in (*pinned, *(hog.pid for hog in hogs)):
            os.sched_setaffinity(pid, {cpu})
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        for pid, cpus in before.items():
            try:
                os.sched_setaffinity(pid, cpus)
            except ProcessLookupError:  # a prepared run's init, used since
                pass


def test_a_correct_program_on_a_crowded_cpu_passes(box: NamespaceSandbox) -> None:
    """Under a 1 s limit, 0.4 s of CPU that takes more than a second of wall time to get is still in time."""
    with crowded(box):
        results = [box.run(NEEDS_CPU, limits=LIMIT) for _ in range(3)]
    assert [(r.status, r.stdout) for r in results] == [("ok", "ok\n")] * 3, results
    assert max(r.wall_s for r in results) > LIMIT.timeout_s, "the CPU was not crowded: the test proves nothing"
    assert all(r.cpu_s < LIMIT.timeout_s for r in results), [r.cpu_s for r in results]


def test_a_crowded_batch_passes(box: NamespaceSandbox) -> None:
    """The same for a submission's tests, which run as a batch (batch.py's supervisor)."""
    tests = [{"stdin": "", "expected_stdout": "ok"}] * 4
    with crowded(box):
        results = run_code_tests(box, NEEDS_CPU, tests, timeout_s=LIMIT.timeout_s)
    assert [r.verdict for r in results] == ["pass"] * 4, [(r.verdict, r.wall_s, r.cpu_s) for r in results]
    assert max(r.wall_s for r in results) > LIMIT.timeout_s, "the CPU was not crowded: the test proves nothing"


def run_both(sandbox: Sandbox, program: str, limits: Limits = LIMIT) -> list:
    """`program` as a single run, then twice in a batch."""
    from grpo.reward.sandbox.languages import run_launch

    launch = run_launch("python", program, sandbox.languages["python"], limits.memory_mb)
    return [sandbox.run(program, limits=limits), *sandbox.execute_many(launch, ["", ""], limits)]


def test_a_cpu_bound_loop_is_stopped_at_its_time_limit(box: NamespaceSandbox) -> None:
    """A loop is stopped once it has used its timeout_s of CPU time (read every CPU_POLL_S), not at its wall-clock
    limit: on an idle CPU after about timeout_s of wall time, so an RL batch full of them takes no longer than it
    did. (Judged by its CPU time, which the host's load does not stretch; the wall-clock limit is out of reach.)"""
    results = run_both(box, "while True: pass", Limits(timeout_s=1.0, wall_s=60.0))
    assert [r.status for r in results] == ["timeout"] * 3, results
    # At the limit, give or take a read's granularity; below RLIMIT_CPU's backstop (2 s).
    assert all(0.95 <= r.cpu_s < 1.5 for r in results), [r.cpu_s for r in results]
    assert all(r.wall_s < 30.0 for r in results), [r.wall_s for r in results]


def test_sleeping_past_the_wall_clock_limit_is_a_timeout(box: NamespaceSandbox) -> None:
    results = run_both(box, "import time\nprint('before', flush=True)\ntime.sleep(60)")
    assert [(r.status, r.stdout) for r in results] == [("timeout", "before\n")] * 3, results
    wall_limit = box.idle_factor * LIMIT.timeout_s
    assert all(wall_limit <= r.wall_s < wall_limit + 2.0 for r in results), [r.wall_s for r in results]


def test_sleeping_past_the_time_limit_but_within_the_wall_clock_limit_passes(box: NamespaceSandbox) -> None:
    """A program that waits (for I/O, say) and uses little CPU is judged by its output."""
    results = run_both(box, "import time\ntime.sleep(1.5)\nprint('ok')")
    assert [(r.status, r.stdout) for r in results] == [("ok", "ok\n")] * 3, results
    assert all(r.wall_s >= 1.5 for r in results), [r.wall_s for r in results]


def test_more_cpu_than_the_limit_is_a_timeout_however_long_the_wall_clock_limit(box: NamespaceSandbox) -> None:
    program = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.8: pass\nprint('ok')"
    results = run_both(box, program, Limits(timeout_s=0.3, wall_s=30.0))
    assert [r.status for r in results] == ["timeout"] * 3, results
    assert all(0.3 <= r.cpu_s < 0.8 for r in results), [r.cpu_s for r in results]


def test_an_explicit_wall_clock_limit_is_kept(box: NamespaceSandbox) -> None:
    """wall_s set in the limits (builds keep 30 s of wall time) is not replaced by idle_factor x timeout_s."""
    results = run_both(box, "import time\ntime.sleep(60)", Limits(timeout_s=1.0, wall_s=1.5))
    assert [r.status for r in results] == ["timeout"] * 3, results
    assert all(1.5 <= r.wall_s < 2.5 for r in results), [r.wall_s for r in results]


def test_the_forked_python_init_reads_the_cpu_time_too() -> None:
    """Where init.c cannot be built a single run's init is a fork of the zygote (zygote._child): its program is
    found and watched the same way."""
    with sandbox_with("python", workers=1) as sandbox:
        looped = sandbox.run("while True: pass", limits=Limits(timeout_s=1.0, wall_s=60.0))
        slept = sandbox.run("import time\ntime.sleep(1.5)\nprint('ok')", limits=LIMIT)
    assert looped.status == "timeout" and 0.95 <= looped.cpu_s < 1.5 and looped.wall_s < 30.0, looped
    assert (slept.status, slept.stdout) == ("ok", "ok\n"), slept
