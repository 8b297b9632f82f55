"""A trainer without rollout replicas says, every few seconds, what it waits for (real Redis, tiny model, in-process)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo.common.registry import ReplicaInfo
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.run import GrpoRun
from tests.support.trainer_proc import trainer_config


@pytest.fixture
def grpo_run(tmp_path: Path, redis_url: str) -> Iterator[GrpoRun]:
    config = json.loads(trainer_config(tmp_path, "waiting", redis_url, replica_wait_s=120).read_text())
    run = GrpoRun(TrainerSettings(**config), RunControl())
    run.waiting.every_s = 0.3  # 15 s in a deployment
    try:
        yield run
    finally:
        run.close()


def reports(caplog: pytest.LogCaptureFixture, needle: str, timeout: float, count: int = 1) -> list[str]:
    """The wait reports logged that contain `needle`, waiting up to `timeout` s for `count` of them."""
    deadline = time.monotonic() + timeout
    while True:
        found = [
            r.getMessage() for r in caplog.records if r.name == "grpo.trainer.waiting" and needle in r.getMessage()
        ]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_trainer_without_replicas_says_what_it_waits_for(
    grpo_run: GrpoRun, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="grpo.trainer.waiting")
    thread = threading.Thread(target=grpo_run.run, name="trainer-run")
    started = time.monotonic()
    thread.start()
    try:
        found = reports(caplog, "waiting for rollout replicas", timeout=5.0)
        took = time.monotonic() - started
        assert len(reports(caplog, "waiting for rollout replicas", timeout=2.0, count=2)) >= 2  # periodically, not once
    finally:
        grpo_run.control.request_stop()
        thread.join(timeout=60)
    assert not thread.is_alive(), "a stop request did not end the wait"
    assert found, "no wait report within 5 s"
    assert took < 5.0
    message = found[0]
    assert "0 of 1 live (the run fails after 120s)" in message, message
    assert "0 live rollout replica(s)" in message and "0 task(s) queued" in message, message
    assert f"No rollout replica is registered: is the rollout service running with --redis-url {redis_url} " \
           "--run waiting?" in message, message  # fmt: skip


def test_a_step_waiting_for_groups_reports_the_queue_and_an_idle_replica(
    grpo_run: GrpoRun, caplog: pytest.LogCaptureFixture
) -> None:
    """Tasks published, then no group: the report counts them, and once a replica is registered but takes
    nothing for idle_hint_s, it says so."""
    caplog.set_level(logging.INFO, logger="grpo.trainer.waiting")
    run = grpo_run
    run.waiting.idle_hint_s = 1.0
    run._admit()  # the first batches of tasks, as run() publishes them after the replicas joined
    in_flight = run.acct.n_in_flight
    assert in_flight >= 3
    result: list[object] = []
    collect = threading.Thread(target=lambda: result.append(run._collect()), name="collect")
    collect.start()
    try:
        found = reports(caplog, "waiting for groups", timeout=5.0)
        assert found, "no wait report within 5 s"
        assert f"step 0: waiting for groups, 0 of 3 kept, {in_flight} task(s) in flight" in found[0], found[0]
        assert f"{in_flight} task(s) queued, 0 taken by a replica" in found[0], found[0]
        assert "No rollout replica is registered" in found[0], found[0]
        # A replica that registers but never takes a task (wedged, or reading another Redis database).
        ghost = ReplicaInfo("ghost", "127.0.0.1:1", 0, "", time.time(), 0, 0, 0)
        run.registry.heartbeat(ghost)
        idle = reports(caplog, "No rollout replica has taken a task in", timeout=5.0)
        assert idle, "no idle hint within 5 s"
        assert "1 live rollout replica(s) (ghost)" in idle[0], idle[0]
    finally:
        run.control.request_stop()
        collect.join(timeout=30)
    assert result == [(None, {})]  # the stop ended the wait
