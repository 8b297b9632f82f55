"""What makes a group flat, in one place: the rollout's probe (adaptive group size) and the trainer's zero-variance
filter must agree on it, or the rollout would cut groups short that the trainer would have trained on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Components whose score means "the answer is right" (1 = correct, code: fraction of tests passed).
CORRECTNESS_COMPONENTS = ("math", "code")


def correctness(components: Mapping[str, Any]) -> float | None:
    """A sample's correctness: the score of its first correctness component (a reward.v1 ComponentScore map, as a
    ScoreResult and a SampleRecord carry it); None when it has none."""
    for name in CORRECTNESS_COMPONENTS:
        component = components.get(name)
        if component is not None and component.HasField("score"):
            return float(component.score)
    return None


def no_spread(values: Sequence[float]) -> bool:
    """Every value equal (within 1e-12): a group whose advantages would all be 0. False for no values."""
    return bool(values) and max(values) - min(values) <= 1e-12
