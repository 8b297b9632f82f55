"""Sequence packing: the planner (pure), packed attention on the real tiny model, and the packed Learner step
equal to the padded one — loss, every metric and the gradients — for each aggregation and sample kind."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.learner import Learner, LearnerConfig, LoraOptions, SftPair, TrainableSample
from grpo.trainer.learner.batch import pack_micro_batches, pack_rows, packed_shape, packing_pays, plan_rank
from grpo.trainer.learner.packing import check_packed_attention, collate_packed
from grpo.trainer.learner.policy import load_causal_lm

TIMING = {"tokens_per_s", "train_s"}  # wall-clock, not a function of the batch
LAYOUT = {"packed"}  # says which path ran: the one metric that must differ


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


# ------------------------------------------------------------------ planner (pure)


@pytest.mark.parametrize("seed", range(5))
def test_rows_hold_every_sample_once_within_the_budget(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [int(rng.lognormvariate(3, 1)) + 1 for _ in range(40)]
    budget = max(lengths)
    rows = pack_rows(lengths, budget)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))  # no sample lost, split or doubled
    assert all(sum(lengths[i] for i in row) <= budget for row in rows)
    # first fit: a row is opened only for a sample the earlier rows cannot take, so no two rows fit in one
    fills = sorted(sum(lengths[i] for i in row) for row in rows)
    assert len(rows) < len(lengths) and fills[0] + fills[1] > budget


def test_a_sample_longer_than_the_budget_gets_a_row_of_its_own() -> None:
    assert pack_rows([3, 12, 4, 2], 8) == [[1], [2, 0], [3]]


@pytest.mark.parametrize("seed", range(3))
def test_packing_does_not_depend_on_the_batch_order(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 60) for _ in range(30)]
    perm = list(range(30))
    rng.shuffle(perm)

    def profile(ls: list[int]) -> list[list[int]]:
        return sorted(sorted(ls[i] for i in row) for row in pack_rows(ls, 60))

    assert profile(lengths) == profile([lengths[p] for p in perm])


def test_micro_batches_respect_rows_and_tokens() -> None:
    lengths = [10, 9, 8, 7, 6, 5, 4, 3, 2, 1]  # 55 tokens in rows of ≤ 10: six rows
    mbs = pack_micro_batches(lengths, row_len=10, max_rows=2, max_tokens=None)
    assert sum(len(mb) for mb in mbs) == 6 and all(len(mb) <= 2 for mb in mbs)
    capped = pack_micro_batches(lengths, row_len=10, max_rows=8, max_tokens=25)
    assert all(len(mb) * max(sum(lengths[i] for i in row) for row in mb) <= 25 for mb in capped)


def test_packed_shape_fills_the_token_budget() -> None:
    assert packed_shape(100, 8, None) == (100, 8)  # the padded path's micro-batch of longest samples
    assert packed_shape(100, 8, 450) == (112, 4)  # four rows of the longest fit, stretched to fill 450
    assert packed_shape(100, 2, 1000) == (500, 2)  # never more rows than micro_batch_size
    assert packed_shape(100, 8, 60) == (100, 1)  # a sample longer than the cap still gets its row


def test_ranks_share_the_batch_and_pass_count_when_packed() -> None:
    batch = [TrainableSample([1, 2], [3] * n, advantage=1.0) for n in (1, 9, 2, 8, 3, 7, 4)]
    plans = [plan_rank(batch, rank=r, world_size=2, micro_batch_size=2, max_tokens=None, mask_truncated=True,
                       packing=True) for r in range(2)]  # fmt: skip
    assert sorted(i for p in plans for c in p.chunks for i in c) == list(range(7))
    assert all(p.rows is not None and [i for row in p.rows[k] for i in row] == c
               for p in plans for k, c in enumerate(p.chunks))  # fmt: skip
    assert {p.steps for p in plans} == {max(len(p.chunks) for p in plans)}


# ------------------------------------------------------------------ packed attention on the tiny model


def test_packed_row_equals_its_samples_run_alone() -> None:
    """transformers keeps attention inside each sample from the position ids alone (no attention mask)."""
    model = load_causal_lm(str(ensure_tiny_model())).eval()
    a, b = [5, 17, 30, 41, 9, 12], [7, 8, 99, 3]
    packed = collate_packed([[sample(a), sample(b)]], pad_id=0, mask_truncated=False)
    assert packed.input_ids.shape == (1, 10) and packed.position_ids is not None
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3]]
    # use_cache=False as forward_logprobs passes it: with a KV cache transformers does not look for packed rows
    with torch.no_grad():
        together = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits[0]
        alone = [model(input_ids=torch.tensor([ids]), use_cache=False).logits[0] for ids in (a, b)]
    torch.testing.assert_close(together, torch.cat(alone), rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # without the restart, b would attend to a: the check above can fail
        crossed = model(input_ids=packed.input_ids, use_cache=False).logits[0]
    assert not torch.allclose(crossed[6:], alone[1], atol=1e-3)


class CrossAttending(torch.nn.Module):
    """A causal model whose mixing ignores position ids: every token sees the whole prefix of its row."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(128, 8), torch.nn.Linear(8, 128)

    def forward(self, input_ids: torch.Tensor, **_: Any) -> Any:
        x = self.embed(input_ids).cumsum(dim=1) / torch.arange(1, input_ids.shape[1] + 1)[:, None]
        return type("Out", (), {"logits": self.head(x)})


