"""DAPO's soft overlong punishment: 0 up to max - buffer tokens, then linear down to -1 at max, -1 beyond."""

from __future__ import annotations

import math

from grpo.reward.verifiers.result import Judgement

CHARS_PER_TOKEN = 4  # rough estimate when the caller has no token count


def overlong_penalty(length: int, max_tokens: int, buffer_tokens: int) -> float:
    """DAPO eq. 13: the length-aware penalty for a completion of `length` tokens."""
    expected = max_tokens - buffer_tokens
    if length <= expected:
        return 0.0
    if length <= max_tokens:
        return (expected - length) / buffer_tokens
    return -1.0


def overlong_reward(
    completion: str, max_tokens: int, buffer_tokens: int, completion_tokens: int | None = None
) -> Judgement:
    """Penalty on the token count when given, else on characters / 4."""
    if completion_tokens is None:
        length, unit = math.ceil(len(completion) / CHARS_PER_TOKEN), "estimated tokens"
    else:
        length, unit = completion_tokens, "tokens"
    return Judgement(overlong_penalty(length, max_tokens, buffer_tokens), "ok", f"{length} {unit}")
