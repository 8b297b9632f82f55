"""group_advantages / zero_variance_groups: hand-computed numbers per mode, then properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.algo import ADVANTAGE_MODES, group_advantages, zero_variance_groups

FAST = settings(max_examples=60, deadline=None)


def _close(actual: torch.Tensor, expected: list[float], tol: float = 1e-6) -> None:
    assert actual.tolist() == pytest.approx(expected, abs=tol)


def test_grpo_population_std() -> None:
    # r = [1,0,0,0]: mean 1/4, population std sqrt((0.75² + 3·0.25²)/4) = sqrt(3)/4 → A = [√3, −1/√3 ×3]
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, eps=0.0, std_unbiased=False)
    s3 = math.sqrt(3.0)
    _close(adv, [s3, -1 / s3, -1 / s3, -1 / s3])


def test_grpo_default_is_the_bessel_std_with_eps_in_the_denominator() -> None:
    # the seeds' pseudo-code (torch.std), TRL and veRL: sqrt((0.5625 + 3·0.0625)/3) = 0.5; eps 1e-4 (TRL's)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    _close(adv, [0.75 / (0.5 + 1e-4)] + [-0.25 / (0.5 + 1e-4)] * 3)


def test_grpo_unbiased_std() -> None:
    # Bessel: sqrt((0.5625 + 3·0.0625)/3) = 0.5 → A = [1.5, −0.5, −0.5, −0.5]
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, eps=0.0, std_unbiased=True)
    _close(adv, [1.5, -0.5, -0.5, -0.5])


def test_dr_grpo_is_mean_centred_only() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 5.0]), 2, mode="dr_grpo")
    _close(adv, [0.5, -0.5, 0.0, 0.0, -1.0, 1.0])


def test_rloo_leave_one_out() -> None:
    # [2, 4, 9]: baselines (4+9)/2 = 6.5, (2+9)/2 = 5.5, (2+4)/2 = 3
    adv = group_advantages(torch.tensor([2.0, 4.0, 9.0]), 3, mode="rloo")
    _close(adv, [-4.5, -1.5, 6.0])
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, mode="rloo")
    _close(adv, [1.0, -1 / 3, -1 / 3, -1 / 3])


def test_reinforce_pp_uses_the_batch_std() -> None:
    # group-centred: [0.5, −0.5, 1, −1]; batch population std sqrt((0.25+0.25+1+1)/4) = sqrt(0.625)
    adv = group_advantages(torch.tensor([1.0, 0.0, 3.0, 1.0]), 2, mode="reinforce_pp", eps=0.0, std_unbiased=False)
    s = math.sqrt(0.625)
    _close(adv, [0.5 / s, -0.5 / s, 1 / s, -1 / s])
    # GRPO would have normalised each group on its own: [1, −1, 1, −1]
    grpo = group_advantages(torch.tensor([1.0, 0.0, 3.0, 1.0]), 2, eps=0.0, std_unbiased=False)
    _close(grpo, [1.0, -1.0, 1.0, -1.0])


def test_rank_averages_ties_and_spans_minus_one_to_one() -> None:
    # ranks: −3 → 1, 0.1 → 2, the two 5.0 → (3+4)/2 = 3.5; (rank − 2.5) / 1.5
    adv = group_advantages(torch.tensor([0.1, 5.0, 5.0, -3.0]), 4, mode="rank")
    _close(adv, [-1 / 3, 2 / 3, 2 / 3, -1.0])
    _close(group_advantages(torch.tensor([10.0, 1e-3, 7.0]), 3, mode="rank"), [1.0, -1.0, 0.0])


def test_reward_clip_applies_before_normalising() -> None:
    clipped = group_advantages(torch.tensor([10.0, 0.0, -5.0, 0.0]), 4, eps=0.0, clip=(0.0, 1.0))
    plain = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, eps=0.0)
    assert torch.equal(clipped, plain)


@pytest.mark.parametrize("mode", sorted(ADVANTAGE_MODES))
def test_zero_variance_group_gives_exact_zeros(mode: str) -> None:
    # 0.1 is not exact in binary: the float mean of 16 copies can differ from 0.1 by an ulp, which a
    # std of ~0 would blow up; the group must still come out as exact zeros.
    rewards = torch.tensor([0.1] * 16 + [1.0] * 8 + [0.0] * 8)
    adv = group_advantages(rewards, 16, mode=mode)
    assert torch.equal(adv[:16], torch.zeros(16))
    assert adv[16:].abs().sum() > 0
    assert torch.isfinite(adv).all()


def test_zero_variance_groups_flags_each_group() -> None:
    flags = zero_variance_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0]), 4)
    assert flags.tolist() == [False, True, True]


def test_single_sample_groups_are_zero_not_nan() -> None:
    for mode in ("grpo", "dr_grpo", "reinforce_pp", "rank"):
        assert torch.equal(group_advantages(torch.tensor([3.0, 1.0]), 1, mode=mode), torch.zeros(2))


@pytest.mark.parametrize(
    ("rewards", "group_size", "kwargs", "message"),
    [
        (torch.ones(6), 4, {}, "do not split into groups of 4"),
        (torch.ones(2, 4), 4, {}, "flat"),
        (torch.tensor([1.0, float("nan")]), 2, {}, "NaN or inf"),
        (torch.ones(4), 2, {"mode": "ppo"}, "choose one of ['dr_grpo', 'grpo', 'rank', 'reinforce_pp', 'rloo']"),
        (torch.ones(4), 1, {"mode": "rloo"}, "group_size >= 2"),
        (torch.ones(4), 0, {}, "group_size must be >= 1"),
        (torch.ones(4), 2, {"clip": (1.0, 0.0)}, "lo <= hi"),
    ],
)
def test_bad_input_is_a_clear_error(rewards: torch.Tensor, group_size: int, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        group_advantages(rewards, group_size, **kwargs)
    assert message in str(info.value)


def test_integer_and_half_rewards_are_accepted() -> None:
    adv_int = group_advantages(torch.tensor([1, 0, 0, 0]), 4, eps=0.0)
    adv_half = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.bfloat16), 4, eps=0.0)
    assert adv_int.dtype == adv_half.dtype == torch.float32
    assert torch.allclose(adv_int, adv_half)


# ---- properties -------------------------------------------------------------------------------

reward = st.floats(min_value=-100, max_value=100, allow_nan=False, allow_subnormal=False)


@st.composite
def grouped_rewards(draw: st.DrawFn, min_group: int = 2) -> tuple[torch.Tensor, int]:
    group_size = draw(st.integers(min_group, 8))
    n_groups = draw(st.integers(1, 4))
    values = draw(st.lists(reward, min_size=group_size * n_groups, max_size=group_size * n_groups))
    return torch.tensor(values, dtype=torch.float64), group_size


@FAST
@given(grouped_rewards(), st.sampled_from(["grpo", "dr_grpo", "rloo", "reinforce_pp", "rank"]))
def test_advantages_sum_to_zero_per_group(data: tuple[torch.Tensor, int], mode: str) -> None:
    rewards, g = data
    adv = group_advantages(rewards, g, mode=mode)
    scale = max(1.0, adv.abs().max().item())
    assert adv.view(-1, g).sum(dim=1).abs().max().item() <= 1e-9 * scale * g


@FAST
@given(grouped_rewards())
def test_rloo_is_mean_centred_times_g_over_g_minus_one(data: tuple[torch.Tensor, int]) -> None:
    rewards, g = data
    rloo = group_advantages(rewards, g, mode="rloo")
    centred = group_advantages(rewards, g, mode="dr_grpo")
    assert torch.allclose(rloo, centred * g / (g - 1), atol=1e-9, rtol=1e-9)


@FAST
@given(st.integers(2, 8), st.data(), st.floats(0.01, 100), st.floats(-50, 50))
def test_grpo_and_rank_ignore_the_reward_scale(g: int, data: st.DataObject, a: float, b: float) -> None:
    # rewards on a 0.5 grid: an affine map keeps their order and ties exactly (no rounding collisions)
    ints = data.draw(st.lists(st.integers(-20, 20), min_size=2 * g, max_size=2 * g))
    rewards = torch.tensor(ints, dtype=torch.float64) / 2
    moved = rewards * a + b
    assert torch.allclose(group_advantages(rewards, g, eps=0.0), group_advantages(moved, g, eps=0.0), atol=1e-6)
    assert torch.equal(group_advantages(rewards, g, mode="rank"), group_advantages(moved, g, mode="rank"))


@FAST
@given(st.integers(1, 8), st.integers(1, 4), reward, st.sampled_from(sorted(ADVANTAGE_MODES)), st.booleans())
def test_flat_groups_are_exact_zeros(g: int, n: int, value: float, mode: str, half: bool) -> None:
    if mode == "rloo" and g < 2:
        g = 2
    dtype = torch.float32 if half else torch.float64
    adv = group_advantages(torch.full((g * n,), value, dtype=dtype), g, mode=mode)
    assert torch.equal(adv, torch.zeros_like(adv))


@FAST
@given(grouped_rewards(min_group=1), st.sampled_from(sorted(ADVANTAGE_MODES)), st.booleans())
def test_never_nan(data: tuple[torch.Tensor, int], mode: str, unbiased: bool) -> None:
    rewards, g = data
    if mode == "rloo" and g < 2:
        return
    adv = group_advantages(rewards.float(), g, mode=mode, std_unbiased=unbiased)
    assert torch.isfinite(adv).all()
    if mode == "rank":
        assert adv.abs().max() <= 1.0
