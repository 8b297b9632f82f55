"""Group records → triage facts, trainable samples and rollout metrics (pure conversions); the reader's acks
against a real Redis."""

from __future__ import annotations

import pytest

from grpo.common.queue import QueueUnavailable, RunQueue, connect, encode
from grpo.local.redis_server import RedisServer
from grpo.trainer.consumer import GroupReader, correctness, facts_of, failure_reason, group_metrics, to_samples
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


def test_zero_variance_signal_follows_the_chosen_basis() -> None:
    from grpo.trainer.accounting import Accounting, triage

    # All wrong (math 0), but the overlong penalty made the rewards differ: DAPO drops this group, GRPO trains it.
    all_wrong = record([0.0, -0.3, -0.1])
    acct = Accounting()
    acct.publish("g", 4, 0, 0.0)
    on_reward, on_accuracy = facts_of(all_wrong, "reward"), facts_of(all_wrong, "accuracy")
    assert on_accuracy.signal == (0.0, 0.0, 0.0) and on_reward.signal == (0.0, -0.3, -0.1)
    assert triage(on_accuracy, acct, 4, 0, True) == "zero_variance"
    assert triage(on_reward, acct, 4, 0, True) == "train"
    # Rewards that differ only past the clip are equal for the advantages, so the group is zero-variance.
    clipped = facts_of(record([2.0, 3.0]), "reward", (-1.0, 1.0))
    assert clipped.signal == (1.0, 1.0) and triage(clipped, acct, 4, 0, True) == "zero_variance"
    # Accuracy without a correctness component (a format-only task) falls back to the reward.
    bare = record([0.0, 1.0])
    for sample in bare.samples:
        del sample.components["math"]
    assert facts_of(bare, "accuracy").signal == (0.0, 1.0)


def test_auto_basis_is_accuracy_only_with_dynamic_sampling() -> None:
    from grpo.algo import get_preset

    assert get_preset("dapo").zero_variance_basis() == "accuracy"
    assert get_preset("grpo").zero_variance_basis() == "reward"
    assert get_preset("grpo").with_overrides(zero_variance_on="accuracy").zero_variance_basis() == "accuracy"
    with pytest.raises(ValueError, match="zero_variance_on"):
        get_preset("grpo").with_overrides(zero_variance_on="format").zero_variance_basis()


def stepped(rewards: list[float], steps: list[list[float | None]], ends: list[list[int]]) -> queue_pb2.GroupRecord:
    """A group whose samples carry step scores (None: not judged) and their token ends."""
    rec = record(list(rewards))
    for sample, scores, token_ends in zip(rec.samples, steps, ends, strict=True):
        sample.completion.token_ids[:] = [7] * (token_ends[-1] + 1)  # one trailing token after the last step
        for k, score in enumerate(scores):
            step = sample.steps.add(start=k, end=k + 1, status="ok" if score is not None else "cannot_judge")
            if score is not None:
                step.score = score
        sample.step_token_ends.extend(token_ends)
    return rec


def test_process_credit_spreads_step_advantages_over_tokens() -> None:
    from grpo.algo import get_preset
    from grpo.trainer.consumer import process_credit

    # Step scores {1, 0 | 1, 1}, eps 0: normalised [0.5, −1.5 | 0.5, 0.5], cumulative [−1, −1.5 | 1, 0.5].
    rec = stepped([0.0, 1.0], [[1.0, 0.0], [1.0, 1.0]], [[2, 3], [1, 2]])
    algo = get_preset("prm").with_overrides(advantage_eps=0.0, process_weight=1.0)
    tokens = process_credit(rec, [-0.7, 0.7], algo)
    assert tokens[0] == pytest.approx([-1.0, -1.0, -1.5, -1.5])  # step 0: tokens 0–1; step 1: token 2 and the tail
    assert tokens[1] == pytest.approx([1.0, 0.5, 0.5])
    half = process_credit(rec, [-0.7, 0.7], algo.with_overrides(process_weight=0.5))
    assert half[0] == pytest.approx([-0.85, -0.85, -1.1, -1.1])  # (−0.7 − 1) / 2, (−0.7 − 1.5) / 2
    aligned = process_credit(rec, [0.0, 0.0], algo.with_overrides(process_advantage="step_aligned"))
    assert aligned[0][0] == 0.0 and aligned[0][-1] < 0 < aligned[1][-1]  # step 0 agrees; step 1: 0 vs 1


