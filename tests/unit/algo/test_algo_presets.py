"""Presets: the published values, and every preset's settings accepted by the functions they configure."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grpo.algo import PRESETS, LossConfig, get_preset, group_advantages, policy_loss


def test_grpo_preset_is_r1s_defaults() -> None:
    p = get_preset("grpo")
    assert (p.beta, p.clip_low, p.clip_high, p.kl_kind, p.group_size) == (0.001, 0.2, 0.2, "k3", 16)
    assert (p.agg, p.advantage_mode, p.ratio_level) == ("seq_mean_token_mean", "grpo", "token")
    assert p.skip_zero_variance and not p.refill_zero_variance and p.ref_refresh_steps == 400
    # the seeds' pseudo-code (torch.std: Bessel-corrected), TRL and veRL; R1 trains on truncated answers
    assert (p.std_unbiased, p.advantage_eps, p.mask_truncated) == (True, 1e-4, False)
    two = group_advantages(torch.tensor([0.0, 1.0]), 2, **p.advantage_kwargs())
    assert two.tolist() == pytest.approx([-0.7071, 0.7071], abs=1e-3)  # ÷(G−1): ±1/√2 for G = 2, not ±1


def test_variant_presets() -> None:
    dapo = get_preset("dapo")
    assert (dapo.clip_low, dapo.clip_high, dapo.beta, dapo.agg) == (0.2, 0.28, 0.0, "token_mean")
    assert dapo.refill_zero_variance and dapo.overlong_soft_penalty and dapo.mask_truncated
    dr = get_preset("dr_grpo")
    assert (dr.advantage_mode, dr.agg, dr.beta) == ("dr_grpo", "seq_mean_token_sum", 0.0)
    gspo = get_preset("gspo")
    assert (gspo.ratio_level, gspo.clip_low, gspo.clip_high) == ("sequence", 3e-4, 4e-4)
    assert get_preset("rloo").advantage_mode == "rloo"
    assert get_preset("reinforce_pp").advantage_mode == "reinforce_pp"


def test_unknown_preset_lists_the_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        get_preset("ppo")
    for name in ("dapo", "dr_grpo", "grpo", "gspo", "reinforce_pp", "rloo"):
        assert name in str(info.value)


def test_presets_are_frozen_and_overridable() -> None:
    p = get_preset("grpo")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.beta = 0.5  # type: ignore[misc]
    q = p.with_overrides(beta=0.04, group_size=8)
    assert (q.beta, q.group_size, p.beta) == (0.04, 8, 0.001)
    assert q.to_dict()["beta"] == 0.04 and isinstance(q, LossConfig)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_drives_the_functions(name: str) -> None:
    p = get_preset(name)
    assert p.name == name and p.source
    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    adv = group_advantages(rewards, 4, **p.advantage_kwargs())
    old = -torch.rand(8, 5, generator=gen)
    logp = (old + 0.01 * torch.randn(8, 5, generator=gen)).requires_grad_()
    kwargs = p.loss_kwargs()
    extra = {"ref_logp": old.clone()} if p.beta > 0 else {}
    loss, metrics = policy_loss(logp, old, adv, torch.ones(8, 5), max_len=16, **kwargs, **extra)
    loss.backward()
    assert torch.isfinite(loss) and logp.grad.abs().sum() > 0
    assert ("kl" in metrics) == (p.beta > 0)
