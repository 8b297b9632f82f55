"""The rollout process's exit code when its worker loop thread ends: 1 unless a stop ended it."""

from __future__ import annotations

import threading

from grpo.rollout.__main__ import wait_until_stopped


def test_a_worker_that_ends_without_a_stop_is_exit_code_1() -> None:
    # run_worker_logged ends like this after a failure: it has logged the exception and returns.
    worker = threading.Thread(target=lambda: None, name="rollout-worker")
    worker.start()
    stop = threading.Event()
    assert wait_until_stopped(stop, worker) == 1
    assert stop.is_set()  # the servers are told to stop too


def test_a_stop_is_exit_code_0_while_the_worker_still_runs() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="rollout-worker")  # ends only with the stop, like run_worker
    worker.start()
    threading.Timer(0.2, stop.set).start()
    assert wait_until_stopped(stop, worker) == 0
    worker.join(timeout=5)
    assert not worker.is_alive()


def test_no_worker_waits_for_the_stop() -> None:
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert wait_until_stopped(stop, None) == 0
