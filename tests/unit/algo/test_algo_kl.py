"""kl_estimate: hand-computed k1/k2/k3, the inequalities between them, and unbiasedness on a categorical."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo.algo import kl_estimate

FAST = settings(max_examples=60, deadline=None)
logprob = st.floats(min_value=-30, max_value=0, allow_nan=False, allow_subnormal=False)


def test_hand_computed_values() -> None:
    # π_θ(o) = 0.5, π_ref(o) = 0.25: log-ratio log π_θ − log π_ref = ln 2
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    ln2 = 0.6931471805599453
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(ln2, abs=1e-6)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * ln2 * ln2, abs=1e-6)  # 0.2402265
    # k3 = π_ref/π_θ − ln(π_ref/π_θ) − 1 = 0.5 + ln 2 − 1 = 0.1931472
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 + ln2 - 1, abs=1e-6)
    assert kl_estimate(logp, ref).item() == kl_estimate(logp, ref, "k3").item()  # k3 is the default


def test_k3_pulls_back_a_token_raised_far_above_the_reference() -> None:
    """d = log π_ref − log π_θ far below 0 (π_θ raised e^24 times over π_ref): k3 = e^d − d − 1 ≈ −d − 1 with
    gradient 1 in log π_θ; a clamp from below flattened it to a constant with gradient 0. Far above 0 the clamp
    stays (e^d would overflow) and the value is finite."""
    ref = torch.full((3,), -25.0)
    logp = torch.tensor([-6.0, -4.9, -1.0], requires_grad=True)
    k3 = kl_estimate(logp, ref, "k3")
    k3.sum().backward()
    d = (ref - logp).detach()
    assert torch.allclose(k3.detach(), torch.exp(d) - d - 1, atol=1e-5)  # 18, 19.1, 23
    assert logp.grad is not None and torch.allclose(logp.grad, 1 - torch.exp(d), atol=1e-6)  # ≈ 1 each
    huge = kl_estimate(torch.tensor([-200.0]), torch.tensor([0.0]), "k3")
    assert torch.isfinite(huge).all()


def test_unknown_kind_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"choose one of \['k1', 'k2', 'k3'\]"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


@FAST
@given(st.lists(st.tuples(logprob, logprob), min_size=1, max_size=16))
def test_k2_k3_nonnegative_and_ordered(pairs: list[tuple[float, float]]) -> None:
    logp = torch.tensor([p for p, _ in pairs], dtype=torch.float64)
    ref = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    k1, k2, k3 = (kl_estimate(logp, ref, k) for k in ("k1", "k2", "k3"))
    assert (k2 >= 0).all() and (k3 >= 0).all()
    # with d = log π_ref − log π_θ: e^d − 1 − d − d²/2 has the sign of d, so k3 ≥ k2 iff π_ref ≥ π_θ
    d = ref - logp
    assert (k3[d >= 0] >= k2[d >= 0] - 1e-12).all()
    assert (k3[d <= 0] <= k2[d <= 0] + 1e-12).all()
    # and k3 = k1 + (π_ref/π_θ − 1): k3 ≥ k1 exactly when π_ref ≥ π_θ
    assert (k3[d >= 0] >= k1[d >= 0] - 1e-12).all()
    assert (k3[d <= 0] <= k1[d <= 0] + 1e-12).all()


@FAST
@given(st.lists(logprob, min_size=1, max_size=16), st.sampled_from(["k1", "k2", "k3"]))
def test_zero_when_the_policies_agree(values: list[float], kind: str) -> None:
    logp = torch.tensor(values)
    assert torch.equal(kl_estimate(logp, logp.clone(), kind), torch.zeros_like(logp))


@FAST
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=12), st.lists(st.floats(-5, 5), min_size=2, max_size=12))
def test_k1_and_k3_are_unbiased_on_a_categorical(a: list[float], b: list[float]) -> None:
    n = min(len(a), len(b))
    logp = torch.log_softmax(torch.tensor(a[:n], dtype=torch.float64), 0)
    ref = torch.log_softmax(torch.tensor(b[:n], dtype=torch.float64), 0)
    p = logp.exp()
    exact = (p * (logp - ref)).sum()  # KL(π_θ ‖ π_ref), summed over the whole support
    for kind in ("k1", "k3"):
        expectation = (p * kl_estimate(logp, ref, kind)).sum()  # E_{o~π_θ}[estimator]
        assert expectation.item() == pytest.approx(exact.item(), abs=1e-9)


def test_k3_is_finite_far_from_the_reference() -> None:
    logp = torch.tensor([-1000.0, 0.0, -0.5], requires_grad=True)
    ref = torch.tensor([0.0, -1000.0, -0.5])
    k3 = kl_estimate(logp, ref, "k3")
    k3.sum().backward()
    assert torch.isfinite(k3).all() and torch.isfinite(logp.grad).all()
    assert (k3 >= 0).all()
    # the clamp only engages beyond |d| = 20: below it k3 is exact
    x, r = torch.tensor([-15.0]), torch.tensor([0.0])
    assert kl_estimate(x, r).item() == pytest.approx(math.exp(15.0) - 15.0 - 1.0, rel=1e-6)


def test_k3_is_never_negative_from_rounding() -> None:
    # e^d − d − 1 in floating point gave −1.1e-16 for policies that agree to ~1e-16 (found by hypothesis)
    d = torch.tensor([1e-16, -1e-16, 2.2e-16, -3e-12, 1e-10, 1e-300], dtype=torch.float64)
    for dtype in (torch.float64, torch.float32):
        assert (kl_estimate(torch.zeros(6, dtype=dtype), d.to(dtype), "k3") >= 0).all()
