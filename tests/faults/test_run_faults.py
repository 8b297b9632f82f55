"""Faults injected mid-run at the rollout+reward level (real processes, real Redis with AOF): nothing is lost,
nothing counts twice after dedup, drops carry a reason, no reward comes from an infrastructure error."""

from __future__ import annotations

import logging
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo.common.queue import TASKS_GROUP
from tests.support.faults_harness import Harness, math_task
from tests.support.polling import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow]
log = logging.getLogger(__name__)
REWARD_TIMEOUT_S = 3.0  # harness.ROLLOUT_ENV


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


def _groups_done(run: Harness) -> int:
    return run.queue.stats()["groups"].length + len(run.groups)


def test_reward_sigkill_and_restart_mid_run(run: Harness) -> None:
    run.add_replica("r1")
    run.publish([math_task(i) for i in range(10)])
    wait_until(lambda: _groups_done(run) >= 2, 60, "the run to be under way")
    run.reward.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    time.sleep(6.0)  # a slow restart: longer than the old 5-attempt retry loop (~3.75 s) could ride out
    restart_s = run.reward.start()
    run.publish([math_task(i) for i in range(10, 14)])
    run.collect(timeout=120)
    counts = run.account()
    log.info("reward SIGKILL: restart %.1fs, back to scoring after %.1fs; %s", restart_s,
             time.monotonic() - killed_at, counts)  # fmt: skip
    # The client's retry budget (30 s) outlasts a restart: the batch in flight is scored once the service is back,
    # nothing is dropped, and the outage is never a reward (account() checked that).
    failed = {gid: records[0].error for gid, records in run.groups.items() if records[0].status == "failed"}
    assert not failed, failed
    assert counts["ok"] == 14


def test_reward_hang_is_detected_within_its_deadline_and_the_run_goes_on(run: Harness) -> None:
    replica = run.add_replica("r1")
    run.publish([math_task(i) for i in range(4)])
    run.collect(timeout=60)
    run.reward.signal(signal.SIGSTOP)  # alive, port open, answering nothing: the worst kind of hang
    stopped_at = time.monotonic()
    run.publish([math_task(i) for i in range(4, 8)])
    wait_until(lambda: "DEADLINE_EXCEEDED" in replica.log_text(), REWARD_TIMEOUT_S + 10, "the hang to be reported")
    detected_s = time.monotonic() - stopped_at
    time.sleep(max(0.0, 2 * REWARD_TIMEOUT_S - detected_s))
    run.reward.signal(signal.SIGCONT)
    run.publish([math_task(i) for i in range(8, 12)])
    run.collect(timeout=120)
    counts = run.account()
    log.info("reward SIGSTOP: detected after %.1fs (deadline %.1fs); %s", detected_s, REWARD_TIMEOUT_S, counts)
    assert detected_s < REWARD_TIMEOUT_S + 5
    for gid, records in run.groups.items():
        if records[0].status == "failed":
            assert re.search("reward|DEADLINE", records[0].error), (gid, records[0].error)
    assert all(run.groups[f"t{i}"][0].status == "ok" for i in range(8, 12)), "the run did not recover"


def test_rollout_replica_sigkill_mid_batch(run: Harness) -> None:
    a = run.add_replica("ra")
    run.publish([math_task(i, n=8, max_new_tokens=200) for i in range(6)])
    wait_until(lambda: run.queue.client.xpending_range(run.queue.tasks_key, TASKS_GROUP, "-", "+", 10), 30, "pick-up")
    time.sleep(0.5)  # mid-generation
    a.proc.kill()
    a.proc.wait(10)
    killed_at = time.monotonic()
    pending = run.queue.stats()["tasks"].pending
    assert pending >= 1, "nothing was in flight at the kill"
    b = run.add_replica("rb")
    run.collect(timeout=180)
    counts = run.account()
    log.info("replica SIGKILL: %d pending reclaimed, all groups after %.1fs; %s", pending,
             time.monotonic() - killed_at, counts)  # fmt: skip
    assert counts["failed"] == 0 and "reclaimed" in b.log_text()


def test_redis_restart_with_aof_mid_run(run: Harness) -> None:
    replicas = [run.add_replica("r1"), run.add_replica("r2")]
    run.publish([math_task(i, n=4, max_new_tokens=32) for i in range(12)])
    wait_until(lambda: _groups_done(run) >= 2, 60, "the run to be under way")
    time.sleep(1.2)  # everysec fsync: what was published is on disk
    run.redis.kill()
    down_at = time.monotonic()
    time.sleep(2.0)
    run.redis.start()
    run.publish([math_task(i, n=2) for i in range(12, 16)])
    run.collect(timeout=180)
    counts = run.account()
    log.info("redis restart: all groups %.1fs after the kill; %s", time.monotonic() - down_at, counts)
    assert counts["failed"] == 0
    assert all(r.proc.poll() is None for r in replicas), "a replica died of the outage"
    assert all("redis unavailable" in r.log_text() or "redis" in r.log_text().lower() for r in replicas)
