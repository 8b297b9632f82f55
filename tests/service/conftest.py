"""Service-tier fixtures: a real `grpo-reward` process on free ports; a stub of the module's rollout replica."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from grpo.local.procs import ChildFailed
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service
from tests.support.rollout_proc import RolloutProc, start_rollout_service
from tests.support.trainer_proc import ROLLOUT_ENV

if TYPE_CHECKING:
    import torch

    from grpo.v1 import rollout_pb2_grpc


@pytest.fixture(scope="session")
def reward_service() -> Iterator[RewardService]:
    """One reward service (2 workers) for the whole session; fails clearly if it dies."""
    try:
        service = start_reward_service(workers=2)
    except ChildFailed as exc:
        pytest.fail(f"could not start the reward service: {exc}")
    try:
        yield service
        died = service.proc.poll() is not None
        tail = service.log_tail() if died else ""
    finally:
        stop_reward_service(service)
    if died:
        pytest.fail(f"reward service died during the session (exit {service.proc.returncode}):\n{tail}")


@pytest.fixture
def start_reward() -> Iterator[Callable[..., RewardService]]:
    """Start extra reward services with their own flags (e.g. a tiny queue, a token); stopped after the test."""
    started: list[RewardService] = []

    def start(
        *extra_args: str, workers: int = 1, env: dict[str, str] | None = None, grpc_port: int | None = None
    ) -> RewardService:
        service = start_reward_service(*extra_args, workers=workers, env=env, grpc_port=grpc_port)
        started.append(service)
        return service

    yield start
    for service in started:
        stop_reward_service(service)


@pytest.fixture
def live_reward(reward_service: RewardService) -> RewardService:
    """The session service, checked alive before each test that uses it."""
    reward_service.assert_alive()
    return reward_service


@pytest.fixture
def rollout_for(redis_url: str, live_reward: Any, tmp_path: Path) -> Iterator[Callable[..., RolloutProc]]:
    """`start(run, *extra_args)`: a rollout replica with a worker loop for `run`, stopped after the test."""
    started: list[RolloutProc] = []

    def start(run: str, *extra: str) -> RolloutProc:
        args = ("--redis-url", redis_url, "--reward-addr", live_reward.grpc_addr, "--replica-id", f"{run}-r1",
                "--advertise-host", "127.0.0.1", *extra)  # fmt: skip
        proc = start_rollout_service(*args, log_dir=tmp_path, env={**ROLLOUT_ENV, "GRPO_ROLLOUT_RUN": run})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="module")
def stub(rollout: RolloutProc) -> Iterator[rollout_pb2_grpc.RolloutServiceStub]:
    """A gRPC stub of the module's `rollout` replica (tests/conftest.py)."""
    from grpo.v1 import rollout_pb2_grpc

    with grpc.insecure_channel(rollout.address) as channel:
        yield rollout_pb2_grpc.RolloutServiceStub(channel)


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    """The tiny model's own weights, as a replica starts with them."""
    from tests.support.rollout_proc import tiny_model_weights

    return tiny_model_weights()
