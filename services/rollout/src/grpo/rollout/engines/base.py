"""The engine interface: what the rollout service needs from vLLM or transformers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    # A prompt's samples depend on (seed, the prompt's index in the request), never on the other prompts.
    seed: int | None = None
    # Per prompt, in order: the seed of each prompt's samples instead of one from (seed, index). Multi-turn episodes
    # use it so that an episode's turn draws the same whichever other episodes are still running.
    seeds: tuple[int, ...] | None = None


def always() -> bool:
    """The default `wanted`: a caller that never goes away (the Redis worker)."""
    return True


class GenerationCancelled(RuntimeError):
    """The caller went away (cancelled, or past its deadline): the call was dropped before it finished."""


@dataclass
class Sample:
    token_ids: list[int]
    # log_softmax(logits / temperature) of each sampled token, before top-p/top-k
    # truncation (temperature 0 counts as 1): the same quantity the trainer computes.
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" | "length"


@dataclass
class PromptOutput:
    prompt_token_ids: list[int]
    samples: list[Sample] = field(default_factory=list)


class Engine(ABC):
    """A loaded model that samples completions and accepts new weights in place.

    The service serialises calls: `load_weights` never runs during `generate`, so no
    sequence mixes two weight versions.
    """

    name: str
    tokenizer: Any  # a transformers tokenizer
    max_context: int

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, wanted: Callable[[], bool] = always
    ) -> list[PromptOutput]:
        """`params.n` samples for each tokenised prompt, in prompt order.

        Raises GenerationCancelled once `wanted()` is false (checked as often as the engine can), so that a call
        whose caller has gone away stops holding the engine."""

    @abstractmethod
    def weight_specs(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Name -> (safetensors dtype, shape) of every weight an update must provide."""

    @abstractmethod
    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Replace the weights with `tensors` (already validated against `weight_specs`)."""

    def weights_checksum(self) -> str:
        """sha256 of the loaded weights as `grpo.common.weights.weights_checksum` defines it.

        The service reports it as the checksum of version 0; "" when the engine cannot read
        its weights back (then version 0 reports an empty checksum).
        """
        return ""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources."""