def test_step_credit_triage_needs_judged_steps_and_sees_their_variance() -> None:
    unjudged = stepped([1.0, 0.0], [[1.0, None], [1.0, 0.0]], [[1, 2], [1, 2]])
    assert facts_of(unjudged).rewards == (1.0, 0.0)  # outcome credit: the steps do not matter
    assert facts_of(unjudged, steps=True).rewards == (None, 0.0)  # step credit: unscored, never a made-up 0
    flat_rewards = stepped([1.0, 1.0], [[1.0, 0.0], [1.0, 1.0]], [[1, 2], [1, 2]])
    assert max(facts_of(flat_rewards).signal) == min(facts_of(flat_rewards).signal)  # outcome: zero variance
    signal = facts_of(flat_rewards, steps=True).signal
    assert max(signal) != min(signal)  # step credit: the steps still teach something
    nan = stepped([1.0, 0.0], [[1.0, float("nan")], [1.0, 0.0]], [[1, 2], [1, 2]])
    assert facts_of(nan, steps=True).rewards == (None, 0.0)  # a NaN step is not a score
    unordered = stepped([1.0, 0.0], [[1.0, 0.0], [1.0, 0.0]], [[1, 2], [1, 2]])
    unordered.samples[0].step_token_ends[:] = [2, 1]
    assert facts_of(unordered, steps=True).rewards == (None, 0.0)  # ends out of order: not placed on tokens
    all_flat = stepped([1.0, 1.0], [[1.0, 1.0], [1.0]], [[1, 2], [1]])
    signal = facts_of(all_flat, steps=True).signal
    assert max(signal) == min(signal)


def test_an_ack_lost_at_one_checkpoint_is_made_at_the_next() -> None:
    """Dropped, a failed ack's ids would stay pending for the trainer's life and hold the groups stream's trim
    floor: Redis would keep every later group (80-160 KiB each) until a restart."""
    with RedisServer(appendonly=True) as server:  # its streams and pending lists outlive a restart
        queue = RunQueue(connect(server.url, connect_timeout_s=0.5), "acks")
        queue.ensure_groups()
        for i in range(3):
            queue.client.xadd(queue.groups_key, encode(queue_pb2.GroupRecord(group_id=f"g{i}")))
        reader = GroupReader(queue, "trainer")
        for _ in range(3):
            entry = reader.next(block_ms=100)
            assert entry is not None
            reader.defer_ack(entry.entry_id)
        server.stop()  # down at the checkpoint: the ack never reaches it
        with pytest.raises(QueueUnavailable, match="ack_groups"):
            reader.ack_deferred()
        assert len(reader.deferred) == 3
        server.start()
        assert queue.stats()["groups"].pending == 3
        assert reader.ack_deferred() == 3 and reader.deferred == []
        assert queue.stats()["groups"].pending == 0
        queue.trim_acked(queue.groups_key, approximate=False)  # the ack's own trim is approximate
        assert queue.client.xlen(queue.groups_key) == 0


def test_the_reason_a_group_failed() -> None:
    failed = queue_pb2.GroupRecord(group_id="t", status="failed", error="invalid task: too long")
    assert failure_reason(failed, 4) == "invalid task: too long"
    assert (
        failure_reason(queue_pb2.GroupRecord(group_id="t", status="failed"), 4)
        == "status 'failed' with no error message"
    )
    short = queue_pb2.GroupRecord(group_id="t", status="ok", samples=[queue_pb2.SampleRecord()] * 3)
    assert failure_reason(short, 4) == "3 samples where the group size is 4"
