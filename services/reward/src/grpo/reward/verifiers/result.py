"""The one result type every non-math component returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Judgement:
    """A component's verdict: `score` is None when it cannot judge (see grpo.reward.scoring)."""

    score: float | None
    status: str
    detail: str = ""
