"""Service-tier fixtures: a real `grpo-reward` process on free ports."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from grpo.common.net import free_port


@dataclass
class RewardService:
    """A running reward service subprocess and where to reach it."""

    http_url: str
    grpc_addr: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    token: str | None = None
    extra_args: list[str] = field(default_factory=list)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def assert_alive(self) -> None:
        if self.proc.poll() is not None:
            pytest.fail(f"reward service died with exit code {self.proc.returncode}; log tail:\n{self.log_tail()}")


def start_reward_service(
    *extra_args: str,
    workers: int = 2,
    env: dict[str, str] | None = None,
    ready_timeout: float = 60.0,
    grpc_port: int | None = None,
) -> RewardService:
    """Start `python -m grpo.reward` on free loopback ports (or the given gRPC port) and wait for /healthz."""
    grpc_port, http_port = grpc_port or free_port(), free_port()
    while http_port == grpc_port:
        http_port = free_port()
    log_file = tempfile.NamedTemporaryFile(prefix="grpo-reward-", suffix=".log", delete=False)  # noqa: SIM115
    cmd = [
        sys.executable, "-m", "grpo.reward",
        "--host", "127.0.0.1",
        "--grpc-port", str(grpc_port),
        "--http-port", str(http_port),
        "--workers", str(workers),
        *extra_args,
    ]  # fmt: skip
    proc_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=proc_env)
    service = RewardService(
        http_url=f"http://127.0.0.1:{http_port}",
        grpc_addr=f"127.0.0.1:{grpc_port}",
        proc=proc,
        log_path=Path(log_file.name),
        extra_args=list(extra_args),
    )
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"reward service exited with {proc.returncode} before ready:\n{service.log_tail()}")
        try:
            if httpx.get(f"{service.http_url}/healthz", timeout=1.0).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop_reward_service(service)
    raise TimeoutError(f"reward service not healthy within {ready_timeout}s:\n{service.log_tail()}")


def stop_reward_service(service: RewardService) -> None:
    """SIGTERM, then SIGKILL after a grace period; removes the log file."""
    if service.proc.poll() is None:
        service.proc.terminate()
        try:
            service.proc.wait(15)
        except subprocess.TimeoutExpired:
            service.proc.kill()
            service.proc.wait()
    service.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def reward_service() -> Iterator[RewardService]:
    """One reward service (2 workers) for the whole session; fails clearly if it dies."""
    try:
        service = start_reward_service(workers=2)
    except (RuntimeError, TimeoutError) as exc:
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
