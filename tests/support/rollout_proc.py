"""The rollout service as a real process on free ports (grpo.local's launcher), and helpers for its weights."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo.local.services import ServiceProc, start_rollout
from grpo.trainer.pusher import ReplicaTarget

if TYPE_CHECKING:
    import torch


@dataclass
class RolloutProc(ServiceProc):
    """A running replica; `proc`, `address`, `http_port`, `data_port`, `log_text()` and `stop()` from ServiceProc."""

    @property
    def target(self) -> ReplicaTarget:
        """How the trainer's pusher reaches this replica (the registry's view of it)."""
        return ReplicaTarget(f"replica-{self.grpc_port}", self.address, self.data_port)

    def healthz(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.http_url}/healthz", timeout=5) as r:
            return dict(json.loads(r.read()))


def start_rollout_service(
    *args: str, log_dir: Path, env: dict[str, str] | None = None, timeout: float = 120.0, ca_file: Path | None = None
) -> RolloutProc:
    """`python -m grpo.rollout --grpc-port P --http-port Q *args` (hf engine, 1 torch thread), once it serves
    (over TLS trusting `ca_file` when given)."""
    started = start_rollout(*args, log_dir=log_dir, env=env, timeout_s=timeout, ca_file=ca_file)
    return RolloutProc(started.child, started.grpc_port, started.http_port, started.data_port)


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
    from grpo.common.weights.codec import model_weights

    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)
    return {k: v.detach().clone() for k, v in model_weights(model).items()}


def perturbed(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A seeded small shift of every tensor: new weights that change greedy outputs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in weights.items()}
