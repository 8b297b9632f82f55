"""The hf engine on a model it does not own: a colocated trainer's policy, trained in place between generations.

grpo.trainer.colocated builds it on the learner's own module. No weights are ever copied in (an update is the
trainer's optimizer step on the very tensors this engine reads), so there is one model in memory, not two. The
trainer keeps generation and its update apart with the service's engine lock (RolloutService.paused).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grpo.rollout.engines.base import PromptOutput, SamplingParams, always
from grpo.rollout.engines.hf import HFEngine

if TYPE_CHECKING:
    import torch

SHARED = "the weights are the colocated trainer's own tensors; no update is copied in"


class SharedHFEngine(HFEngine):
    def __init__(self, model: Any, tokenizer: Any, device: torch.device) -> None:  # no super(): nothing to load
        self.device = device
        self.tokenizer = tokenizer
        self._attach(model)

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Nothing to copy: the version moves on with the trainer's step (an empty update). Tensors are refused
        before anything is written: copying into them would overwrite the policy being trained."""
        if tensors:
            raise ValueError(SHARED)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, wanted: Callable[[], bool] = always
    ) -> list[PromptOutput]:
        """Generate in eval mode (the learner keeps its module in training mode: gradient checkpointing there turns
        the KV cache off), then hand the module back as it was."""
        training = self.model.training
        self.model.eval()
        try:
            return super().generate(prompts, params, wanted)
        finally:
            self.model.train(training)
