"""The reward service as a real process for tests: grpo.local's launcher plus a test failure when it dies."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from grpo.local.services import ServiceProc, start_reward


@dataclass
class RewardService(ServiceProc):
    """A running reward service; `proc`, `grpc_addr`, `http_url` and `log_tail()` come from ServiceProc."""

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
    """`python -m grpo.reward *extra_args` on free loopback ports (or the given gRPC port), once /healthz answers."""
    started = start_reward(*extra_args, workers=workers, grpc_port=grpc_port, env=env, timeout_s=ready_timeout)
    return RewardService(started.child, started.grpc_port, started.http_port)


def stop_reward_service(service: ServiceProc) -> None:
    """SIGTERM, then SIGKILL after a grace period; removes the log file."""
    service.stop()
    service.log_path.unlink(missing_ok=True)
