"""A multi-turn episode with a tool call through `docker compose`: the three images, Redis, the shipped compose file.

Needs a Docker engine with the images built (`make test-compose` builds them first). An override file mounts a
tiny model that calls the python tool (tests/support/tool_model.py: `<code>print(6*7)</code>`, then
`<answer>42</answer>` after the result) into rollout and trainer, and runs the trainer on a config with
`tools: [python]` and `python_session: true` for two GRPO steps. The checks: the trainer exits 0, its metrics show
evaluation episodes of three turns whose two tool calls (the second printing what the first set) succeeded and
whose answer was right, and the reward service's own counter shows the
calls were executed by its sandbox over gRPC (Execute), the path the chart's NetworkPolicies keep open.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import yaml

from grpo.common.net import free_port
from tests.support.compose_episode import GROUP_SIZE, PROMPTS_PER_STEP, STEPS, episode_files, override
from tests.support.compose_project import REPO, ComposeProject

pytestmark = pytest.mark.compose
PROJECT = "grpocomposeepisode"
TOKEN = "compose-episode-s3cret"


@dataclass
class Stack(ComposeProject):
    reward_port: int  # the reward service's published HTTP port (its /metrics)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("compose-episode")
    model, folder = episode_files(root)
    override_file = root / "override.yml"
    override_file.write_text(yaml.safe_dump(override(model, folder)))
    reward_port, trainer_port = free_port(), free_port()
    env = {**os.environ, "GRPO_API_TOKEN": TOKEN, "GRPO_REWARD_HTTP_PORT": str(reward_port),
           "GRPO_TRAINER_HTTP_PORT": str(trainer_port), "GRPO_RUN_ID": "episode", "COMPOSE_PROFILES": "cpu"}  # fmt: skip
    s = Stack(PROJECT, [REPO / "docker-compose.yml", override_file], env, reward_port)
    s.compose("down", "-v", "--remove-orphans", check=False)
    try:
        s.compose("up", "-d")
        yield s
    finally:
        s.compose("down", "-v", "--remove-orphans", check=False)


def execute_calls(reward_port: int) -> float:
    """The reward service's count of gRPC Execute calls answered OK (its /metrics is open without the token)."""
    text = httpx.get(f"http://127.0.0.1:{reward_port}/metrics", timeout=10).text
    prefix = "grpo_reward_requests_total{"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and 'endpoint="grpc/Execute"' in line and 'code="OK"' in line
    )


def test_an_episode_calls_the_python_tool_in_the_reward_sandbox(stack: Stack) -> None:
    assert stack.wait_exit("trainer", timeout=900) == 0, stack.logs("trainer") + stack.logs("rollout")
    rows = [json.loads(line) for line in stack.read_file("trainer", "/checkpoints/metrics.jsonl").splitlines()]
    evals = [r for r in rows if "eval/tool_calls_mean" in r]
    steps = [r for r in rows if "rollout/tool_calls_mean" in r]
    assert len(evals) == 2 and len(steps) == STEPS, rows  # before GRPO and at its last step; every step
    for r in evals:  # greedy, a python session: x = 6*7, then print(x) printed 42; the model read it and answered
        assert (r["eval/tool_calls_mean"], r["eval/tool_success_rate"], r["eval/turns_mean"]) == (2.0, 1.0, 3.0), r
        assert r["eval/accuracy"] == 1.0 and r["eval/episode_end/answer"] == 1.0, r
        assert r["eval/env_token_share"] > 0.0, r  # the result's tokens are in the episode (masked out of the loss)
    for r in steps:  # sampled at T=1: most episodes call the tool; a sampled program may fail (the model sees why)
        assert r["rollout/tool_calls_mean"] >= 0.5 and r["rollout/tool_success_rate"] >= 0.5, r
    last = rows[-1]
    assert last["step"] == STEPS and last["tasks/balanced"] == 1.0, last
    episodes = PROMPTS_PER_STEP * GROUP_SIZE
    # A malformed call is answered by the runner itself, without the sandbox: it is no Execute call.
    expected = sum(r["rollout/tool_calls_mean"] * episodes - r["rollout/malformed_calls"] for r in steps) + sum(
        r["eval/tool_calls_mean"] * r["eval/completed"] for r in evals
    )
    calls = execute_calls(stack.reward_port)
    assert calls >= round(expected), f"the reward service ran {calls} Execute calls; the episodes made {expected}"
