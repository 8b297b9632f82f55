"""Fault harness: a private Redis (AOF), a reward service on fixed ports that can be killed and restarted, rollout
replicas, and the run's accounting (every published task -> exactly one group after dedup, ok or failed-with-reason)."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

from grpo.common.net import free_port
from grpo.common.queue import RunQueue, connect
from grpo.local.redis_server import RedisServer
from grpo.local.services import ServiceProc, start_reward
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2
from tests.support.rollout_proc import RolloutProc, start_rollout_service

RUN = "faults"
# Fast leases and a short reward deadline so each fault plays out in seconds.
ROLLOUT_ENV = {
    "GRPO_ROLLOUT_RUN": RUN,
    "GRPO_ROLLOUT_HEARTBEAT_S": "0.3",
    "GRPO_ROLLOUT_RECLAIM_IDLE_S": "3",
    "GRPO_ROLLOUT_REGISTRY_TTL_S": "2",
    "GRPO_ROLLOUT_WORKER_BLOCK_MS": "200",
    "GRPO_ROLLOUT_REWARD_TIMEOUT_S": "3",
    "GRPO_ROLLOUT_TASK_MAX_ATTEMPTS": "3",
}
# Component statuses that mean "could not judge": such a component must never carry a score.
INFRA_STATUSES = {"error", "timeout", "sandbox_error", "unavailable"}


@dataclass
class RestartableReward:
    """`python -m grpo.reward` on fixed ports, so a restart comes back where clients expect it."""

    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    log_path: Path = field(default_factory=lambda: Path(tempfile.mkstemp(prefix="fault-reward-", suffix=".log")[1]))
    service: ServiceProc | None = None

    def __post_init__(self) -> None:
        while self.http_port == self.grpc_port:  # two free_port() calls in a row can get the same port back
            self.http_port = free_port()

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def proc(self) -> Popen[bytes]:
        assert self.service is not None, "not started"
        return self.service.proc

    def start(self, timeout: float = 60.0) -> float:
        """Start and wait for /healthz; returns the seconds it took."""
        started = time.monotonic()
        self.service = start_reward(workers=1, grpc_port=self.grpc_port, http_port=self.http_port,
                                    log_path=self.log_path, timeout_s=timeout)  # fmt: skip
        return time.monotonic() - started

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)

    def stop(self) -> None:
        if self.service is not None and self.service.child.alive():
            os.kill(self.proc.pid, signal.SIGCONT)  # a SIGSTOPped one would not see the SIGTERM
        if self.service is not None:
            self.service.stop()


def math_task(i: int, n: int = 2, max_new_tokens: int = 8) -> queue_pb2.PromptTask:
    return queue_pb2.PromptTask(
        task_id=f"t{i}",
        prompt=rollout_pb2.Prompt(text=f"What is {i} + 1?"),
        checks=reward_pb2.Checks(math=reward_pb2.MathCheck(gold=str(i + 1)), format=reward_pb2.FormatCheck()),
        sampling=rollout_pb2.SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new_tokens),
    )


class Harness:
    """One short 'run' at the rollout+reward level: publish tasks, inject faults, collect and account."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "redis").mkdir()
        self.redis = RedisServer(appendonly=True, data_dir=tmp / "redis")
        self.redis.start()
        self.reward = RestartableReward()
        self.reward.start()
        self.queue = RunQueue(connect(self.redis.url), RUN)
        self.queue.ensure_groups()
        self.replicas: list[RolloutProc] = []
        self.published: list[str] = []
        self.groups: dict[str, list[queue_pb2.GroupRecord]] = {}

    def add_replica(self, name: str) -> RolloutProc:
        args = ("--redis-url", self.redis.url, "--reward-addr", self.reward.grpc_addr, "--replica-id", name,
                "--advertise-host", "127.0.0.1")  # fmt: skip
        proc = start_rollout_service(*args, log_dir=self.tmp, env=ROLLOUT_ENV)
        self.replicas.append(proc)
        return proc

    def publish(self, tasks: list[queue_pb2.PromptTask]) -> None:
        self.queue.publish_tasks(tasks)
        self.published += [t.task_id for t in tasks]

    def collect(self, timeout: float = 120.0) -> dict[str, list[queue_pb2.GroupRecord]]:
        """Read (and ack) groups until every published task has one; rides out a Redis outage."""
        from grpo.common.queue import QueueUnavailable

        deadline = time.monotonic() + timeout
        while not set(self.published) <= self.groups.keys():
            missing = sorted(set(self.published) - self.groups.keys())
            assert time.monotonic() < deadline, f"groups missing after {timeout}s: {missing[:10]}"
            try:
                entries = self.queue.read_groups("fault-trainer", count=50, block_ms=200)
                for entry in entries:
                    assert entry.message is not None
                    self.groups.setdefault(entry.message.group_id, []).append(entry.message)
                self.queue.ack_groups([e.entry_id for e in entries])
            except QueueUnavailable:
                time.sleep(0.2)
        return self.groups

    def account(self) -> dict[str, int]:
        """Assert the run's accounting; returns counts of ok / failed groups and duplicates seen."""
        assert sorted(self.groups) == sorted(set(self.published)), "a group for a task never published, or a lost one"
        counts = {"ok": 0, "failed": 0, "duplicates": 0}
        for gid, records in self.groups.items():
            counts["duplicates"] += len(records) - 1
            group = records[0]  # what the trainer keeps: the first one, by group id
            assert group.task_id == gid
            if group.status == "ok":
                counts["ok"] += 1
                for sample in group.samples:
                    for name, comp in sample.components.items():
                        if comp.status in INFRA_STATUSES:
                            assert not comp.HasField("score"), f"{gid}: {name} {comp.status} was scored {comp.score}"
            else:
                counts["failed"] += 1
                assert group.status == "failed" and group.error, f"{gid}: a drop without a reason"
                assert not any(s.HasField("reward") for s in group.samples), f"{gid}: failed group carries rewards"
        assert self.queue.stats()["tasks"].unacked == 0, "a task still pending or undelivered"
        return counts

    def close(self) -> None:
        for proc in self.replicas:
            proc.stop()
        self.reward.stop()
        self.reward.log_path.unlink(missing_ok=True)
        self.redis.close()
