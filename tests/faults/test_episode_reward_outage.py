"""The reward service (the python tool's sandbox) down in the middle of tool episodes: a tool call that could not
run is never a result the model sees and never a reward; the task is retried once the service is back, or its
group is written `failed` with the reason; the books balance (every task one group, nothing pending)."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo.common.tiny_model import cache_root
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2
from tests.support import tool_model as tm
from tests.support.faults_harness import ROLLOUT_ENV, Harness
from tests.support.polling import wait_until
from tests.support.rollout_proc import RolloutProc, start_rollout_service

pytestmark = [pytest.mark.faults, pytest.mark.slow]
log = logging.getLogger(__name__)


def tool_task(i: int) -> queue_pb2.PromptTask:
    return queue_pb2.PromptTask(
        task_id=f"e{i}",
        prompt=rollout_pb2.Prompt(text=tm.TOOL_PROMPT),
        checks=reward_pb2.Checks(math=reward_pb2.MathCheck(gold="42")),
        sampling=rollout_pb2.SamplingParams(n=2, temperature=0.0, max_new_tokens=40),
        episode=queue_pb2.EpisodeSpec(tools=["python"], tool_format="tagged", max_turns=3, max_tool_calls=2,
                                      max_total_tokens=120, max_tool_output_chars=200, tool_timeout_s=5.0),
    )  # fmt: skip


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


def tool_replica(run: Harness, **env: str) -> RolloutProc:
    """A replica on the tool model, its worker on the harness's Redis and reward service."""
    model = tm.tool_model_path(cache_root() / "test-models")
    args = ("--redis-url", run.redis.url, "--reward-addr", run.reward.grpc_addr, "--replica-id", "r1",
            "--advertise-host", "127.0.0.1", "--model", str(model))  # fmt: skip
    proc = start_rollout_service(*args, log_dir=run.tmp, env={**ROLLOUT_ENV, **env})
    run.replicas.append(proc)
    return proc


def assert_real_tool_results(run: Harness) -> None:
    """Every ok group's episodes got the sandbox's real output, never an error made of the outage."""
    for gid, (group, *_) in run.groups.items():
        if group.status != "ok":
            continue
        for sample in group.samples:
            assert "<output>42</output>" in sample.completion.text, (gid, sample.completion.text)
            assert "Error" not in sample.completion.text, (gid, sample.completion.text)
            assert (sample.episode.tool_calls, sample.episode.tool_errors) == (1, 0)
            assert sample.reward == 1.0


def test_a_tool_call_waits_out_a_reward_restart(run: Harness) -> None:
    """SIGKILL the reward service; episodes then reach their tool call with it down (turn 1 done, the call
    pending); it is back within the client's retry budget: the same calls run and the episodes finish."""
    replica = tool_replica(run)
    run.publish([tool_task(0)])
    run.collect(timeout=60)  # under way, on a live reward service
    run.reward.signal(signal.SIGKILL)
    run.publish([tool_task(i) for i in range(1, 4)])
    wait_until(lambda: "Execute to" in replica.log_text(), 60, "a tool call to meet the outage")
    time.sleep(3.0)
    run.reward.start()
    run.collect(timeout=120)
    counts = run.account()
    assert counts == {"ok": 4, "failed": 0, "duplicates": 0}, counts
    assert_real_tool_results(run)


def test_a_tool_call_that_cannot_run_fails_the_group_and_never_reaches_the_model(run: Harness) -> None:
    """Down for longer than every retry: each task is tried task_max_attempts times, then its group is written
    `failed` with the reason, without samples or rewards; the replica serves again once the service is back."""
    replica = tool_replica(run, GRPO_ROLLOUT_REWARD_RETRY_BUDGET_S="1", GRPO_ROLLOUT_TASK_MAX_ATTEMPTS="2")
    run.reward.signal(signal.SIGKILL)
    run.publish([tool_task(i) for i in range(2)])
    run.collect(timeout=120)
    for gid in ("e0", "e1"):
        (group,) = run.groups[gid]
        assert group.status == "failed", (gid, group)
        assert "ToolInfrastructureError" in group.error and "reward service" in group.error, group.error
        assert not group.samples
    assert "Execute to" in replica.log_text()
    run.reward.start()
    run.publish([tool_task(i) for i in range(2, 4)])
    run.collect(timeout=120)
    counts = run.account()
    assert counts == {"ok": 2, "failed": 2, "duplicates": 0}, counts
    assert_real_tool_results(run)
