"""Group records → triage facts, trainable samples and rollout metrics (pure conversions)."""

from __future__ import annotations

import pytest

from grpo.trainer.consumer import correctness, facts_of, group_metrics, to_samples
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2


def record(rewards: list[float | None], *, finish: str = "stop") -> queue_pb2.GroupRecord:
    samples = []
    for i, r in enumerate(rewards):
        comp = {"math": reward_pb2.ComponentResult(score=1.0 if r == 1.0 else 0.0, status="ok")}
        sample = queue_pb2.SampleRecord(
            completion=rollout_pb2.Completion(token_ids=[7] * (i + 1), logprobs=[-0.5] * (i + 1), finish_reason=finish),
            components=comp,
        )
        if r is not None:
            sample.reward = r
        samples.append(sample)
    return queue_pb2.GroupRecord(group_id="g", task_id="g", weight_version=4, prompt_token_ids=[1, 2], samples=samples,
                                 status="ok", generate_s=0.5)  # fmt: skip


def test_facts_keep_missing_rewards_as_none() -> None:
    facts = facts_of(record([1.0, None]))
    assert facts.rewards == (1.0, None) and facts.weight_version == 4 and facts.status == "ok"


def test_samples_carry_tokens_logprobs_and_advantages() -> None:
    samples = to_samples(record([1.0, 0.0], finish="length"), [0.5, -0.5])
    assert [s.advantage for s in samples] == [0.5, -0.5]
    assert samples[1].completion_token_ids == [7, 7] and samples[1].sampler_logprobs == [-0.5, -0.5]
    assert samples[0].prompt_token_ids == [1, 2] and samples[0].truncated and samples[0].weight_version == 4
    with pytest.raises(ValueError):
        to_samples(record([1.0, 0.0]), [0.5])  # one advantage per sample, or nothing


def test_group_metrics() -> None:
    m = group_metrics([record([1.0, 0.0, 0.0, 1.0])])
    assert m["rollout/reward_mean"] == 0.5 and m["rollout/reward_std"] == 0.5
    assert m["rollout/accuracy"] == 0.5 and m["rollout/reward/math_mean"] == 0.5
    assert m["rollout/response_len_mean"] == 2.5 and m["rollout/response_len_max"] == 4
    assert m["rollout/truncation_rate"] == 0.0
    assert group_metrics([]) == {}


def test_correctness_reads_math_or_code() -> None:
    sample = queue_pb2.SampleRecord(components={"code": reward_pb2.ComponentResult(score=0.75)})
    assert correctness(sample) == 0.75
    assert correctness(queue_pb2.SampleRecord()) is None
