"""Synthetic GRPO groups for tests and benchmarks: prompts and completions of random token ids, advantages by a rule.

One generator, so a batch is built the same way wherever a Learner is exercised without a rollout (the trainer
benchmark, the GPU check); the rule decides what the advantages look like.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo.trainer.learner import TrainableSample

# Called once a group, after its prompt is drawn and before its completions: (generator, group size) → a function
# from a member's index to its advantage, called after that member's completion is drawn.
AdvantageRule = Callable[[random.Random, int], Callable[[int], float]]


def alternating(rng: random.Random, size: int) -> Callable[[int], float]:
    """−1, +1, −1, ...: no randomness."""
    return lambda i: 1.0 if i % 2 else -1.0


def gaussian(rng: random.Random, size: int) -> Callable[[int], float]:
    """A standard normal draw for each member."""
    return lambda i: rng.gauss(0, 1)


def normalised_coin_flips(rng: random.Random, size: int) -> Callable[[int], float]:
    """Group-normalised advantages of 0/1 rewards, the first two 0 and 1 so a group is never all equal."""
    rewards = [float(i % 2) if i < 2 else float(rng.random() < 0.5) for i in range(size)]
    mean = sum(rewards) / len(rewards)
    std = statistics.pstdev(rewards) or 1.0
    return lambda i: (rewards[i] - mean) / std


def random_groups(
    n_groups: int,
    group_size: int,
    *,
    prompt_len: tuple[int, int],
    completion_len: tuple[int, int],
    tokens: tuple[int, int] = (5, 400),
    advantage: AdvantageRule = alternating,
    seed: int = 0,
    **fields: Any,
) -> list[TrainableSample]:
    """`n_groups` × `group_size` samples: one random prompt a group (group_id is its index), a random completion a
    member, token ids in [tokens[0], tokens[1]) and lengths in the inclusive ranges; `fields` go to every sample."""
    from grpo.trainer.learner import TrainableSample

    rng = random.Random(seed)
    low, high = tokens
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(low, high) for _ in range(rng.randint(*prompt_len))]
        advantage_of = advantage(rng, group_size)
        for i in range(group_size):
            completion = [rng.randrange(low, high) for _ in range(rng.randint(*completion_len))]
            out.append(TrainableSample(prompt, completion, advantage=advantage_of(i), group_id=str(g), **fields))
    return out
