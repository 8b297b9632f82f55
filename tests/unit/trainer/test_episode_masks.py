"""Episode records on the trainer: token masks through collation, rank plans, the learner, triage and metrics.

The worked example of docs/multi-turn.md: prompt [1, 2, 3], completion [m, m, e, e, m] (mask [1, 1, 0, 0, 1]).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.accounting import Accounting, triage
from grpo.trainer.consumer import facts_of, failure_reason, group_metrics, mask_problem, to_samples
from grpo.trainer.evaluation import eval_metrics
from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample
from grpo.trainer.learner.batch import check_sample, collate, counted_tokens, plan_rank
from grpo.v1 import queue_pb2, reward_pb2, rollout_pb2

MASK = [1, 1, 0, 0, 1]
EPISODE = TrainableSample([1, 2, 3], [40, 41, 60, 61, 42], advantage=1.0, token_mask=MASK, group_id="g")


def test_collate_trains_and_counts_model_tokens_only() -> None:
    plain = TrainableSample([1, 2], [50, 51, 52], advantage=-1.0)
    mb = collate([EPISODE, plain], pad_id=0, mask_truncated=True)
    # shifted view: the completion's token t is predicted at position p - 1 + t
    assert mb.completion_mask[0].tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert mb.targets[0, 2:].tolist() == [40, 41, 60, 61, 42]
    assert mb.completion_mask[1].tolist() == [0, 1, 1, 1, 0, 0, 0]
    assert (mb.n_tokens, mb.n_sequences) == (6, 2)
    assert counted_tokens(EPISODE, mask_truncated=True) == 3
    cut = dataclasses.replace(EPISODE, truncated=True)
    assert counted_tokens(cut, mask_truncated=True) == 0 and counted_tokens(cut, mask_truncated=False) == 3
    plan = plan_rank([EPISODE, plain, cut], rank=1, world_size=2, micro_batch_size=1, max_tokens=None,
                     mask_truncated=True)  # fmt: skip
    assert (plan.total_tokens, plan.total_sequences) == (6, 2)


def test_a_mask_that_does_not_fit_its_completion_is_refused() -> None:
    with pytest.raises(ValueError, match="token mask of 4 entries for 5 completion tokens"):
        check_sample(dataclasses.replace(EPISODE, token_mask=[1, 1, 0, 1]))
    with pytest.raises(ValueError, match=r"must be 0 \(environment\) or 1 \(model\), got \[2\]"):
        collate([dataclasses.replace(EPISODE, token_mask=[1, 2, 0, 0, 1])], pad_id=0, mask_truncated=True)


def episode_record(masks: list[list[int]], stats: list[queue_pb2.EpisodeStats] | None = None) -> queue_pb2.GroupRecord:
    samples = []
    for i, mask in enumerate(masks):
        n = len(mask) or 3
        logprobs = [-0.5 if m else 0.0 for m in mask] if mask else [-0.5] * n
        completion = rollout_pb2.Completion(token_ids=list(range(10, 10 + n)), logprobs=logprobs, finish_reason="stop")
        samples.append(
            queue_pb2.SampleRecord(
                completion=completion,
                reward=float(i % 2),
                components={"math": reward_pb2.ComponentResult(score=float(i % 2), status="ok")},
                token_mask=mask,
                episode=stats[i] if stats else None,
            )
        )
    return queue_pb2.GroupRecord(group_id="g", task_id="g", weight_version=2, policy_version=2,
                                 prompt_token_ids=[1, 2, 3], samples=samples, status="ok", generate_s=1.0)  # fmt: skip


def test_samples_carry_the_record_mask() -> None:
    samples = to_samples(episode_record([MASK, []]), [1.0, -1.0])
    assert samples[0].token_mask == MASK and samples[0].sampler_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert samples[1].token_mask is None  # no mask: every token is the model's


@pytest.mark.parametrize(
    ("masks", "reason"),
    [
        ([MASK, [1, 1, 0]], "sample 1: a token mask of 3 entries for 5 completion tokens"),
        ([MASK, [1, 3, 0, 0, 1]], "sample 1: token mask values [3]"),
    ],
)
def test_a_malformed_mask_fails_its_group(masks: list[list[int]], reason: str) -> None:
    bad = episode_record(masks)
    if len(masks[1]) != 5:  # a mask shorter than its completion
        bad.samples[1].completion.token_ids.extend([7, 7])
        bad.samples[1].completion.logprobs.extend([0.0, 0.0])
    assert mask_problem(bad) is not None and reason in (mask_problem(bad) or "")
    acct = Accounting()
    acct.publish("g", 2, 0, 0.0)
    facts = facts_of(bad)
    assert facts.status == "failed" and triage(facts, acct, 2, 0, False, 2) == "failed"
    assert reason in failure_reason(bad, 2)
    assert group_metrics([bad]) == {}  # a failed group is not described as what the policy sampled
    assert mask_problem(episode_record([MASK, MASK])) is None


def test_episode_metrics_by_hand() -> None:
    stats = [
        queue_pb2.EpisodeStats(turns=3, tool_calls=2, tool_errors=1, end="answer"),
        queue_pb2.EpisodeStats(turns=2, tool_calls=2, tool_errors=1, tool_timeouts=1, end="max_turns"),
        queue_pb2.EpisodeStats(turns=2, tool_calls=1, tool_errors=1, malformed_calls=1, end="answer"),
    ]
    # sample 0: 5 tokens, 3 the model's; sample 1: 7 tokens, 4 the model's; sample 2: 6 tokens, 4 the model's
    rec = episode_record([MASK, [1, 1, 0, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1]], stats)
    m = group_metrics([rec])
    assert m["rollout/response_len_mean"] == pytest.approx(11 / 3)  # the model's tokens
    assert m["rollout/response_len_max"] == 4.0
    assert m["rollout/episode_len_mean"] == 6.0
    assert m["rollout/env_token_share"] == pytest.approx(7 / 18)
    assert m["rollout/turns_mean"] == pytest.approx(7 / 3) and m["rollout/tool_calls_mean"] == pytest.approx(5 / 3)
    # 5 calls: one failed, one timed out (also counted as an error), one malformed (also an error)
    assert m["rollout/tool_success_rate"] == pytest.approx(2 / 5)
    assert (m["rollout/tool_timeouts"], m["rollout/malformed_calls"]) == (1.0, 1.0)
    assert m["rollout/episode_end/answer"] == pytest.approx(2 / 3)
    assert m["rollout/episode_end/max_turns"] == pytest.approx(1 / 3)
    assert m["rollout/episode_end/length"] == 0.0  # every known end, every time
    # evaluation: the same under eval/
    e = eval_metrics([rec], stopped=False)
    assert e["eval/turns_mean"] == pytest.approx(7 / 3) and e["eval/env_token_share"] == pytest.approx(7 / 18)
    # single-turn groups get none of them
    assert "rollout/turns_mean" not in group_metrics([episode_record([[], []])])


# ------------------------------------------------------------------ the learner on episodes


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def make(**kw: object) -> Learner:
    kw = {"lr": 1e-3, "micro_batch_size": 2, "beta": 0.0, "seed": 0, **kw}
    return Learner(LearnerConfig(model=str(ensure_tiny_model()), **kw))  # type: ignore[arg-type]


def grads(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}


def episodes() -> list[TrainableSample]:
    long = TrainableSample([5, 6, 7], [40, 41, 60, 61, 62, 42, 43], advantage=-1.0, token_mask=[1, 1, 0, 0, 0, 1, 1])
    return [EPISODE, long, TrainableSample([8, 9], [44, 45, 46], advantage=0.5)]


def test_environment_tokens_add_nothing_to_the_update() -> None:
    """Dr. GRPO's constant normaliser makes the comparison exact: a masked episode gives the gradient of the same
    tokens unmasked whose environment positions have advantage 0 (at ratio 1 their terms are 0, as their gradients
    are). A mask the loss forgot would weigh the environment tokens with the episode's advantage."""
    masked = make(agg="seq_mean_token_sum", max_len=16)
    m = masked.accumulate_gradients(episodes())
    unmasked = [
        dataclasses.replace(s, token_mask=None, token_advantages=[s.advantage * k for k in s.token_mask])
        if s.token_mask is not None else s
        for s in episodes()
    ]  # fmt: skip
    zeroed = make(agg="seq_mean_token_sum", max_len=16)
    zeroed.accumulate_gradients(unmasked)
    for name, g in grads(zeroed).items():
        torch.testing.assert_close(grads(masked)[name], g, rtol=1e-5, atol=1e-7, msg=name)
    assert m["ratio_mean"] == pytest.approx(1.0)


def test_a_step_counts_model_tokens() -> None:
    metrics = make().step(episodes())
    assert metrics["tokens"] == 3 + 4 + 3
    assert metrics["response_length_mean"] == pytest.approx(10 / 3)
