"""One reward service or rollout replica as a child process on free loopback ports, once it serves.

For the reward examples, the benchmarks and the tests; `grpo up` and the demo start whole stacks
from config files instead (grpo.local.stack). Both go through grpo.local.procs.
"""

from __future__ import annotations

import functools
import logging
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

from grpo.common.net import free_port
from grpo.common.readiness import grpc_health_check
from grpo.local.procs import PORT_ATTEMPTS, Child, ChildFailed, http_ok, launch, log_tail, port_clash


@dataclass
class ServiceProc:
    """A started service: its process (`child`) and where to reach it."""

    child: Child
    grpc_port: int
    http_port: int
    data_port: int = 0  # the rollout's weights data port; 0 when turned off or not a rollout

    @property
    def proc(self) -> Popen[bytes]:
        return self.child.proc

    @property
    def log_path(self) -> Path:
        return self.child.log_path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    grpc_addr = address

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM (its whole process group), SIGKILL after `grace_s`; the exit code."""
        return self.child.stop(grace_s)


def _log_file(log_path: Path | None, prefix: str) -> Path:
    if log_path is not None:
        return log_path
    return Path(tempfile.mkstemp(prefix=prefix, suffix=".log")[1])


log = logging.getLogger(__name__)


def on_fresh_ports(start: Callable[[], ServiceProc], what: str) -> ServiceProc:
    """`start()`, again on fresh ports when the child could not bind one. A free port is picked before the child
    binds it, so another process (a parallel test, a busy machine) may take it in between: EADDRINUSE, and the
    service never came up through no fault of its own."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return start()
        except ChildFailed as exc:
            if not port_clash(exc) or attempt == PORT_ATTEMPTS:
                raise
            log.warning("%s: a port it was given was taken before it bound it; starting it on fresh ports", what)
    raise AssertionError("unreachable")


def _other_port(*taken: int) -> int:
    port = free_port()
    while port in taken:
        port = free_port()
    return port


def start_reward(
    *flags: str,
    workers: int = 1,
    grpc_port: int | None = None,
    http_port: int | None = None,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    timeout_s: float = 60.0,
) -> ServiceProc:
    """`python -m grpo.reward *flags` on free loopback ports (or the given ones), once /healthz answers.
    The log goes to `log_path` (a new temporary file when None). ChildFailed when it does not come up."""

    def start() -> ServiceProc:
        grpc = grpc_port or free_port()
        http = http_port or _other_port(grpc)
        cmd = [sys.executable, "-m", "grpo.reward", "--host", "127.0.0.1", "--grpc-port", str(grpc),
               "--http-port", str(http), "--workers", str(workers), *flags]  # fmt: skip
        ready = functools.partial(http_ok, f"http://127.0.0.1:{http}/healthz", 1.0)
        child = launch("reward", cmd, _log_file(log_path, "grpo-reward-"), ready, timeout_s=timeout_s, env=env)
        return ServiceProc(child, grpc, http)

    return on_fresh_ports(start, "reward") if grpc_port is None and http_port is None else start()


def start_rollout(
    *args: str,
    log_dir: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    ca_file: Path | None = None,
    python: str = sys.executable,
) -> ServiceProc:
    """`python -m grpo.rollout *args` on free ports (1 torch thread, a weights data port unless `args` set
    one), once its gRPC health check says SERVING. `python` may be another venv's (vLLM's)."""

    def start() -> ServiceProc:
        grpc_port = free_port()
        http_port = _other_port(grpc_port)
        if "--weights-data-port" in args:
            data_port = max(int(args[args.index("--weights-data-port") + 1]), 0)
            ports = []
        else:
            data_port = _other_port(grpc_port, http_port)
            ports = ["--weights-data-port", str(data_port)]
        cmd = [python, "-m", "grpo.rollout", "--host", "127.0.0.1", "--grpc-port", str(grpc_port)]
        cmd += ["--http-port", str(http_port), "--torch-threads", "1", *ports, *args]
        health = grpc_health_check(f"127.0.0.1:{grpc_port}", str(ca_file) if ca_file else None)
        log_path = log_dir / f"rollout-{grpc_port}.log"
        child = launch(
            "rollout",
            cmd,
            log_path,
            lambda: health() is None,
            timeout_s=timeout_s,
            env={"OMP_NUM_THREADS": "1", **(env or {})},
        )
        return ServiceProc(child, grpc_port, http_port, data_port)

    return on_fresh_ports(start, "rollout")
