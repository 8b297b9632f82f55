"""Faults on a real GRPO run (trainer + rollout + reward + Redis): a stalled trainer cannot grow Redis or the
rollout without bound, a hung rollout engine is detected, its tasks reclaimed, the books balanced, and a trainer
SIGKILLed mid-run trains its first step after the restart.

(SIGKILL + `--resume auto` with a lost lineage's groups in Redis, and a Redis restart under the trainer, are in
tests/service/test_trainer_service.py.)"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from grpo.common.queue import TASKS_GROUP, RunQueue, connect
from grpo.local.redis_server import RedisServer
from grpo.trainer.ledger import read_ledger
from tests.support.faults_harness import RestartableReward
from tests.support.load import rss_mb
from tests.support.rollout_proc import RolloutProc, start_rollout_service
from tests.support.trainer_proc import ROLLOUT_ENV, colocated, read_metrics, start_trainer, trainer_config, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]
log = logging.getLogger(__name__)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A private Redis with AOF and a reward service; replicas are started by each test."""
    (tmp_path / "redis").mkdir()
    server = RedisServer(appendonly=True, data_dir=tmp_path / "redis").start()
    reward = RestartableReward()
    reward.start()
    replicas: list[RolloutProc] = []

    def replica(run: str, name: str) -> RolloutProc:
        args = ("--redis-url", server.url, "--reward-addr", reward.grpc_addr, "--replica-id", name,
                "--advertise-host", "127.0.0.1")  # fmt: skip
        proc = start_rollout_service(*args, log_dir=tmp_path, env={**ROLLOUT_ENV, "GRPO_ROLLOUT_RUN": run})
        replicas.append(proc)
        return proc

    try:
        yield {"redis": server, "reward": reward, "replica": replica, "tmp": tmp_path}
    finally:
        for proc in replicas:
            if proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGCONT)
            proc.stop()
        reward.stop()
        reward.log_path.unlink(missing_ok=True)
        server.close()


def _balanced(out: Path) -> dict[str, Any]:
    rows = read_metrics(out)
    assert rows and all(r["tasks/balanced"] == 1.0 for r in rows), rows[-1:]
    assert rows[-1]["tasks/in_flight"] == 0
    ledger = read_ledger(out / "ledger")
    ids = [e["task_id"] for e in ledger]
    assert len(ids) == len(set(ids)), "a task resolved twice"
    return rows[-1]


