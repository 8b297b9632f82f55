"""Start the rollout service as a real subprocess on free ports (importable by any test tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpo.common.channels import make_channel
from grpo.common.net import free_port
from grpo.trainer.pusher import ReplicaTarget

if TYPE_CHECKING:
    import torch


@dataclass
class RolloutProc:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    log_path: Path
    data_port: int = 0  # the weights data port; 0 when turned off

    @property
    def target(self) -> ReplicaTarget:
        """How the trainer's pusher reaches this replica (the registry's view of it)."""
        return ReplicaTarget(f"replica-{self.grpc_port}", self.address, self.data_port)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def healthz(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/healthz", timeout=5) as r:
            return json.loads(r.read())

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _serving(address: str, ca_file: Path | None = None) -> bool:
    with make_channel(address, ca_file) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def start_rollout_service(
    *args: str, log_dir: Path, env: dict[str, str] | None = None, timeout: float = 120.0, ca_file: Path | None = None
) -> RolloutProc:
    """`python -m grpo.rollout --grpc-port P --http-port Q *args` (hf engine, 1 torch thread), once it serves
    (over TLS trusting `ca_file` when given)."""
    grpc_port, http_port = free_port(), free_port()
    if "--weights-data-port" in args:
        data_port = max(int(args[args.index("--weights-data-port") + 1]), 0)
        ports = []
    else:
        data_port = free_port()
        ports = ["--weights-data-port", str(data_port)]
    log_path = log_dir / f"rollout-{grpc_port}.log"
    cmd = [sys.executable, "-m", "grpo.rollout", "--host", "127.0.0.1", "--grpc-port", str(grpc_port)]
    cmd += ["--http-port", str(http_port), "--torch-threads", "1", *ports, *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with log_path.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    started = RolloutProc(proc, grpc_port, http_port, log_path, data_port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rollout exited with {proc.returncode}:\n{started.log_text()[-3000:]}")
        if _serving(started.address, ca_file):
            return started
        time.sleep(0.2)
    started.stop()
    raise TimeoutError(f"rollout did not serve within {timeout}s:\n{started.log_text()[-3000:]}")


def update_bytes(proc: RolloutProc, via: str) -> float:
    """The replica's grpo_rollout_weight_update_bytes_total for `via` ("data_port" or "stream")."""
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    prefix = f'grpo_rollout_weight_update_bytes_total{{via="{via}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def tiny_model_weights() -> dict[str, torch.Tensor]:
    """The built-in tiny model's weights in fp32, as the rollout service loads them at version 0."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo.common.tiny_model import ensure_tiny_model
    from grpo.common.weights import model_weights

    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)
    return {k: v.detach().clone() for k, v in model_weights(model).items()}


def perturbed(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A seeded small shift of every tensor: new weights that change greedy outputs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in weights.items()}


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `predicate` until it returns something truthy (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
