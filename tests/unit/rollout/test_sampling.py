"""Sampling helpers: top-k / top-p truncation, log-probs before truncation, stop strings."""

from __future__ import annotations

import math

import torch

from grpo.rollout.engines.base import SamplingParams
from grpo.rollout.engines.sampling import find_stop, sample_tokens, truncate

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def test_top_k_keeps_the_k_largest() -> None:
    kept = torch.isfinite(truncate(LOGITS.clone(), top_k=2, top_p=1.0))
    assert kept.tolist() == [[True, True, False, False]]


def test_top_p_keeps_the_smallest_nucleus_covering_p() -> None:
    assert torch.isfinite(truncate(LOGITS.clone(), 0, 0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(truncate(LOGITS.clone(), 0, 0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(truncate(LOGITS.clone(), 0, 0.01)).tolist() == [[True, False, False, False]]


def test_logprob_is_taken_before_truncation() -> None:
    params = SamplingParams(temperature=1.0, top_k=1)
    token, logprob = sample_tokens(LOGITS, params, torch.Generator().manual_seed(0))
    assert token.item() == 0
    assert math.isclose(logprob.item(), math.log(0.5), rel_tol=1e-5)  # not log(1) of the truncated distribution


def test_temperature_scales_the_logprob_and_zero_is_greedy_at_t1() -> None:
    _, lp = sample_tokens(LOGITS, SamplingParams(temperature=0.5, top_k=1), None)
    assert math.isclose(lp.item(), torch.log_softmax(LOGITS / 0.5, -1)[0, 0].item(), rel_tol=1e-5)
    token, lp0 = sample_tokens(LOGITS, SamplingParams(temperature=0), None)
    assert token.item() == 0 and math.isclose(lp0.item(), math.log(0.5), rel_tol=1e-5)


def test_sampling_follows_the_distribution() -> None:
    g = torch.Generator().manual_seed(0)
    batch = LOGITS.expand(4000, 4)
    tokens, _ = sample_tokens(batch, SamplingParams(temperature=1.0), g)
    freq = torch.bincount(tokens, minlength=4).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03), freq


def test_find_stop_returns_the_end_of_the_earliest_stop() -> None:
    assert find_stop("abc</answer>tail", ("</answer>",)) == len("abc</answer>")
    assert find_stop("x END y STOP", ("STOP", "END")) == 5
    assert find_stop("nothing here", ("STOP",)) is None
