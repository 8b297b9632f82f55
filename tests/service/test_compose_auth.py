"""The environment docker-compose.yml gives the services, as Compose resolves it with and without the
token variables set, authenticates end to end: real reward and rollout processes, a real Redis with the ACL file
init-secrets writes, the trainer's weight push with the trainer's resolved settings, and the README's verifier call.

With nothing set, every service still requires a token (the one init-secrets generated) and Redis a password.
Only the addresses change (compose's service names become loopback ports); every token, password and run name
is exactly what the containers get, read from the files deploy/compose/secrets.sh writes as the container does.
`make test-compose` runs the same through Docker itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from grpo.common.net import free_port
from grpo.common.queue import RunQueue, connect
from grpo.local.procs import Child, launch
from grpo.local.redis_server import find_redis_server
from grpo.trainer.config import parse_settings as trainer_settings
from grpo.trainer.pusher import push_to_replicas
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2
from tests.support.compose_env import compose_env, local_secret_paths, write_secrets
from tests.support.rollout_proc import RolloutProc, perturbed, start_rollout_service, tiny_model_weights

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CASES = {
    "nothing set": {},
    "one API token": {"GRPO_API_TOKEN": "api-s3cret"},
    "API and weights tokens": {"GRPO_API_TOKEN": "api-s3cret", "GRPO_WEIGHTS_TOKEN": "w-s3cret"},
}
ADDRESSES = ("GRPO_CACHE_DIR", "HF_HOME", "GRPO_ROLLOUT_REWARD_ADDR")


def addition_task(task_id: str) -> queue_pb2.PromptTask:
    return queue_pb2.PromptTask(
        task_id=task_id, policy_version=0, prompt=rollout_pb2.Prompt(text="002+003="), task_type="math",
        checks=reward_pb2.Checks(math=reward_pb2.MathCheck(gold="5"), format=reward_pb2.FormatCheck()),
        sampling=rollout_pb2.SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=1),
    )  # fmt: skip


def one_group(queue: RunQueue, timeout: float = 90.0) -> queue_pb2.GroupRecord:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in queue.read_groups("test-trainer", count=1, block_ms=500):
            assert entry.message is not None
            return entry.message
    raise AssertionError(f"no group within {timeout}s")


def service_env(service: str, variables: dict[str, str], secrets: Path) -> dict[str, str]:
    env = {k: v for k, v in compose_env(service, variables).items() if k not in ADDRESSES}
    return local_secret_paths(env, secrets)


def can_ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture
def compose_redis(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], tuple[Path, str]]]:
    """`start(variables)`: init-secrets' files for these variables, and a redis-server as compose runs it (with
    the ACL file); the URL file then points at its loopback port. Returns (secrets root, Redis URL)."""
    started: list[Child] = []

    def start(variables: dict[str, str]) -> tuple[Path, str]:
        secrets = write_secrets(tmp_path / "secrets", variables)
        port = free_port()
        url_file = secrets / "redis" / "url"
        url = url_file.read_text().strip().replace("@redis:6379/", f"@127.0.0.1:{port}/")
        url_file.chmod(0o644)
        url_file.write_text(url)
        cmd = [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path),
               "--aclfile", str(secrets / "redis" / "users.acl")]  # fmt: skip
        started.append(launch("redis-server", cmd, tmp_path / "redis.log", lambda: can_ping(url), timeout_s=20))
        return secrets, url

    yield start
    for child in started:
        child.stop(grace_s=5.0)


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GRPO_* variable of the test runner reaches the services: only compose's."""
    for name in list(os.environ):
        if name.startswith("GRPO_") and name != "GRPO_CACHE_DIR":
            monkeypatch.delenv(name)
    yield


@pytest.mark.parametrize("case", list(CASES))
def test_compose_environment_authenticates_end_to_end(
    case: str,
    compose_redis: Callable[[dict[str, str]], tuple[Path, str]],
    tmp_path: Path,
    clean_environ: None,
    monkeypatch: pytest.MonkeyPatch,
    start_reward: Callable[..., Any],
) -> None:
    variables = CASES[case]
    secrets, redis_url = compose_redis(variables)
    api = (secrets / "api" / "token").read_text()
    assert api == variables.get("GRPO_API_TOKEN", api) and len(api) >= 10  # the operator's, else a generated one
    # Redis: nothing without the password (the reward container has no network to it, and no password).
    assert not can_ping(redis_url.replace(redis_url.split("@")[0] + "@", "redis://"))
    reward = start_reward(workers=1, env=service_env("reward", variables, secrets))
    rollout: RolloutProc | None = None
    try:
        # The README's verifier call: refused without the token, answered with it.
        body = {"answer": "<answer>\\frac{1}{2}</answer>", "gold": "0.5"}
        bare = httpx.post(f"{reward.http_url}/v1/verify/math", json=body, timeout=30)
        assert bare.status_code == 401, bare.text
        good = httpx.post(f"{reward.http_url}/v1/verify/math", json=body, timeout=30,
                          headers={"authorization": f"Bearer {api}"})  # fmt: skip
        assert good.status_code == 200 and good.json()["correct"] is True

        env = {**service_env("rollout", variables, secrets), "GRPO_ROLLOUT_REWARD_ADDR": reward.grpc_addr,
               "GRPO_ROLLOUT_HEARTBEAT_S": "0.5"}  # fmt: skip
        rollout = start_rollout_service(log_dir=tmp_path, env=env)

        # The trainer's weight push, with the token the trainer's resolved settings carry.
        for name, value in service_env("trainer", variables, secrets).items():
            monkeypatch.setenv(name, value)
        trainer = trainer_settings(["--config", str(REPO / "deploy/compose/trainer.yaml"),
                                    "--train-data", str(REPO / "k8s/grpo/files/train.jsonl")])  # fmt: skip
        assert trainer.redis_url == redis_url
        weights = perturbed(tiny_model_weights(), seed=3)
        (pushed,) = push_to_replicas([rollout.target], weights, 5, token=trainer.weights_token, timeout_s=60)
        assert pushed.ok, pushed.error
        # and a push without the token is refused (the weights stay)
        (refused,) = push_to_replicas([rollout.target], weights, 6, token=None, timeout_s=60, retries=0)
        assert not refused.ok and "UNAUTHENTICATED" in refused.error
        assert rollout.healthz()["weight_version"] == 5

        # A task through Redis comes back scored by the reward service (rollout → reward auth).
        queue = RunQueue(connect(redis_url), env["GRPO_ROLLOUT_RUN"])
        queue.ensure_groups()
        queue.publish_tasks([addition_task("auth-1")])
        group = one_group(queue)
        assert (group.task_id, group.status, group.error) == ("auth-1", "ok", "")
        assert group.weight_version == 5 and all(s.components for s in group.samples)
    finally:
        if rollout is not None:
            rollout.stop()


def test_the_interpolation_matches_compose_rules() -> None:
    compose: dict[str, Any] = {"services": {"x": {"environment": {
        "A": "${T:-fallback}", "B": "${T-fallback}", "C": "${T}", "D": "$T/x", "E": "$$T", "F": "${T:-}"}}}}  # fmt: skip
    unset = compose_env("x", {}, compose)
    empty = compose_env("x", {"T": ""}, compose)
    given = compose_env("x", {"T": "v"}, compose)
    assert unset == {"A": "fallback", "B": "fallback", "C": "", "D": "/x", "E": "$T", "F": ""}
    assert empty == {"A": "fallback", "B": "", "C": "", "D": "/x", "E": "$T", "F": ""}
    assert given == {"A": "v", "B": "v", "C": "v", "D": "v/x", "E": "$T", "F": "v"}
