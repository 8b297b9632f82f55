"""Plain PyTorch backend: one process, CPU or one GPU, AdamW + LR schedule, HF safetensors checkpoints."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from grpo.trainer.learner.backends.base import Backend
from grpo.trainer.learner.optim import build_optimizer, build_scheduler
from grpo.trainer.learner.policy import push_state_dict, tied_embeddings

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


class TorchBackend(Backend):
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        device: torch.device,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
        adam_eps: float,
        warmup_steps: int,
        total_steps: int,
        lr_schedule: str,
        min_lr_ratio: float,
        max_grad_norm: float | None,
        precision: str,
    ) -> None:
        self.device = device
        self.model = model.to(device)
        self.precision = precision
        self.autocast_dtype = torch.bfloat16 if precision == "bf16" else None
        self.max_grad_norm = max_grad_norm
        self.optimizer = build_optimizer(
            model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas, eps=adam_eps
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            schedule=lr_schedule,
            min_ratio=min_lr_ratio,
        )
        self._params = [p for group in self.optimizer.param_groups for p in group["params"]]

    def backward(self, loss: Tensor, *, last_micro_batch: bool) -> None:
        loss.backward()

    def optimizer_step(self) -> float:
        # clip_grad_norm_ with an infinite bound still returns the norm (one fused pass either way)
        bound = self.max_grad_norm if self.max_grad_norm and self.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self._params, bound, foreach=True)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def save(self, directory: Path) -> None:
        # a PreTrainedModel or a PeftModel (both save HF safetensors); torch types the attribute as Tensor | Module
        cast("PreTrainedModel", self.model).save_pretrained(directory / "model", safe_serialization=True)
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")

    def load(self, directory: Path, saved_world_size: int | None = None) -> None:
        load_model_weights(self.model, directory / "model")
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location=self.device))
        self.scheduler.load_state_dict(torch.load(directory / "scheduler.pt"))

    def full_state_dict(self) -> dict[str, Tensor]:
        return push_state_dict(self.model)


def load_model_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load what save_pretrained wrote (full model or peft adapter) into `model` in place."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors files in {folder}")
    state: dict[str, Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if (folder / "adapter_config.json").exists():
        from peft import set_peft_model_state_dict

        # peft annotates the result as `namedtuple`; it is torch's load_state_dict (missing, unexpected) keys
        _, unexpected_keys = cast("tuple[list[str], list[str]]", set_peft_model_state_dict(model, state))
        if unexpected_keys:
            raise ValueError(f"checkpoint adapter has unexpected keys {unexpected_keys[:5]}")
        return
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if tied_embeddings(model) else set()
    if unexpected or set(missing) - allowed_missing:
        raise ValueError(
            f"checkpoint {folder} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
