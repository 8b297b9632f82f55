"""WorkerPool: results, errors, deadlines enforced by SIGKILL (the sympy blow-up), replacement, backpressure."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError

import pytest

from grpo.reward.pool import DeadlinePassed, PoolFull, TaskFailed, TaskTimeout, WorkerCrashed, WorkerPool
from grpo.reward.verifiers.math import verify_math

BLOWUP = "\\boxed{\\dfrac{5^{(5^{(5^{(5^5)})}-4)}-5}{16}}"


def boom() -> None:
    raise ValueError("bad input")


def die() -> None:
    os._exit(3)


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    with WorkerPool(2, max_queue=64, preload=["grpo.reward.verifiers.math"]) as p:
        yield p


def test_results_and_errors(pool: WorkerPool) -> None:
    assert pool.submit(pow, 2, 10, timeout_s=10).result(10) == 1024
    with pytest.raises(TaskFailed, match="ValueError: bad input"):
        pool.submit(boom, timeout_s=10).result(10)
    assert pool.submit(verify_math, "\\boxed{4}", "4", timeout_s=30).result(30).status == "correct"


def test_sympy_blowup_is_killed_within_deadline_and_worker_replaced(pool: WorkerPool) -> None:
    kills_before, pids_before = pool.kills, pool.pids()
    started = time.monotonic()
    future = pool.submit(verify_math, BLOWUP, "5", timeout_s=1.5)
    with pytest.raises(TaskTimeout):
        future.result(30)
    elapsed = time.monotonic() - started
    assert elapsed < 4.0, f"deadline 1.5s, answered after {elapsed:.1f}s"
    assert pool.kills == kills_before + 1
    pids_after = pool.pids()
    replaced = [old for old, new in zip(pids_before, pids_after, strict=True) if old != new]
    assert len(replaced) == 1, (pids_before, pids_after)
    with pytest.raises(ProcessLookupError):
        os.kill(replaced[0], 0)  # the blown-up worker is gone, not left running
    assert pool.submit(verify_math, "\\boxed{5}", "5", timeout_s=30).result(30).correct is True


def test_crash_is_reported_and_worker_replaced(pool: WorkerPool) -> None:
    with pytest.raises(WorkerCrashed):
        pool.submit(die, timeout_s=10).result(10)
    assert pool.submit(pow, 3, 2, timeout_s=10).result(10) == 9


def test_queue_is_bounded() -> None:
    with WorkerPool(1, max_queue=2) as small:
        first = small.submit(time.sleep, 1.0, timeout_s=10)
        time.sleep(0.3)  # the slot has taken the first task
        small.submit(time.sleep, 0.0, timeout_s=10)
        small.submit(time.sleep, 0.0, timeout_s=10)
        with pytest.raises(PoolFull):
            small.submit(time.sleep, 0.0, timeout_s=10)
        first.result(10)


def test_batches_run_per_item_deadlines() -> None:
    with WorkerPool(1, max_queue=16, max_batch=4) as batched:
        futures = [batched.submit(pow, i, 2, timeout_s=10) for i in range(3)]
        slow = batched.submit(time.sleep, 5, timeout_s=0.5)
        after = batched.submit(pow, 7, 2, timeout_s=10)
        assert [f.result(10) for f in futures] == [0, 1, 4]
        with pytest.raises(TaskTimeout):
            slow.result(10)
        assert after.result(10) == 49


def test_waiting_for_a_worker_spends_the_callers_deadline_not_the_tasks_own_limit() -> None:
    """A backlog once turned queued items into "timeout" (a verdict on the answer) and killed healthy workers."""
    with WorkerPool(1, max_queue=16, max_batch=4) as one:
        busy = one.submit(time.sleep, 1.0, timeout_s=5)
        time.sleep(0.2)  # the slot has taken it
        queued = [one.submit(pow, i, 2, timeout_s=0.5, deadline=time.monotonic() + 10) for i in range(3)]
        late = one.submit(pow, 9, 2, timeout_s=0.5, deadline=time.monotonic() + 0.3)
        assert busy.result(10) is None
        assert [f.result(10) for f in queued] == [0, 1, 4]  # waited ~0.8 s, each ran in far less than 0.5 s
        with pytest.raises(DeadlinePassed, match="before a worker was free"):
            late.result(10)
        assert one.kills == 0
        # Running, the caller's deadline before the task's own limit: the pool's doing, told apart from a timeout.
        cut = one.submit(time.sleep, 5, timeout_s=3, deadline=time.monotonic() + 0.5)
        with pytest.raises(DeadlinePassed, match="into the task"):
            cut.result(10)
        with pytest.raises(TaskTimeout):
            one.submit(time.sleep, 5, timeout_s=0.5, deadline=time.monotonic() + 10).result(10)
        assert one.kills == 2


def test_an_urgent_task_goes_before_everything_queued() -> None:
    """A timed-out verification's gold check decides a verdict that is already late: behind a backlog it once
    waited past the deadline, and the verdict became a null."""
    with WorkerPool(1, max_queue=16) as one:
        busy = one.submit(time.sleep, 0.5, timeout_s=5)
        time.sleep(0.2)  # the slot has taken it
        queued = [one.submit(time.sleep, 0.3, timeout_s=5) for _ in range(4)]
        urgent = one.submit(pow, 2, 5, timeout_s=5, urgent=True)
        assert urgent.result(10) == 32
        assert not any(f.done() for f in queued)  # it ran right after the task under way
        assert busy.done()
        assert [f.result(10) for f in queued] == [None] * 4


def test_an_urgent_task_wakes_an_idle_slot() -> None:
    with WorkerPool(1, max_queue=16) as one:
        assert one.submit(pow, 3, 3, timeout_s=5).result(10) == 27
        assert one.submit(pow, 2, 3, timeout_s=5, urgent=True).result(10) == 8


def test_per_item_times_and_cancelled_tasks_are_reported() -> None:
    """Admission learns each item's time on a worker; a task whose caller left is never run."""
    times: list[float] = []
    cancelled: list[int] = []
    with WorkerPool(1, max_queue=16, on_item=times.append, on_cancel=lambda: cancelled.append(1)) as one:
        busy = one.submit(time.sleep, 0.4, timeout_s=5)
        time.sleep(0.1)
        dropped = one.submit(time.sleep, 5, timeout_s=10)
        assert dropped.cancel()
        assert one.submit(pow, 2, 2, timeout_s=5).result(10) == 4
        assert busy.result(10) is None
    assert cancelled == [1]
    assert len(times) == 2 and times[0] >= 0.3, times  # the 5 s sleep never ran


def test_a_running_task_whose_caller_left_is_stopped() -> None:
    """A blow-up whose request ended ran on to its own deadline, holding the worker; now its worker is killed and
    replaced at once, the task counted as cancelled (not as a timeout), and the next task runs."""
    cancelled: list[int] = []
    with WorkerPool(1, max_queue=16, on_cancel=lambda: cancelled.append(1)) as one:
        stuck = one.submit(time.sleep, 30, timeout_s=60)
        time.sleep(0.3)  # it runs
        pid = one.pids()[0]
        assert not stuck.cancel()  # running: the future cannot say cancelled, but the task is abandoned
        left = time.monotonic()
        assert one.submit(pow, 2, 5, timeout_s=5).result(10) == 32
        assert time.monotonic() - left < 2.0
        assert one.pids()[0] != pid and one.kills == 0
        with pytest.raises(CancelledError):
            stuck.result(1)
    assert cancelled == [1]
