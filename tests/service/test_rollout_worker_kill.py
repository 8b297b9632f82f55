"""SIGKILL a rollout replica mid-task: another replica reclaims the task and completes it; no group is lost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from grpo.common.queue import TASKS_GROUP, RunQueue, connect
from grpo.common.registry import ReplicaRegistry
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2
from tests.support.polling import wait_until
from tests.support.rollout_proc import RolloutProc, start_rollout_service

pytestmark = pytest.mark.slow

RUN = "killtest"
# Fast leases so the test takes seconds: renew every 0.3 s, reclaim after 3 s of silence.
WORKER_ENV = {
    "GRPO_ROLLOUT_RUN": RUN,
    "GRPO_ROLLOUT_HEARTBEAT_S": "0.3",
    "GRPO_ROLLOUT_RECLAIM_IDLE_S": "3",
    "GRPO_ROLLOUT_REGISTRY_TTL_S": "2",
    "GRPO_ROLLOUT_WORKER_BLOCK_MS": "200",
}


def task(task_id: str, n: int, max_new_tokens: int) -> queue_pb2.PromptTask:
    return queue_pb2.PromptTask(
        task_id=task_id,
        prompt=rollout_pb2.Prompt(text="What is 3 + 4?"),
        checks=reward_pb2.Checks(math=reward_pb2.MathCheck(gold="7")),
        sampling=rollout_pb2.SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new_tokens),
    )


def replica(name: str, redis_url: str, reward_addr: str, log_dir: Path) -> RolloutProc:
    args = ("--redis-url", redis_url, "--reward-addr", reward_addr, "--replica-id", name)
    return start_rollout_service(*args, log_dir=log_dir, env=WORKER_ENV)


def test_killed_replica_task_is_reclaimed_and_completed(redis_url: str, live_reward: Any, tmp_path: Path) -> None:
    queue = RunQueue(connect(redis_url), RUN)
    queue.ensure_groups()
    registry = ReplicaRegistry(connect(redis_url), RUN)
    a = replica("replica-a", redis_url, live_reward.grpc_addr, tmp_path)
    b: RolloutProc | None = None
    try:
        wait_until(lambda: [r for r in registry.live_replicas() if r.replica_id == "replica-a"], 30, "replica-a")
        # Slow enough (64 samples × 440 tokens on one CPU thread) that it is still running when we kill it.
        queue.publish_tasks([task("slow", n=64, max_new_tokens=440)])
        owner = wait_until(
            lambda: queue.client.xpending_range(queue.tasks_key, TASKS_GROUP, "-", "+", 10), 10, "pickup"
        )
        assert owner[0]["consumer"] == b"replica-a"
        time.sleep(0.5)  # mid-generation
        a.proc.kill()
        a.proc.wait(10)
        assert queue.stats()["groups"].length == 0, "replica-a finished before the kill: make the task slower"
        assert queue.stats()["tasks"].pending == 1  # killed: never acked
        queue.publish_tasks([task(f"t{i}", n=2, max_new_tokens=8) for i in range(3)])
        b = replica("replica-b", redis_url, live_reward.grpc_addr, tmp_path)
        ids = {"slow", "t0", "t1", "t2"}
        found: dict[str, list[queue_pb2.GroupRecord]] = {}

        def all_groups() -> bool:
            for entry in queue.read_groups("test-trainer", count=50, block_ms=200):
                assert entry.message is not None
                found.setdefault(entry.message.group_id, []).append(entry.message)
            return ids <= found.keys()

        wait_until(all_groups, 90, "every task's group")
        assert sorted(found) == sorted(ids)  # every published task came back, nothing else
        deduped = {gid: groups[0] for gid, groups in found.items()}  # what the trainer keeps
        assert len(deduped) == len(ids)
        slow = deduped["slow"]
        assert (slow.status, slow.replica_id, len(slow.samples)) == ("ok", "replica-b", 64)
        assert all(s.HasField("reward") or s.components for s in slow.samples)
        assert queue.stats()["tasks"].unacked == 0
        assert "reclaimed 1 idle task" in b.log_text()
        wait_until(lambda: [r.replica_id for r in registry.live_replicas()] == ["replica-b"], 10, "a to expire")
    finally:
        for proc in (a, b):
            if proc is not None:
                proc.stop()
