"""Step- and token-level credit: advantages that change along a completion (process supervision, VinePPO).

Outcome GRPO gives every token of a completion the same advantage. These functions give each *step* (a span of
the completion: a reasoning step, a line, a scratchpad column) its own, then spread the step advantages over the
tokens. A completion's steps partition its tokens: step k owns the tokens from the end of step k−1 up to its own
end, and tokens after the last step (the EOS token, trailing text) belong to the last step.

A group is G completions; completion i has K_i ≥ 1 steps (the K_i may differ; one step = no delimiter found).
Step rewards and values are plain floats per completion (ragged lists), the result is per step, and
`token_advantages` turns one completion's step advantages into its per-token row.

Only the math lives here (floats in, floats out: no protos, no I/O). Which credit a run uses is the registry in
grpo.trainer.credit (CREDITS, beside how the loop reads a group record and VinePPO's value rollouts): a new
assignment is a function here, if it has math of its own, and an entry there.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

from grpo.algo.advantages import std
from grpo.algo.presets import DEFAULTS


def _check_steps(step_rewards: Sequence[Sequence[float]]) -> None:
    if not step_rewards:
        raise ValueError("a group needs at least one completion")
    for i, steps in enumerate(step_rewards):
        if not steps:
            raise ValueError(f"completion {i} has no step; a completion without a delimiter is one step")
        if not all(torch.isfinite(torch.tensor(steps, dtype=torch.float64))):
            raise ValueError(f"completion {i} has a NaN or inf step reward; an unjudged step must be dropped")


def process_advantages(
    step_rewards: Sequence[Sequence[float]],
    *,
    eps: float = DEFAULTS.advantage_eps,
    std_unbiased: bool = DEFAULTS.std_unbiased,
) -> list[list[float]]:
    """DeepSeekMath's process supervision (Shao et al., 2024, §4.1.3): every step reward of the group is
    normalised with the mean and std of all of them, r̃ = (r − mean(R)) / (std(R) + eps), and a token's advantage
    is the sum of the normalised rewards of the steps that end at or after it: step k gets Σ_{j ≥ k} r̃_j.

    A group whose step rewards are all equal gets zeros (no signal, as in `group_advantages`).
    """
    _check_steps(step_rewards)
    flat = torch.tensor([r for steps in step_rewards for r in steps], dtype=torch.float64)
    if flat.max() == flat.min():
        return [[0.0] * len(steps) for steps in step_rewards]
    normalised = ((flat - flat.mean()) / (std(flat, std_unbiased) + eps)).tolist()
    out, at = [], 0
    for steps in step_rewards:
        mine = normalised[at : at + len(steps)]
        at += len(steps)
        out.append(torch.tensor(mine, dtype=torch.float64).flip(0).cumsum(0).flip(0).tolist())  # suffix sums
    return out


def step_aligned_advantages(
    step_rewards: Sequence[Sequence[float]],
    *,
    eps: float = DEFAULTS.advantage_eps,
    std_unbiased: bool = DEFAULTS.std_unbiased,
) -> list[list[float]]:
    """The seed's step-aligned baseline (GRPO chapter §15.7.4): Â_{i,k} = (r_{i,k} − mean_j r_{j,k}) / std_j r_{j,k},
    the statistics over the completions j of the group that have a step k.

    A step index that fewer than two completions reach, or on which they all agree, gets 0: there is no baseline
    to compare it with.
    """
    _check_steps(step_rewards)
    out = [[0.0] * len(steps) for steps in step_rewards]
    for k in range(max(len(steps) for steps in step_rewards)):
        have = [i for i, steps in enumerate(step_rewards) if k < len(steps)]
        r = torch.tensor([step_rewards[i][k] for i in have], dtype=torch.float64)
        if len(have) < 2 or r.max() == r.min():
            continue
        normalised = (r - r.mean()) / (std(r, std_unbiased) + eps)
        for i, a in zip(have, normalised.tolist(), strict=True):
            out[i][k] = a
    return out


ProcessAdvantageFn = Callable[..., list[list[float]]]
# The `process_advantage` setting's choices: how a group's step rewards become step advantages.
PROCESS_ADVANTAGES: dict[str, ProcessAdvantageFn] = {
    "cumulative": process_advantages,
    "step_aligned": step_aligned_advantages,
}


def vineppo_advantages(values: Sequence[float], reward: float) -> list[float]:
    """VinePPO (Kazemnejad et al., 2024): A_k = V(s_{k+1}) − V(s_k), the value of the prefix after step k minus the
    value before it, where V(s_k) is the mean reward of continuations sampled from the prefix that ends where step k
    starts (values[0]: from the prompt alone) and the value after the last step is the completion's own reward.

    The advantages telescope: they sum to reward − values[0].
    """
    if not values:
        raise ValueError("VinePPO needs a value for at least one step boundary (the prompt's)")
    after = [*values[1:], reward]
    return [v_next - v for v, v_next in zip(values, after, strict=True)]


def mix_advantages(outcome: float, process: Sequence[float], process_weight: float) -> list[float]:
    """(1 − w)·A_outcome + w·A_process per step: w = 0 is outcome GRPO, w = 1 pure process supervision."""
    if not 0.0 <= process_weight <= 1.0:
        raise ValueError(f"process_weight must be in [0, 1], got {process_weight}")
    return [(1.0 - process_weight) * outcome + process_weight * a for a in process]


def token_advantages(step_advantages: Sequence[float], step_token_ends: Sequence[int], n_tokens: int) -> list[float]:
    """Per-token advantages [n_tokens] of one completion from its step advantages.

    step_token_ends[k] is the number of completion tokens up to the end of step k (exclusive end, non-decreasing);
    step k owns tokens [ends[k−1], ends[k]), an empty step owns none, and tokens from the last end on belong to the
    last step.
    """
    if len(step_advantages) != len(step_token_ends):
        raise ValueError(f"{len(step_advantages)} step advantages for {len(step_token_ends)} step ends")
    if not step_advantages:
        raise ValueError("a completion has at least one step")
    if any(b < a for a, b in itertools.pairwise(step_token_ends)) or step_token_ends[0] < 0:
        raise ValueError(f"step token ends must be non-decreasing and >= 0, got {list(step_token_ends)}")
    if step_token_ends[-1] > n_tokens:
        raise ValueError(f"the last step ends at token {step_token_ends[-1]} of a {n_tokens}-token completion")
    out: list[float] = []
    start = 0
    for k, (adv, end) in enumerate(zip(step_advantages, step_token_ends, strict=True)):
        stop = n_tokens if k == len(step_token_ends) - 1 else end
        out.extend([float(adv)] * (stop - start))
        start = stop
    return out
