"""Pure parts of the learner: batching, masks, micro-batch weights, the old-log-prob rule, LR schedule."""

from __future__ import annotations

import pytest

from grpo.trainer.learner.batch import (
    TrainableSample,
    build_micro_batches,
    collate,
    micro_batch_weight,
    plan_rank,
    split_by_tokens,
)
from grpo.trainer.learner.optim import lr_factor
from grpo.trainer.learner.update import MetricPart, OldLogprobSource, merge_metrics, old_logprob_source


def sample(p: int, c: int, **kw: object) -> TrainableSample:
    return TrainableSample(list(range(1, p + 1)), list(range(50, 50 + c)), advantage=1.0, **kw)  # type: ignore[arg-type]


def test_split_sorts_by_length_and_respects_limits() -> None:
    chunks = split_by_tokens([9, 2, 5, 3, 8], max_samples=2, max_tokens=None)
    assert chunks == [[1, 3], [2, 4], [0]]
    assert split_by_tokens([4, 4, 4, 10], max_samples=8, max_tokens=12) == [[0, 1, 2], [3]]


def test_collate_masks_completion_tokens_only() -> None:
    mb = collate([sample(3, 2), sample(1, 4)], pad_id=0, mask_truncated=True)
    assert mb.input_ids.shape == (2, 5) and mb.targets.shape == (2, 4)
    # row 0: prompt 1,2,3 then 50,51; the targets predicted at positions 2,3 are the completion
    assert mb.completion_mask[0].tolist() == [0, 0, 1, 1]
    assert mb.targets[0, 2:].tolist() == [50, 51]
    assert mb.completion_mask[1].tolist() == [1, 1, 1, 1]
    assert mb.attention_mask[0].tolist() == [1, 1, 1, 1, 1] and mb.n_tokens == 6 and mb.n_sequences == 2


def test_truncated_completions_are_masked_only_when_asked() -> None:
    samples = [sample(2, 3, truncated=True), sample(2, 3)]
    masked = collate(samples, pad_id=0, mask_truncated=True)
    kept = collate(samples, pad_id=0, mask_truncated=False)
    assert masked.completion_mask[0].sum() == 0 and masked.n_sequences == 1 and masked.n_tokens == 3
    assert kept.n_tokens == 6


def test_sampler_logprobs_align_with_targets_and_are_validated() -> None:
    mb = collate([sample(2, 2, sampler_logprobs=[-0.5, -1.5])], pad_id=0, mask_truncated=True)
    assert mb.sampler_logp is not None and mb.sampler_logp[0].tolist() == [0.0, -0.5, -1.5]
    with pytest.raises(ValueError, match="sampler log-probs"):
        collate([sample(2, 2, sampler_logprobs=[-0.5])], pad_id=0, mask_truncated=True)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_micro_batch_weights_sum_to_one(agg: str) -> None:
    mbs = build_micro_batches([sample(2, c) for c in (1, 3, 4, 7, 2)], micro_batch_size=2, pad_id=0)
    tokens, seqs = sum(m.n_tokens for m in mbs), sum(m.n_sequences for m in mbs)
    assert sum(micro_batch_weight(agg, m, tokens, seqs) for m in mbs) == pytest.approx(1.0)


def test_old_logprob_rule() -> None:
    batch = [sample(2, 2, sampler_logprobs=[-1.0, -1.0], weight_version=3)]
    # Exact sampler log-probs are the behaviour policy's: used for fresh and stale samples, any epochs.
    assert old_logprob_source(batch, ppo_epochs=1, sampler_exact=True) is OldLogprobSource.SAMPLER
    assert old_logprob_source(batch, ppo_epochs=2, sampler_exact=True) is OldLogprobSource.SAMPLER
    assert old_logprob_source(batch, ppo_epochs=1, sampler_exact=False) is OldLogprobSource.CURRENT  # bf16/vLLM
    assert old_logprob_source(batch, ppo_epochs=2, sampler_exact=False) is OldLogprobSource.RECOMPUTE
    missing = [sample(2, 2, weight_version=3)]
    assert old_logprob_source(missing, ppo_epochs=1, sampler_exact=True) is OldLogprobSource.CURRENT


