"""Generate request checks: each bad sampling parameter gets a message naming the field."""

from __future__ import annotations

import pytest

from grpo.rollout.request_checks import BadRequest, sampling_params
from grpo.rollout.service import Limits
from grpo.v1 import rollout_pb2

LIMITS = Limits(max_prompts=4, max_n=8, max_new_tokens_cap=100)


def _params(**kw: object) -> rollout_pb2.SamplingParams:
    base = {"n": 2, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 10}
    return rollout_pb2.SamplingParams(**{**base, **kw})


def test_valid_request_converts() -> None:
    p = sampling_params(_params(top_p=0, top_k=5, stop=["</answer>"], seed=3), LIMITS)
    assert (p.n, p.top_p, p.top_k, p.stop, p.seed) == (2, 1.0, 5, ("</answer>",), 3)
    assert sampling_params(_params(), LIMITS).seed is None
    # The smallest temperature and top_p the float32 sampler takes (see MIN_SAMPLING_VALUE).
    p = sampling_params(_params(temperature=1e-30, top_p=1e-30), LIMITS)
    assert (p.temperature, p.top_p) == (1e-30, 1e-30)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"n": 0}, r"sampling\.n must be >= 1"),
        ({"n": 9}, r"sampling\.n = 9 is over this replica's limit of 8"),
        ({"temperature": -0.1}, r"temperature must be a finite number >= 0"),
        ({"temperature": float("nan")}, r"temperature must be a finite number >= 0 \(got nan\)"),
        ({"temperature": float("inf")}, r"temperature must be a finite number >= 0 \(got inf\)"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_p": -0.5}, r"top_p must be in \(0, 1\]"),
        ({"temperature": 1e-300}, r"temperature 1e-300 is too small to sample with .*give 0 for greedy or at least"),
        ({"temperature": 9e-31}, r"temperature 9e-31 is too small to sample with"),
        ({"top_p": 1e-300}, r"top_p 1e-300 is too small to sample with .* give at least 1e-30"),
        ({"top_k": -1}, r"top_k must be >= 0"),
        ({"max_new_tokens": 0}, r"max_new_tokens must be >= 1"),
        ({"max_new_tokens": 101}, r"over the cap of 100"),
        ({"stop": [""]}, r"empty strings"),
    ],
)
def test_bad_sampling_params(override: dict, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        sampling_params(_params(**override), LIMITS)


def test_temperature_left_out_means_sampling_and_zero_means_greedy() -> None:
    unset = rollout_pb2.SamplingParams(n=4, max_new_tokens=8)
    assert not unset.HasField("temperature")
    assert sampling_params(unset, LIMITS).temperature == 1.0
    assert sampling_params(_params(temperature=0.0), LIMITS).temperature == 0.0
    assert sampling_params(_params(temperature=0.5), LIMITS).temperature == 0.5