def test_a_model_that_ignores_position_ids_is_refused() -> None:
    check_packed_attention(load_causal_lm(str(ensure_tiny_model())), torch.device("cpu"))  # the tiny Qwen2 passes
    with pytest.raises(ValueError, match="set packing: false"):
        check_packed_attention(CrossAttending(), torch.device("cpu"))


def sample(ids: list[int], **kw: Any) -> TrainableSample:
    return TrainableSample(ids[:2], ids[2:], advantage=1.0, **kw)


# ------------------------------------------------------------------ packed Learner == padded Learner

LENGTHS = [2, 31, 3, 5, 24, 2, 9, 4, 17, 3, 6, 12]  # long-tailed: short samples share rows with each other


def long_tailed_batch(per_token: bool = False, episodes: bool = False, sampler: bool = False) -> list[TrainableSample]:
    rng = random.Random(0)
    out = []
    for i, n in enumerate(LENGTHS):
        prompt = [rng.randrange(5, 400) for _ in range(rng.randint(2, 5))]
        completion = [rng.randrange(5, 400) for _ in range(n)]
        s = TrainableSample(prompt, completion, advantage=(-1.0) ** i * (0.5 + 0.1 * i), group_id=str(i // 4),
                            truncated=i == 7)  # fmt: skip
        if per_token:
            s = dataclasses.replace(s, token_advantages=[s.advantage * (1 - t / n) for t in range(n)])
        if episodes and n > 7:  # a model turn, a 3-token tool result (mask 0), the answer
            s = dataclasses.replace(s, token_mask=[1, 1, 0, 0, 0, *[1] * (n - 5)])
        if sampler or episodes:  # log-probs the current policy did not produce: ratios ≠ 1, some clipped
            s = dataclasses.replace(s, sampler_logprobs=[-6.0 + 0.3 * ((t * 7 + i) % 5) for t in range(n)])
        out.append(s)
    return out


CASES: list[dict[str, Any]] = [
    *({"agg": agg} for agg in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")),
    {"agg": "token_mean", "per_token": True},
    {"agg": "seq_mean_token_mean", "episodes": True, "sampler_exact": True, "tis_cap": 2.0, "ratio_level": "sequence"},
    {"agg": "seq_mean_token_sum", "per_token": True, "episodes": True, "sampler_exact": True, "beta": 0.05},
    {"agg": "token_mean", "sampler": True, "tis_cap": 1.5, "beta": 0.05, "ppo_epochs": 2},
    {"agg": "token_mean", "micro_batch_size": 8, "max_tokens_per_micro_batch": 60},
    {"agg": "seq_mean_token_mean", "lora": LoraOptions(r=4)},  # peft passes the position ids through
]
BATCH_KEYS = ("per_token", "episodes", "sampler")


def learner(packing: bool | Literal["auto"], case: dict[str, Any]) -> Learner:
    options = {k: v for k, v in case.items() if k not in BATCH_KEYS}
    base = {"lr": 1e-3, "adam_eps": 1e-4, "micro_batch_size": 3, "beta": 0.0, "tis_cap": None, "max_len": 32}
    made = Learner(LearnerConfig(model=str(ensure_tiny_model()), packing=packing, **{**base, **options}))
    if made.ref_model is not None:  # a reference apart from the policy, the same in both: the KL is not 0
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1)
            for p in made.ref_model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return made


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_metrics(packed: dict[str, float], padded: dict[str, float]) -> None:
    assert set(packed) == set(padded)
    for key in set(padded) - TIMING - LAYOUT:
        assert packed[key] == pytest.approx(padded[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_packed_step_equals_padded_step(case: dict[str, Any]) -> None:
    batch = long_tailed_batch(**{k: case[k] for k in BATCH_KEYS if k in case})
    packed, padded = learner(True, case), learner(False, case)
    plans = [made._shard(batch, mask_truncated=True, agg="token_mean")[0] for made in (packed, padded)]
    passes, fed = [len(p) for p in plans], [sum(w.mb.input_ids.numel() for w in p) for p in plans]
    assert passes[0] <= passes[1] and fed[0] < fed[1]  # the packed path really packs: fewer positions, passes
    assert_same_metrics(packed.accumulate_gradients(batch), padded.accumulate_gradients(batch))
    g_packed, g_padded = grads(packed.model), grads(padded.model)
    assert g_packed.keys() == g_padded.keys() and g_padded
    scale = max(float(g.abs().max()) for g in g_padded.values())
    for name, g in g_padded.items():
        torch.testing.assert_close(g_packed[name], g, rtol=1e-5, atol=1e-6 * scale, msg=name)
    for made in (packed, padded):
        made.model.zero_grad(set_to_none=True)
    first = packed.step(batch), padded.step(batch)
    assert_same_metrics(*first)
    assert [m["packed"] for m in first] == [1.0, 0.0]
    assert_same_metrics(packed.step(batch), padded.step(batch))  # after an update: ratios and clipping move


def test_packed_sft_step_equals_padded() -> None:
    rng = random.Random(3)
    pairs = [SftPair([rng.randrange(5, 400) for _ in range(3)], [rng.randrange(5, 400) for _ in range(n)],
                     response_mask=[1, 0, 0, *[1] * (n - 3)] if n > 8 else None) for n in LENGTHS]  # fmt: skip
    packed, padded = learner(True, {}), learner(False, {})
    assert_same_metrics(packed.sft_step(pairs), padded.sft_step(pairs))
    assert_same_metrics(packed.sft_step(pairs), padded.sft_step(pairs))


def test_the_trainer_setting_reaches_the_learner(tmp_path: Path) -> None:
    from grpo.trainer.assemble import learner_config, resolve_algo
    from grpo.trainer.config import parse_settings

    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "gold": "2"}\n')
    cases = (
        ([], "auto"),  # the default: packs only where it pays
        (["--packing", "auto"], "auto"),
        (["--packing", "true"], True),
        (["--packing", "false"], False),
    )
    for flag, expected in cases:
        settings = parse_settings(["--train-data", str(data), *flag])
        assert learner_config(settings, resolve_algo(settings)).packing == expected


def test_auto_packs_a_batch_only_where_it_cuts_the_token_positions() -> None:
    """auto (the default) packs the long-tailed batch (half its positions are padding) and pads one of equal
    lengths (nothing to cut); every rank count decides alike."""
    assert packing_pays(LENGTHS, micro_batch_size=6, max_tokens=None)
    assert not packing_pays([12] * 12, micro_batch_size=6, max_tokens=None)
    batch = long_tailed_batch()
    for world in (1, 2):
        plan = plan_rank(batch, rank=0, world_size=world, micro_batch_size=6, max_tokens=None, mask_truncated=True,
                         packing="auto")  # fmt: skip
        assert plan.rows is not None
    even = [sample(list(range(1, 13))) for _ in range(4)]
    plan = plan_rank(even, rank=0, world_size=1, micro_batch_size=2, max_tokens=None, mask_truncated=True,
                     packing="auto")  # fmt: skip
    assert plan.rows is None


def test_auto_pads_with_a_model_that_fails_the_check_where_true_refuses() -> None:
    made = Learner(LearnerConfig(model=str(ensure_tiny_model()), packing="auto", beta=0.0))
    assert made.packing == "auto"  # the tiny Qwen2 keeps packed samples apart
    made.model = CrossAttending()
    assert made._packing("auto") is False
    with pytest.raises(ValueError, match="set packing: false"):
        made._packing(True)


def test_the_step_says_whether_auto_packed_the_batch() -> None:
    """train/packed: 1 for a batch auto packs (the long-tailed one), 0 for one it pads (equal lengths)."""
    made = learner("auto", {"micro_batch_size": 6})
    assert made.step(long_tailed_batch())["packed"] == 1.0
    even = [TrainableSample([3, 4], list(range(5, 15)), advantage=(-1.0) ** i) for i in range(12)]
    assert made.step(even)["packed"] == 0.0
