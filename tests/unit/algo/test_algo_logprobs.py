"""token_logprobs, entropy_from_logits, sft_loss against the obvious definitions."""

from __future__ import annotations

import math

import pytest
import torch

from grpo.algo import entropy_from_logits, sft_loss, token_logprobs
from grpo.common.logprobs import all_token_logprobs


def _reference(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return torch.log_softmax(logits.double() / temperature, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_matches_log_softmax_gather(temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen) * 3
    ids = torch.randint(0, 11, (3, 5), generator=gen)
    got = token_logprobs(logits, ids, temperature)
    assert got.shape == (3, 5) and got.dtype == torch.float32
    assert torch.allclose(got.double(), _reference(logits, ids, temperature), atol=1e-5)


def test_gradient_matches_log_softmax_gather() -> None:
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(2, 4, 7, generator=gen)
    ids = torch.randint(0, 7, (2, 4), generator=gen)
    a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
    token_logprobs(a, ids, 0.9).sum().backward()
    torch.log_softmax(b / 0.9, -1).gather(-1, ids.unsqueeze(-1)).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_stable_for_large_logits() -> None:
    logits = torch.tensor([[[1e4, -1e4, 3e4, 0.0]]])
    for tok in range(4):
        ids = torch.tensor([[tok]])
        got = token_logprobs(logits, ids)
        assert torch.isfinite(got).all()
        assert got.double().item() == pytest.approx(_reference(logits, ids).item(), abs=1e-3)
    assert token_logprobs(logits, torch.tensor([[2]])).item() == 0.0  # the argmax holds all the mass


def test_half_precision_is_computed_in_float32() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(2, 3, 9, generator=gen) * 4).to(torch.bfloat16)
    ids = torch.randint(0, 9, (2, 3), generator=gen)
    got = token_logprobs(logits, ids)
    assert got.dtype == torch.float32
    assert torch.allclose(got, token_logprobs(logits.float(), ids), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_samplers_full_distribution_agrees_with_the_trainers_token_logprobs(dtype: torch.dtype) -> None:
    """vLLM's hook hands over every token's log-prob (`all_token_logprobs` of the temperature-scaled logits);
    the trainer recomputes `token_logprobs(logits, ids, T)`. The sampled token's must be the same number."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 5, 11, generator=gen) * 6).to(dtype)
    ids = torch.randint(0, 11, (2, 5), generator=gen)
    temperature = 0.7
    full = all_token_logprobs(logits.float() / temperature)  # vLLM's sampler scales float32 logits
    assert full.dtype == torch.float32 and full.shape == logits.shape
    picked = full.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    # log_softmax and z - logsumexp(z) round differently in the last bits (logits up to ~25 here).
    torch.testing.assert_close(picked, token_logprobs(logits, ids, temperature), atol=2e-5, rtol=0)
    torch.testing.assert_close(all_token_logprobs(logits.float()).exp().sum(-1), torch.ones(2, 5))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long), 0.0)
    with pytest.raises(ValueError, match="disagree on"):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long))


def test_entropy() -> None:
    uniform = torch.zeros(2, 3, 8)
    assert torch.allclose(entropy_from_logits(uniform), torch.full((2, 3), math.log(8)), atol=1e-6)
    peaked = torch.tensor([[1e4, 0.0, 0.0]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
    p = torch.tensor([0.5, 0.25, 0.25])
    # H = −Σ p ln p = 0.5 ln 2 + 2·0.25 ln 4 = 1.5 ln 2
    assert entropy_from_logits(p.log()).item() == pytest.approx(1.5 * math.log(2), abs=1e-6)


def test_sft_loss_is_the_token_mean_over_response_tokens() -> None:
    logits = torch.zeros(2, 3, 4)  # uniform over 4 tokens: every NLL is ln 4
    logits[1, 0] = torch.tensor([0.0, 0.0, 0.0, math.log(2.0)])  # p(3) = 2/5 → NLL ln 2.5
    labels = torch.tensor([[1, 2, -100], [3, -100, -100]])  # -100 at masked positions is fine
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    expected = (2 * math.log(4) + math.log(2.5)) / 3
    assert sft_loss(logits, labels, mask).item() == pytest.approx(expected, abs=1e-6)
    assert sft_loss(logits, labels, torch.zeros_like(mask)).item() == 0.0


def test_entropy_row_by_row_equals_the_whole_batch_at_any_temperature() -> None:
    logits = torch.randn(3, 5, 11, dtype=torch.float64) * 4
    for t in (1.0, 0.7):
        z = logits / t
        whole = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)
        assert torch.allclose(entropy_from_logits(logits, t), whole, atol=1e-12)
    assert entropy_from_logits(logits.to(torch.bfloat16)).dtype == torch.float32
