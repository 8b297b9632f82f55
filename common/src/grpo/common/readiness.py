"""Readiness (`/readyz`): named checks of what a service needs to do its work, separate from liveness.

A check returns None when its dependency is usable, else a short reason ("cannot reach redis://…").
Liveness (`/healthz`) stays 200 while the process serves: a Redis outage is a reason to stop sending a
replica work, not to restart it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Check = Callable[[], str | None]


class Readiness:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checks: dict[str, Check] = {}

    def add(self, name: str, check: Check) -> None:
        with self._lock:
            self._checks[name] = check

    def problems(self) -> list[str]:
        """`name: reason` for every check that fails (a check that raises fails with its exception)."""
        with self._lock:
            checks = dict(self._checks)
        problems = []
        for name, check in checks.items():
            try:
                problem = check()
            except Exception as exc:  # a probe must answer, not raise
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                problems.append(f"{name}: {problem}")
        return problems


def redis_check(url: str, timeout_s: float = 1.0) -> Check:
    """PING over a client of its own with a short timeout (the service's clients block for seconds)."""
    from grpo.common.queue import connect, redacted

    client = connect(url, socket_timeout_s=timeout_s, connect_timeout_s=timeout_s)

    def check() -> str | None:
        try:
            client.ping()
        except Exception as exc:
            return f"cannot reach {redacted(url)} ({type(exc).__name__})"
        return None

    return check


def grpc_health_check(addr: str, ca_file: str | None = None, timeout_s: float = 1.0) -> Check:
    """The standard gRPC health service of a dependency (open without a token) answers SERVING."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from grpo.common.channels import make_channel

    stub = health_pb2_grpc.HealthStub(make_channel(addr, ca_file))

    def check() -> str | None:
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except Exception as exc:
            code = exc.code().name if hasattr(exc, "code") else type(exc).__name__
            return f"cannot reach {addr} ({code})"
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            return f"{addr} is {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
        return None

    return check
