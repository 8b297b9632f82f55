"""VinePPO's value rollouts: where to split a completion, the value tasks, their books, and the token credit.

For each sampled completion the trainer picks split points among its step boundaries (at most vine_max_splits,
spread evenly), asks the rollout service for vine_k continuations of the prefix up to each (a `value` task: the
prompt with prefix_token_ids), and takes the mean reward of a prefix's continuations as its value. The prompt's
value is the group's mean reward; the value after the last step is the completion's own reward. Each segment
between split points gets V(after) − V(before) (grpo.algo.credit.vineppo_advantages).

A value task is resolved (its value used) or dropped with a reason (failed, unscored, timeout, stopped), like every
other task; a value group that comes after its step is `late` and acked. A split point whose value is missing is left
out: the segments on either side merge into one, whose credit is still a difference of estimated values.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from grpo.algo.credit import token_advantages, vineppo_advantages

VALUE_KIND = "value"
VALUE_DROP_REASONS = ("failed", "unscored", "timeout", "stopped")


def split_points(step_token_ends: Sequence[int], n_tokens: int, max_splits: int) -> list[int]:
    """Token counts at the step boundaries strictly inside the completion, at most `max_splits`, evenly spread."""
    inner = sorted({end for end in step_token_ends if 0 < end < n_tokens})
    if len(inner) <= max_splits:
        return inner
    if max_splits == 1:
        return [inner[len(inner) // 2]]
    return sorted({inner[round(i * (len(inner) - 1) / (max_splits - 1))] for i in range(max_splits)})


def value_task_id(group_id: str, sample: int, split: int, version: int) -> str:
    """Unique per policy version: a value group from other weights (a resume, an earlier step) never matches."""
    return f"{group_id}/v{sample}.{split}@{version}"


@dataclass
class ValueBooks:
    """Every value task published is used, or dropped with a reason; `late` groups are counted beside."""

    published: int = 0
    used: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    late: int = 0
    continuation_tokens: int = 0  # since the last metrics (per step)
    wait_s: float = 0.0  # since the last metrics (per step)

    def check(self, in_flight: int = 0) -> None:
        if self.published != self.used + sum(self.dropped.values()) + in_flight:
            raise AssertionError(f"value books do not balance: {self}, in flight {in_flight}")

    def metrics(self, trained_tokens: int) -> dict[str, float]:
        """Cumulative counts, and this step's cost: rollout tokens per trained token, seconds waiting for values."""
        out = {"vine/value_tasks": float(self.published), "vine/value_used": float(self.used),
               "vine/value_late": float(self.late), "time/vine_wait_s": self.wait_s,
               "vine/rollout_tokens_per_trained_token": (trained_tokens + self.continuation_tokens)
               / max(trained_tokens, 1)}  # fmt: skip
        out.update({f"vine/value_dropped/{reason}": float(self.dropped[reason]) for reason in VALUE_DROP_REASONS})
        self.continuation_tokens, self.wait_s = 0, 0.0
        return out


def sample_credit(
    splits: Sequence[int], values: dict[int, float], prompt_value: float, reward: float, n_tokens: int
) -> list[float]:
    """Per-token advantages of one completion from the values found at its split points (missing ones skipped)."""
    kept = [b for b in splits if b in values]
    advantages = vineppo_advantages([prompt_value, *(values[b] for b in kept)], reward)
    return token_advantages(advantages, [*kept, n_tokens], n_tokens)