def test_lr_schedule_warmup_then_cosine() -> None:
    kw = {"warmup_steps": 4, "total_steps": 14}
    assert [lr_factor(s, schedule="constant", **kw) for s in (0, 3, 100)] == [0.25, 1.0, 1.0]
    assert lr_factor(4, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_factor(9, schedule="cosine", **kw) == pytest.approx(0.5)
    assert lr_factor(14, schedule="cosine", min_ratio=0.1, **kw) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="schedule"):
        lr_factor(5, schedule="linear", **kw)


def test_merge_metrics() -> None:
    # losses by loss share, per-token diagnostics by tokens (a per-sequence loss share must not weigh them)
    merged = merge_metrics(
        [
            MetricPart(0.25, 10, {"loss": 4.0, "ratio_max": 1.5, "kl": 1.0}),
            MetricPart(0.75, 30, {"loss": 0.0, "ratio_max": 1.1, "kl": 3.0}),
            MetricPart(0.0, 0, {"loss": 9.0, "ratio_max": 9.0, "kl": 9.0}),  # a padding pass counts for nothing
        ]
    )
    assert merged == {"loss": 1.0, "ratio_max": 1.5, "kl": 2.5}
    assert merge_metrics([MetricPart(0.5, 1, {"kl": 1.0}), MetricPart(0.5, 3, {"kl": 3.0})])["kl"] == 2.5


def test_every_row_goes_to_exactly_one_rank_and_every_rank_makes_the_same_passes() -> None:
    batch = [sample(2, c, truncated=c == 7) for c in (5, 1, 7, 3, 2, 6, 4)]
    for world_size in (1, 2, 3, 8):
        for mbs in (1, 2, 3):
            plans = [
                plan_rank(
                    batch, rank=r, world_size=world_size, micro_batch_size=mbs, max_tokens=None, mask_truncated=True
                )
                for r in range(world_size)
            ]
            rows = sorted(i for p in plans for chunk in p.chunks for i in chunk)
            assert rows == list(range(len(batch)))  # none dropped, none trained twice (8 ranks: 7 rows)
            assert {p.steps for p in plans} == {max(len(p.chunks) for p in plans)}
            # the normalisers are the whole batch's on every rank; the truncated row counts for nothing
            assert {(p.total_tokens, p.total_sequences) for p in plans} == {(5 + 1 + 3 + 2 + 6 + 4, 6)}


def test_a_bad_row_fails_on_every_rank_before_any_pass() -> None:
    batch = [sample(2, 3), sample(2, 3, sampler_logprobs=[-1.0])]
    for rank in (0, 1):
        with pytest.raises(ValueError, match="1 sampler log-probs for 3 completion tokens"):
            plan_rank(batch, rank=rank, world_size=2, micro_batch_size=1, max_tokens=None, mask_truncated=True)


def test_token_advantages_align_with_targets_and_are_validated() -> None:
    mb = collate([sample(2, 3, token_advantages=[1.0, -2.0, 0.5]), sample(3, 1)], pad_id=0, mask_truncated=True)
    # row 0: the targets at 1..3 are its completion; row 1 (target 2) has no per-token advantages: its scalar, 1.0
    assert mb.advantages.shape == (2, 4)
    assert mb.advantages[0].tolist() == [0.0, 1.0, -2.0, 0.5] and mb.advantages[1].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert collate([sample(2, 3)], pad_id=0, mask_truncated=True).advantages.shape == (1,)  # outcome: one each
    with pytest.raises(ValueError, match="2 token advantages for 3 completion tokens"):
        collate([sample(2, 3, token_advantages=[1.0, 2.0])], pad_id=0, mask_truncated=True)
