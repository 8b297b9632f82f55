"""policy_loss: hand-computed values per aggregation, clipping at its boundaries, KL, TIS, GSPO, masks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.algo.helpers import plain_loss

FAST = settings(max_examples=40, deadline=None)
OLD = -1.0  # old log-prob of every token in the hand-made batch

# Two completions, T = 3. Row 0: advantage +1, ratios 1.1, 1.3, 0.7. Row 1: advantage −2, ratios 0.9, 0.5 and
# one padded position. With ε = 0.2, per-token losses −min(ρA, clip(ρ)A) are
#   row 0: −1.1, −1.2 (clipped high), −0.7      row 1: 1.8, 1.6 (clipped low)
RATIOS = [[1.1, 1.3, 0.7], [0.9, 0.5, 1.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -2.0]


def _batch(requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    old = torch.full((2, 3), OLD)
    logp = (old + torch.tensor(RATIOS).log()).requires_grad_(requires_grad)
    return logp, old, torch.tensor(ADV), torch.tensor(MASK)


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        ("seq_mean_token_mean", ((-1.1 - 1.2 - 0.7) / 3 + (1.8 + 1.6) / 2) / 2),  # 0.35
        ("token_mean", (-1.1 - 1.2 - 0.7 + 1.8 + 1.6) / 5),  # 0.08
        ("seq_mean_token_sum", ((-1.1 - 1.2 - 0.7) / 4 + (1.8 + 1.6) / 4) / 2),  # max_len 4 → 0.05
    ],
)
def test_hand_computed_loss_per_aggregation(agg: str, expected: float) -> None:
    loss, m = plain_loss(*_batch(), agg=agg, max_len=4)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["pg_loss"].item() == pytest.approx(expected, abs=1e-6)
    assert m["kl_loss"].item() == 0.0
    assert m["clip_frac_high"].item() == pytest.approx(1 / 5)
    assert m["clip_frac_low"].item() == pytest.approx(1 / 5)
    assert m["clip_frac"].item() == pytest.approx(2 / 5)
    assert m["ratio_mean"].item() == pytest.approx((1.1 + 1.3 + 0.7 + 0.9 + 0.5) / 5, abs=1e-6)
    assert m["ratio_min"].item() == pytest.approx(0.5, abs=1e-6)
    assert m["ratio_max"].item() == pytest.approx(1.3, abs=1e-6)
    assert "kl" not in m and "entropy" not in m


def test_clip_higher_is_asymmetric() -> None:
    # DAPO ε_high = 0.28: ratio 1.3 is now clipped at 1.28; the low side is unchanged
    loss, m = plain_loss(*_batch(), clip_low=0.2, clip_high=0.28, agg="token_mean")
    assert loss.item() == pytest.approx((-1.1 - 1.28 - 0.7 + 1.8 + 1.6) / 5, abs=1e-6)
    loss, m = plain_loss(*_batch(), clip_low=0.2, clip_high=0.35, agg="token_mean")
    assert loss.item() == pytest.approx((-1.1 - 1.3 - 0.7 + 1.8 + 1.6) / 5, abs=1e-6)
    assert m["clip_frac_high"].item() == 0.0 and m["clip_frac_low"].item() == pytest.approx(1 / 5)


def test_kl_is_an_explicit_term_aggregated_like_the_surrogate() -> None:
    logp, old, adv, mask = _batch()
    # reference = old policy, so d = log π_ref − log π_θ = −ln ρ and k3 = 1/ρ + ln ρ − 1
    k3 = [[1 / r + math.log(r) - 1 for r in row] for row in RATIOS]
    kl_seq_mean = (sum(k3[0]) / 3 + (k3[1][0] + k3[1][1]) / 2) / 2
    loss, m = plain_loss(logp, old, adv, mask, ref_logp=old.clone(), beta=0.1)
    assert m["kl_loss"].item() == pytest.approx(0.1 * kl_seq_mean, abs=1e-6)
    assert loss.item() == pytest.approx(0.35 + 0.1 * kl_seq_mean, abs=1e-6)
    assert m["kl"].item() == pytest.approx((sum(k3[0]) + k3[1][0] + k3[1][1]) / 5, abs=1e-6)
    k1 = [[math.log(r) for r in row] for row in RATIOS]
    _, m1 = plain_loss(logp, old, adv, mask, ref_logp=old.clone(), beta=0.0, kl_kind="k1", agg="token_mean")
    assert m1["kl"].item() == pytest.approx((sum(k1[0]) + k1[1][0] + k1[1][1]) / 5, abs=1e-6)  # measured only


def test_k1_as_a_loss_term_is_refused() -> None:
    # E_{o~π_θ}[∇ log π_θ(o)] = Σ_o ∇π_θ(o) = ∇1 = 0: β·k1 in the loss moves nothing on average.
    logits = torch.randn(5, dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(logits, -1)
    expected_grad = torch.autograd.grad((probs.detach() * torch.log_softmax(logits, -1)).sum(), logits)[0]
    assert expected_grad.abs().max() < 1e-12
    logp, old, adv, mask = _batch()
    with pytest.raises(ValueError, match="regularises nothing"):
        plain_loss(logp, old, adv, mask, ref_logp=old.clone(), beta=0.1, kl_kind="k1")


def test_beta_zero_measures_kl_without_touching_the_gradient() -> None:
    logp_a, old, adv, mask = _batch(requires_grad=True)
    logp_b = logp_a.detach().clone().requires_grad_()
    loss_a, m = plain_loss(logp_a, old, adv, mask, ref_logp=old - 0.3, beta=0.0)
    loss_b, _ = plain_loss(logp_b, old, adv, mask)
    loss_a.backward()
    loss_b.backward()
    assert loss_a.item() == loss_b.item() and torch.equal(logp_a.grad, logp_b.grad)
    assert m["kl"].item() > 0 and m["kl_loss"].item() == 0.0


def test_on_policy_gradient_is_minus_advantage_over_length() -> None:
    # ratio = 1 everywhere: ∂L/∂logp_{i,t} = −A_i / (|o_i| · #sequences) under the GRPO paper's aggregation
    logp = torch.full((2, 3), -0.7, requires_grad=True)
    loss, _ = plain_loss(logp, logp.detach().clone(), torch.tensor([1.0, -2.0]), torch.tensor(MASK))
    loss.backward()
    assert loss.item() == pytest.approx(-(1.0 - 2.0) / 2, abs=1e-6)
    expected = [[-1 / 6, -1 / 6, -1 / 6], [2 / 4, 2 / 4, 0.0]]
    assert logp.grad.tolist() == [pytest.approx(row, abs=1e-6) for row in expected]


@pytest.mark.parametrize(
    ("adv", "ratio", "grad_is_zero"),
    [
        (1.0, 1.2 + 1e-3, True),  # positive advantage past 1+ε: clipped, no push further up
        (1.0, 1.2 - 1e-3, False),
        (1.0, 0.5, False),  # positive advantage far below 1−ε: still pushed up (min keeps ρA)
        (-1.0, 0.8 - 1e-3, True),  # negative advantage past 1−ε: clipped
        (-1.0, 0.8 + 1e-3, False),
        (-1.0, 3.0, False),  # negative advantage far above 1+ε: still pushed down
    ],
)
def test_clip_boundaries(adv: float, ratio: float, grad_is_zero: bool) -> None:
    old = torch.full((1, 1), -2.0, dtype=torch.float64)
    logp = (old + math.log(ratio)).requires_grad_()
    loss, _ = plain_loss(logp, old, torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1))
    loss.backward()
    if grad_is_zero:
        assert logp.grad.item() == 0.0
        assert loss.item() == pytest.approx(-(1.2 if adv > 0 else 0.8) * adv, abs=1e-12)
    else:
        assert logp.grad.item() == pytest.approx(-adv * ratio, rel=1e-9)  # ∂(−ρA)/∂logp = −ρA


@pytest.mark.parametrize("adv", [1.0, -1.0])
@pytest.mark.parametrize("bound", [0.8, 1.2])
def test_value_exactly_at_the_boundary(adv: float, bound: float) -> None:
    old = torch.zeros(1, 1, dtype=torch.float64)
    logp = torch.full((1, 1), math.log(bound), dtype=torch.float64)
    loss, m = plain_loss(logp, old, torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-bound * adv, abs=1e-12)
    assert m["clip_frac"].item() == 0.0  # exactly on the boundary is not "clipped"


def test_gspo_sequence_ratio_matches_the_sequence_level_objective() -> None:
    gen = torch.Generator().manual_seed(3)
    old = -torch.rand(3, 5, generator=gen, dtype=torch.float64) * 3
    logp_tok = (old + torch.randn(3, 5, generator=gen, dtype=torch.float64) * 1e-3).requires_grad_()
    logp_seq = logp_tok.detach().clone().requires_grad_()
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    loss, m = plain_loss(logp_tok, old, adv, mask, clip_low=3e-4, clip_high=4e-4, ratio_level="sequence")
    # GSPO eq. (5) written directly: s_i = exp(mean_t log ρ_{i,t}); L = −1/G Σ_i min(s_i A_i, clip(s_i) A_i)
    m_ = mask.double()
    s = torch.exp(((logp_seq - old) * m_).sum(1) / m_.sum(1))
    direct = -torch.minimum(s * adv, s.clamp(1 - 3e-4, 1 + 4e-4) * adv).mean()
    loss.backward()
    direct.backward()
    assert loss.item() == pytest.approx(direct.item(), abs=1e-12)
    assert torch.allclose(logp_tok.grad, logp_seq.grad, atol=1e-12)
    assert m["ratio_max"].item() == pytest.approx(s.max().item(), abs=1e-12)


def test_gspo_hand_computed() -> None:
    # s_0 = (1.1·1.3·0.7)^(1/3) = 1.001^(1/3) inside [1−3e−4, 1+4e−4]; s_1 = sqrt(0.9·0.5) clipped to 1−3e−4
    s0, s1 = 1.001 ** (1 / 3), math.sqrt(0.45)
    expected = (-s0 * 1.0 + min(-2.0 * s1, -2.0 * (1 - 3e-4)) * -1) / 2
    loss, m = plain_loss(*_batch(), clip_low=3e-4, clip_high=4e-4, ratio_level="sequence")
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["clip_frac_low"].item() == pytest.approx(2 / 5)  # both tokens of row 1


def test_truncated_importance_sampling() -> None:
    logp, old, adv, mask = _batch(requires_grad=True)
    # π_old/π_sampler = 0.5, 3.0, 1.0 on row 0 (capped at 2), 1 on row 1
    sampler = (old - torch.tensor([[0.5, 3.0, 1.0], [1.0, 1.0, 1.0]]).log()).requires_grad_()
    loss, m = plain_loss(logp, old, adv, mask, agg="token_mean", sampler_logp=sampler, tis_cap=2.0)
    assert loss.item() == pytest.approx((-1.1 * 0.5 - 1.2 * 2.0 - 0.7 * 1.0 + 1.8 + 1.6) / 5, abs=1e-6)
    assert m["tis_weight_mean"].item() == pytest.approx((0.5 + 2.0 + 1.0 + 1.0 + 1.0) / 5, abs=1e-6)
    assert m["tis_truncated_frac"].item() == pytest.approx(1 / 5)
    loss.backward()
    assert sampler.grad is None  # the weight is a detached constant


def test_entropy_metric_from_logits_or_tensor() -> None:
    logits = torch.zeros(2, 3, 8)
    logits[1, 2] = torch.tensor([1e4] + [0.0] * 7)  # padded position with entropy 0 must not count
    _, m = plain_loss(*_batch(), logits=logits)
    assert m["entropy"].item() == pytest.approx(math.log(8), abs=1e-6)
    _, m = plain_loss(*_batch(), entropy=torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]]))
    assert m["entropy"].item() == pytest.approx(3.0)


def test_positive_advantage_token_made_likelier_lowers_the_loss() -> None:
    logp, old, adv, mask = _batch(requires_grad=True)
    loss, _ = plain_loss(logp, old, adv, mask)
    loss.backward()
    # row 0 token 0 (A > 0, ρ inside the clip range): raising its log-prob lowers the loss
    assert logp.grad[0, 0] < 0
    bumped = logp.detach().clone()
    bumped[0, 0] += 0.01
    assert plain_loss(bumped, old, adv, mask)[0] < loss
    assert logp.grad[1, 0] > 0  # negative advantage: raising it raises the loss


def test_fully_masked_rows_and_batches_do_not_produce_nan() -> None:
    logp = torch.tensor([[-1.0, float("nan")], [float("-inf"), float("inf")]], requires_grad=True)
    old = torch.tensor([[-1.2, float("nan")], [0.0, float("-inf")]])
    mask = torch.tensor([[1, 0], [0, 0]])
    for agg in ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum"):
        loss, m = plain_loss(logp, old, torch.tensor([1.0, 1.0]), mask, agg=agg, max_len=2, ref_logp=old, beta=0.1)
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in m.values())
    loss, m = plain_loss(logp, old, torch.tensor([1.0, 1.0]), torch.zeros(2, 2), ref_logp=old, beta=0.1)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(2, 2))
    assert all(torch.isfinite(v) for v in m.values()) and m["ratio_mean"].item() == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": 0.1}, "beta > 0 needs ref_logp"),
        ({"agg": "sum"}, "choose one of ['seq_mean_token_mean', 'seq_mean_token_sum', 'token_mean']"),
        ({"agg": "seq_mean_token_sum"}, "needs max_len"),
        ({"ratio_level": "batch"}, "unknown ratio_level"),
        ({"kl_kind": "k9"}, "unknown kl_kind"),
        ({"tis_cap": 2.0}, "needs both sampler_logp and tis_cap"),
        ({"clip_low": 1.0}, "clip_low < 1"),
        ({"beta": -1.0}, "beta must be >= 0"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        plain_loss(*_batch(), **kwargs)
    assert message in str(info.value)


def test_bad_shapes_are_clear_errors() -> None:
    logp, old, adv, mask = _batch()
    with pytest.raises(ValueError, match="advantages must be"):
        plain_loss(logp, old, adv.unsqueeze(-1), mask)
    with pytest.raises(ValueError, match="mask shape"):
        plain_loss(logp, old, adv, mask[:, :2])
    with pytest.raises(ValueError, match="ref_logp shape"):
        plain_loss(logp, old, adv, mask, ref_logp=old[:1], beta=0.1)


# ---- masks, as a property ---------------------------------------------------------------------

garbage = st.sampled_from([0.0, -1e4, 1e4, 7.5, float("inf"), float("-inf"), float("nan")])


@FAST
@given(
    st.integers(0, 2**31 - 1),
    garbage,
    st.sampled_from(["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"]),
    st.sampled_from(["token", "sequence"]),
    st.sampled_from(["k1", "k2", "k3"]),
)
def test_masked_positions_change_nothing(seed: int, junk: float, agg: str, level: str, kind: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, t = 4, 6
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 4
    logp = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3
    ref = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3
    sampler = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3
    mask = torch.rand(b, t, generator=gen) < 0.6
    mask[0] = False  # always one empty row
    adv = torch.randn(b, generator=gen, dtype=torch.float64)

    def run(fill: float) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        def dirty(x: torch.Tensor) -> torch.Tensor:
            return torch.where(mask, x, torch.tensor(fill, dtype=x.dtype))

        lp = dirty(logp).requires_grad_()
        beta = 0.0 if kind == "k1" else 0.05  # k1 is a measurement only
        kw = {"agg": agg, "ratio_level": level, "kl_kind": kind, "max_len": t, "tis_cap": 2.0, "beta": beta}
        loss, m = plain_loss(lp, dirty(old), adv, mask, ref_logp=dirty(ref), sampler_logp=dirty(sampler), **kw)
        loss.backward()
        return loss, m, lp.grad

    clean_loss, clean_m, clean_grad = run(0.0)
    loss, m, grad = run(junk)
    assert torch.isfinite(clean_loss) and torch.equal(loss, clean_loss)
    assert torch.equal(grad, clean_grad)
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))
    assert m.keys() == clean_m.keys() and all(torch.equal(m[k], clean_m[k]) for k in m)


def test_a_diverged_token_gives_a_finite_loss() -> None:
    # log-ratio 200 would overflow exp() in float32; it is clamped at ±20 (gradient zero beyond)
    old = torch.zeros(1, 2)
    logp = torch.tensor([[200.0, 0.1]], requires_grad=True)
    for adv in (1.0, -1.0):
        for level in ("token", "sequence"):
            loss, m = plain_loss(logp, old, torch.tensor([adv]), torch.ones(1, 2), ratio_level=level)
            (grad,) = torch.autograd.grad(loss, logp)
            assert torch.isfinite(loss) and torch.isfinite(grad).all() and torch.isfinite(m["ratio_max"])
