"""Token sampling and stop-string helpers for engines that run their own decoding loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from grpo.rollout.engines.base import SamplingParams


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(next tokens [B], their log-probs [B]) from last-position logits [B, V].

    The log-prob is grpo.common.logprobs.token_logprobs (the trainer's own definition) of the sampled
    token at the sampling temperature, taken before top-k/top-p truncation; temperature 0 is greedy
    and its log-probs use temperature 1.
    """
    import torch

    from grpo.common.logprobs import token_logprobs

    logits = logits.float()
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
        return tokens, token_logprobs(logits[:, None], tokens[:, None])[:, 0]
    filtered = truncate(logits / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(filtered, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, token_logprobs(logits[:, None], tokens[:, None], params.temperature)[:, 0]


def truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Logits with everything outside top-k and the top-p nucleus set to -inf."""
    import torch

    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if 0 < top_p < 1:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already cover top_p (the first always stays).
        drop = (probs.cumsum(dim=-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.empty_like(scaled).scatter_(1, order, sorted_logits)
    return scaled


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """End index of the earliest stop string in `text` (text is cut there, stop included), or None."""
    best: int | None = None
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and (best is None or at + len(stop) < best):
            best = at + len(stop)
    return best