def test_stalled_trainer_cannot_grow_redis_or_the_rollout(stack: dict[str, Any]) -> None:
    tmp, run = stack["tmp"], "stall"
    replica = stack["replica"](run, "stall-r1")
    config = trainer_config(tmp, run, stack["redis"].url, steps=8, checkpoint_every=4, max_staleness=1)
    trainer_log = tmp / "trainer.log"
    proc = start_trainer(config, trainer_log)
    client = redis.Redis.from_url(stack["redis"].url)
    queue = RunQueue(connect(stack["redis"].url), run)
    try:
        wait_for(lambda: len(read_metrics(tmp / "out")) >= 2, 150, "two steps", proc, trainer_log)
        proc.send_signal(signal.SIGSTOP)
        samples = []
        for _ in range(24):  # 12 s stalled: the rollout finishes what was admitted, then idles
            stats = queue.stats()
            samples.append(
                (stats["tasks"].unacked, stats["groups"].unacked, stats["tasks"].length + stats["groups"].length,
                 client.info("memory")["used_memory"], rss_mb(replica.proc.pid))
            )  # fmt: skip
            time.sleep(0.5)
        proc.send_signal(signal.SIGCONT)
        assert proc.wait(timeout=200) == 0, trainer_log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    # Admission: at most (max_staleness + 1) batches of prompts_per_step (3) tasks, plus refills, outstanding.
    bound = (1 + 1) * 3 * 3
    outstanding = max(s[0] + s[1] for s in samples)
    half = samples[len(samples) // 2]
    length_growth, mem_growth, rss_growth = (samples[-1][i] - half[i] for i in (2, 3, 4))
    log.info("stalled trainer 12s: outstanding tasks+groups <= %d (bound %d), stream entries %d (%+d over the "
             "last 6s), redis used_memory %+d B, rollout rss %+.1f MiB", outstanding, bound, samples[-1][2],
             length_growth, mem_growth, rss_growth)  # fmt: skip
    assert outstanding <= bound
    assert length_growth == 0, "streams still growing after the admitted work was done"
    assert mem_growth < 1 << 20 and rss_growth < 50
    _balanced(tmp / "out")
    assert read_metrics(tmp / "out")[-1]["step"] == 8


def test_hung_engine_is_reclaimed_and_the_run_finishes(stack: dict[str, Any]) -> None:
    tmp, run = stack["tmp"], "hang"
    hung = stack["replica"](run, "hang-r1")
    healthy = stack["replica"](run, "hang-r2")
    config = trainer_config(tmp, run, stack["redis"].url, steps=10, checkpoint_every=5, push_timeout_s=5,
                            max_new_tokens=96, stop=[])  # fmt: skip
    trainer_log = tmp / "trainer.log"
    queue = RunQueue(connect(stack["redis"].url), run)
    proc = start_trainer(config, trainer_log)

    def hung_holds_a_task() -> bool:
        rows = queue.client.xpending_range(queue.tasks_key, TASKS_GROUP, "-", "+", 20)
        return any(r["consumer"] == b"hang-r1" for r in rows)

    try:
        wait_for(hung_holds_a_task, 120, "hang-r1 to hold a task", proc, trainer_log)
        hung.proc.send_signal(signal.SIGSTOP)  # its engine, heartbeats and leases all freeze
        stopped_at = time.monotonic()
        wait_for(lambda: "reclaimed" in healthy.log_text(), 60, "the hung replica's tasks to be reclaimed", proc,
                 trainer_log)  # fmt: skip
        reclaimed_s = time.monotonic() - stopped_at
        time.sleep(2)
        hung.proc.send_signal(signal.SIGCONT)  # it wakes up with stale leases: its late results must not count
        assert proc.wait(timeout=200) == 0, trainer_log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    # Woken up, the hung replica finishes its stale batch and must drop it rather than write a second group.
    deadline = time.monotonic() + 60
    while "dropping result of task" not in hung.log_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "dropping result of task" in hung.log_text(), hung.log_text()[-3000:]
    log.info("hung engine: tasks reclaimed %.1fs after the hang (reclaim_idle_s=5)", reclaimed_s)
    assert reclaimed_s < 5 + 10
    last = _balanced(tmp / "out")
    assert last["step"] == 10


def _run_with_fault(
    stack: dict[str, Any], run: str, inject: Any, steps: int = 24, holder: bytes | None = None
) -> dict[str, Any]:
    """A short GRPO run on two replicas; `inject(replicas)` is called once `holder` (or any replica) holds a task.

    24 steps: on an idle machine a step takes ~0.25 s, and 8 steps could end before the test saw
    the replica holding a task (the fault must land mid-run, not after it).
    """
    tmp = stack["tmp"]
    replicas = [stack["replica"](run, f"{run}-r1"), stack["replica"](run, f"{run}-r2")]
    config = trainer_config(tmp, run, stack["redis"].url, steps=steps, checkpoint_every=4, push_timeout_s=5,
                            max_new_tokens=64, stop=[])  # fmt: skip
    trainer_log = tmp / "trainer.log"
    queue = RunQueue(connect(stack["redis"].url), run)
    proc = start_trainer(config, trainer_log)
    try:
        wait_for(lambda: len(read_metrics(tmp / "out")) >= 1, 150, "a step", proc, trainer_log)

        def in_flight() -> bool:
            rows = queue.client.xpending_range(queue.tasks_key, TASKS_GROUP, "-", "+", 20)
            return any(holder in (None, r["consumer"]) for r in rows)

        wait_for(in_flight, 90, "work in flight", proc, trainer_log)
        inject(replicas)
        assert proc.wait(timeout=240) == 0, trainer_log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    last = _balanced(tmp / "out")
    assert last["step"] == steps
    return last


def test_reward_sigkill_and_restart_under_a_trainer(stack: dict[str, Any]) -> None:
    reward: RestartableReward = stack["reward"]
    timing: dict[str, float] = {}

    def inject(replicas: list[RolloutProc]) -> None:
        reward.signal(signal.SIGKILL)
        time.sleep(1.0)
        timing["restart_s"] = reward.start()

    last = _run_with_fault(stack, "rkill", inject)
    ledger = read_ledger(stack["tmp"] / "out" / "ledger")
    drops = {e["outcome"] for e in ledger if e["outcome"] != "trained"}
    log.info("reward SIGKILL under a trainer: restart %.1fs; ledger %d tasks, drops %s", timing["restart_s"],
             len(ledger), sorted(drops))  # fmt: skip
    # An outage is never a reward: what the rollout could not score comes back failed and is dropped as such.
    assert drops <= {"failed", "unscored", "zero_variance", "timeout"}, drops
    assert last["tasks/in_flight"] == 0


def test_replica_sigkill_under_a_trainer(stack: dict[str, Any]) -> None:
    def inject(replicas: list[RolloutProc]) -> None:
        replicas[0].proc.kill()
        replicas[0].proc.wait(10)

    _run_with_fault(stack, "rpkill", inject, holder=b"rpkill-r1")


@pytest.mark.parametrize("mode", ["separate", "colocated"])
def test_a_trainer_killed_mid_run_trains_its_first_step_after_resume(stack: dict[str, Any], mode: str) -> None:
    """Issue 34's case: SIGKILLed after step 21 (max_staleness 1, a checkpoint every 5 steps, 16 prompts a step), the
    resumed trainer's step 21 was reported to drop every group as stale: a step with no update. Every group is
    trainable here (no zero-variance skip), so the first step after the resume must train on the groups the restart
    kept, and no step of the run may drop a group as stale. Colocated, the replica dies with the trainer, holding
    tasks its successor reclaims."""
    tmp, run = stack["tmp"], "tkill"
    extra = {"colocate": colocated(stack["reward"].grpc_addr)} if mode == "colocated" else {}
    if mode == "separate":
        stack["replica"](run, f"{run}-r1")
    steps, kill_after, per_step = 26, 21, 16
    config = trainer_config(tmp, run, stack["redis"].url, steps=steps, checkpoint_every=5, max_staleness=1,
                            prompts_per_step=per_step, skip_zero_variance=False, **extra)  # fmt: skip
    out, trainer_log = tmp / "out", tmp / "trainer.log"
    proc = start_trainer(config, trainer_log)
    try:
        wait_for(lambda: any(r["step"] >= kill_after for r in read_metrics(out)), 240, f"step {kill_after}", proc,
                 trainer_log)  # fmt: skip
        proc.kill()
        proc.wait(10)
        killed_at = max(r["step"] for r in read_metrics(out))
        proc = start_trainer(config, trainer_log)
        assert proc.wait(timeout=240) == 0, trainer_log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step of the surviving lineage once
    resumed = rows[20]  # step 21: the first after the checkpoint of step 20
    log.info("trainer SIGKILL after step %d: the resumed step %d trained %d groups; stale %d, duplicates %d, "
             "superseded %d, regenerated %d", killed_at, resumed["step"], resumed["groups/train"],
             resumed["groups/stale"], resumed["groups/duplicate"], resumed["groups/superseded"],
             resumed["groups/regenerate"])  # fmt: skip
    assert "train/loss" in resumed and resumed["groups/train"] > 0 and resumed["groups/stale"] == 0, resumed
    idle_or_stale = [(r["step"], r["groups/stale"]) for r in rows if "train/loss" not in r or r["groups/stale"]]
    assert not idle_or_stale, idle_or_stale
    last = _balanced(out)
    assert last["tasks/published"] == steps * per_step and last["tasks/dropped/stale"] == 0, last
