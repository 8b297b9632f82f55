"""Step- and token-level credit (credit.py) and per-token advantages in policy_loss: hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.algo.credit import (
    mix_advantages,
    process_advantages,
    step_aligned_advantages,
    token_advantages,
    vineppo_advantages,
)
from tests.unit.algo.helpers import plain_loss

R3 = math.sqrt(1 / 3)


def _close(actual: list[list[float]], expected: list[list[float]]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a == pytest.approx(e, abs=1e-9)


def test_process_advantages_normalise_the_whole_group_then_sum_the_steps_ahead() -> None:
    # R = {1, 0 | 1, 1}: mean 0.75, Bessel std sqrt((3·0.25² + 0.75²)/3) = 0.5 → r̃ = [0.5, −1.5 | 0.5, 0.5];
    # step k gets Σ_{j≥k} r̃_j: [0.5 − 1.5, −1.5 | 1.0, 0.5].
    _close(process_advantages([[1.0, 0.0], [1.0, 1.0]], eps=0.0), [[-1.0, -1.5], [1.0, 0.5]])
    # Population std (÷n): sqrt(0.1875) → r̃ scaled by 0.5 / sqrt(0.1875).
    scale = 0.5 / math.sqrt(0.1875)
    _close(process_advantages([[1.0, 0.0], [1.0, 1.0]], eps=0.0, std_unbiased=False),
           [[-1.0 * scale, -1.5 * scale], [1.0 * scale, 0.5 * scale]])  # fmt: skip


def test_process_advantages_of_single_step_completions_are_outcome_grpo() -> None:
    # One step each (no delimiter found): the cumulative form reduces to the group-normalised reward.
    _close(process_advantages([[1.0], [0.0], [0.0], [0.0]], eps=0.0), [[1.5], [-0.5], [-0.5], [-0.5]])
    _close(process_advantages([[0.3, 0.3], [0.3]]), [[0.0, 0.0], [0.0]])  # all equal: no signal, exact zeros


def test_step_aligned_advantages_compare_the_same_step_across_the_group() -> None:
    # step 0: [1, 0, 1], mean 2/3, Bessel std sqrt(1/3) → [√⅓, −2√⅓, √⅓]; step 1: [0, 0, 1] → [−√⅓, −√⅓, 2√⅓];
    # step 2: only the first completion has one → 0.
    got = step_aligned_advantages([[1.0, 0.0, 1.0], [0.0, 0.0], [1.0, 1.0]], eps=0.0)
    _close(got, [[R3, -R3, 0.0], [-2 * R3, -R3], [R3, 2 * R3]])
    # step 0 agrees (0 each); step 1: [0.5, 0], mean 0.25, Bessel std sqrt(2·0.25²) → ±0.25 / sqrt(0.125) = ±√½
    _close(step_aligned_advantages([[1.0, 0.5], [1.0, 0.0]], eps=0.0), [[0.0, math.sqrt(0.5)], [0.0, -math.sqrt(0.5)]])


def test_vineppo_advantages_are_value_differences_that_telescope() -> None:
    # V = [0.5 (prompt), 0.25, 1.0], reward 1: [0.25 − 0.5, 1.0 − 0.25, 1 − 1.0]
    got = vineppo_advantages([0.5, 0.25, 1.0], 1.0)
    assert got == pytest.approx([-0.25, 0.75, 0.0])
    assert sum(got) == pytest.approx(1.0 - 0.5)
    assert vineppo_advantages([0.25], 0.0) == pytest.approx([-0.25])  # one step: reward − V(prompt)
    with pytest.raises(ValueError, match="at least one step boundary"):
        vineppo_advantages([], 1.0)


def test_mix_advantages_interpolates_outcome_and_process() -> None:
    assert mix_advantages(1.0, [0.5, -1.0], 0.25) == pytest.approx([0.875, 0.5])
    assert mix_advantages(1.0, [0.5, -1.0], 0.0) == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match=r"process_weight must be in \[0, 1\]"):
        mix_advantages(1.0, [0.5], 1.5)


def test_token_advantages_give_each_step_its_tokens() -> None:
    # step 0 owns tokens 0–1, step 1 is empty, step 2 owns 2–3 and the trailing tokens 4–5 (EOS, whitespace).
    assert token_advantages([1.0, 2.0, 3.0], [2, 2, 4], 6) == [1.0, 1.0, 3.0, 3.0, 3.0, 3.0]
    assert token_advantages([1.0, 2.0, 3.0], [1, 2, 3], 3) == [1.0, 2.0, 3.0]  # steps of one token
    assert token_advantages([0.5], [0], 4) == [0.5] * 4  # no delimiter: one step, every token
    assert token_advantages([0.5, 0.7], [0, 0], 0) == []  # an empty completion
    with pytest.raises(ValueError, match="2 step advantages for 3 step ends"):
        token_advantages([1.0, 2.0], [1, 2, 3], 3)
    with pytest.raises(ValueError, match="non-decreasing"):
        token_advantages([1.0, 2.0], [3, 2], 3)
    with pytest.raises(ValueError, match="ends at token 5 of a 3-token completion"):
        token_advantages([1.0], [5], 3)


def test_step_functions_refuse_what_they_cannot_credit() -> None:
    with pytest.raises(ValueError, match="completion 1 has no step"):
        process_advantages([[1.0], []])
    with pytest.raises(ValueError, match="NaN or inf"):
        step_aligned_advantages([[1.0], [math.nan]])


def test_policy_loss_takes_one_advantage_per_token() -> None:
    # At ratio 1 with seq_mean_token_mean over one row of 3 tokens: ∂L/∂logp_t = −A_t / 3.
    logp = torch.zeros(1, 3, requires_grad=True)
    mask = torch.ones(1, 3)
    loss, _ = plain_loss(logp, logp.detach(), torch.tensor([[1.0, 0.0, -1.0]]), mask, beta=0.0)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([-1 / 3, 0.0, 1 / 3])


def test_constant_token_advantages_equal_the_outcome_form() -> None:
    torch.manual_seed(0)
    logp, old = torch.randn(3, 5) * 0.1 - 1.0, torch.randn(3, 5) * 0.1 - 1.0
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    adv = torch.tensor([0.7, -1.2, 0.3])
    per_row, _ = plain_loss(logp, old, adv, mask, agg="token_mean", beta=0.0)
    garbage = torch.where(mask.bool(), adv.unsqueeze(1).expand(3, 5), torch.tensor(math.nan))  # padding: NaN
    per_token, _ = plain_loss(logp, old, garbage, mask, agg="token_mean", beta=0.0)
    assert per_token.item() == pytest.approx(per_row.item(), abs=1e-7)
    with pytest.raises(ValueError, match=r"\[B, T\] = \[3, 5\]"):
        plain_loss(logp, old, torch.zeros(3, 4), mask)
