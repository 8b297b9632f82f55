"""Learner.step on the real tiny model (CPU, 1 thread): it learns, accumulates exactly, handles π_old and π_ref."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample
from tests.support.samples import random_groups


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def synthetic_groups(n_groups: int = 2, group_size: int = 4, seed: int = 0, **kw: object) -> list[TrainableSample]:
    """Short random groups, advantages ±1 alternating (the benchmarks' generator at this file's sizes)."""
    return random_groups(n_groups, group_size, prompt_len=(3, 6), completion_len=(2, 7), seed=seed, **kw)


def make(**kw: object) -> Learner:
    # beta 0 unless a test sets it: no reference model (LearnerConfig's own default is the grpo preset's beta)
    kw = {"lr": 1e-3, "micro_batch_size": 4, "beta": 0.0, **kw}
    return Learner(LearnerConfig(model=str(ensure_tiny_model()), **kw))  # type: ignore[arg-type]


def params(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters()}


def test_steps_change_every_parameter() -> None:
    learner = make(max_grad_norm=0.0)
    batch = synthetic_groups()
    before = params(learner)
    losses = [learner.step(batch)["loss"] for _ in range(4)]
    after = params(learner)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, f"parameters not updated: {unchanged}"
    # π_old is the policy at each step, so the surrogate at ratio 1 is −mean(A)=0: measure the fixed-batch
    # objective instead — the advantage-weighted log-likelihood must rise.
    assert losses[0] == pytest.approx(0.0, abs=1e-6)
    metrics = learner.accumulate_gradients(batch)
    assert metrics["ratio_mean"] == pytest.approx(1.0)


def _logp_objective(learner: Learner, batch: list[TrainableSample]) -> float:
    from grpo.trainer.learner.batch import build_micro_batches
    from grpo.trainer.learner.policy import forward_logprobs

    with torch.no_grad():
        mb = build_micro_batches(batch, micro_batch_size=len(batch), pad_id=0)[0]
        logp, _ = forward_logprobs(learner.model, mb, 1.0)
        per_seq = (logp * mb.completion_mask).sum(1) / mb.completion_mask.sum(1)
        return float((per_seq * mb.advantages).mean())


def test_grpo_update_raises_advantage_weighted_likelihood() -> None:
    learner = make()
    batch = synthetic_groups()
    start = _logp_objective(learner, batch)
    for _ in range(3):
        learner.step(batch)
    assert _logp_objective(learner, batch) > start + 0.05


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"])
def test_accumulation_matches_one_big_micro_batch(agg: str) -> None:
    batch = synthetic_groups(1, 4, seed=3)
    grads = []
    for mbs in (4, 2):
        learner = make(micro_batch_size=mbs, agg=agg, max_len=16)
        learner.accumulate_gradients(batch)
        grads.append({n: p.grad.clone() for n, p in learner.model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-6, msg=f"{agg}: {name}")


def _live_models() -> int:
    gc.collect()
    return sum(type(o).__name__.endswith("ForCausalLM") for o in gc.get_objects())


def test_no_reference_model_at_beta_zero() -> None:
    base = _live_models()
    learner = make(beta=0.0)
    assert learner.ref_model is None
    assert _live_models() - base == 1, "only the policy may be allocated"
    assert "kl" not in learner.step(synthetic_groups())


def test_reference_loaded_and_refreshed_at_beta_positive() -> None:
    learner = make(beta=0.04, ref_refresh_steps=2)
    assert learner.ref_model is not None
    batch = synthetic_groups()
    learner.step(batch)
    ref, policy = learner.ref_model.state_dict(), learner.model.state_dict()
    assert not torch.equal(ref["model.norm.weight"], policy["model.norm.weight"])  # the policy moved away
    assert learner.step(batch)["kl"] > 0
    ref = learner.ref_model.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in learner.model.state_dict().items())  # refreshed at step 2


def test_exact_sampler_logprobs_are_pi_old_for_fresh_and_stale_samples() -> None:
    learner = make(sampler_exact=True)
    batch = synthetic_groups(1, 4)
    from grpo.trainer.learner.batch import build_micro_batches
    from grpo.trainer.learner.policy import forward_logprobs

    mb = build_micro_batches(batch, micro_batch_size=4, pad_id=0)[0]
    with torch.no_grad():
        logp, _ = forward_logprobs(learner.model, mb, 1.0)
    order = sorted(range(4), key=lambda i: (len(batch[i].prompt_token_ids) + len(batch[i].completion_token_ids), i))
    shifted = []
    for row, i in enumerate(order):
        s, p = batch[i], len(batch[i].prompt_token_ids)
        lp = (logp[row, p - 1 : p - 1 + len(s.completion_token_ids)] - 0.1).tolist()  # sampler 0.1 nats less likely
        shifted.append(TrainableSample(s.prompt_token_ids, s.completion_token_ids, s.advantage, lp, weight_version=0))
    fresh = learner.accumulate_gradients(shifted)
    assert fresh["ratio_mean"] == pytest.approx(torch.exp(torch.tensor(0.1)).item(), rel=1e-4)
    stale = [
        TrainableSample(s.prompt_token_ids, s.completion_token_ids, s.advantage, s.sampler_logprobs, weight_version=7)
        for s in shifted
    ]
    # A stale sample's ratio is against the policy that generated it, not the current one.
    assert learner.accumulate_gradients(stale)["ratio_mean"] == pytest.approx(fresh["ratio_mean"], rel=1e-6)
    assert learner.step(shifted)["old_logp_from_sampler"] == 1.0
    inexact = make(sampler_exact=False)
    inexact.model.load_state_dict(learner.model.state_dict())
    assert inexact.accumulate_gradients(stale)["ratio_mean"] == pytest.approx(1.0)


def test_ppo_epochs_recompute_old_logprobs() -> None:
    metrics = make(ppo_epochs=3, lr=1e-2).step(synthetic_groups())
    assert metrics["ratio_max"] > 1.0 and metrics["old_logp_from_sampler"] == 0.0


def test_truncated_completions_do_not_contribute() -> None:
    batch = synthetic_groups(1, 4, seed=5)
    cut = [TrainableSample(s.prompt_token_ids, s.completion_token_ids, 5.0, truncated=True) for s in batch[:2]]
    with_cut, without = make(mask_truncated=True), make(mask_truncated=True)
    with_cut.accumulate_gradients(batch + cut)
    without.accumulate_gradients(batch)
    for (name, p), q in zip(with_cut.model.named_parameters(), without.model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert make().step(batch + cut)["truncation_rate"] == pytest.approx(2 / 6)


def test_an_all_masked_batch_makes_no_update() -> None:
    learner = make(mask_truncated=True, lr=1e-2)
    learner.step(synthetic_groups())  # AdamW's momentum would now move the weights even on zero gradients
    before, version = params(learner), learner.version
    cut = [TrainableSample(s.prompt_token_ids, s.completion_token_ids, s.advantage, truncated=True)
           for s in synthetic_groups(seed=3)]  # fmt: skip
    metrics = learner.step(cut)
    assert (metrics["skipped"], metrics["tokens"], metrics["truncation_rate"]) == (1.0, 0.0, 1.0)
    assert learner.version == version
    moved = [n for n, p in params(learner).items() if not torch.equal(p, before[n])]
    assert not moved, f"an update on no token moved {moved[:3]}"


def test_push_names_match_the_hf_checkpoint() -> None:
    path = ensure_tiny_model()
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        learner = make()
        pushed = {k: v.clone() for k, v in learner.state_dict_for_push().items()}
        assert set(pushed) == names  # tied lm_head left out, as save_pretrained does
        assert all(torch.equal(pushed[k], f.get_tensor(k)) for k in names)
    learner.step(synthetic_groups())
    assert not torch.equal(
        learner.state_dict_for_push()["model.embed_tokens.weight"], pushed["model.embed_tokens.weight"]
    )


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    batch = synthetic_groups(1, 4, seed=2)
    grads = []
    for checkpointing in (False, True):
        learner = make(gradient_checkpointing=checkpointing)
        learner.accumulate_gradients(batch)
        grads.append([p.grad.clone() for p in learner.model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_grad_norm_is_clipped_and_config_errors_name_the_field() -> None:
    # betas 0 and eps 1: Adam's step is lr·g/(|g| + 1) ≈ lr·g for tiny g, so ‖Δθ‖ ≈ lr·‖clipped g‖
    learner = make(max_grad_norm=1e-3, lr=1.0, betas=(0.0, 0.0), adam_eps=1.0)
    before = params(learner)
    metrics = learner.step(synthetic_groups())
    assert metrics["grad_norm"] > 0.1  # reported before clipping
    moved = sum(float((p.detach() - before[n]).double().pow(2).sum()) for n, p in learner.model.named_parameters())
    assert moved**0.5 == pytest.approx(1e-3, rel=0.02)
    with pytest.raises(ValueError, match=r"learner\.ppo_epochs"):
        make(ppo_epochs=0)


def test_dropout_is_off_so_the_ratio_compares_the_same_function() -> None:
    from grpo.trainer.learner.policy import load_causal_lm, prepare_model

    model = load_causal_lm(str(ensure_tiny_model()))
    model.config.attention_dropout = 0.5
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    model.train()
    noisy = [model(input_ids=ids).logits for _ in range(2)]
    assert not torch.equal(noisy[0], noisy[1])  # the check can fail: dropout was live
    prepare_model(model, LearnerConfig())
    a, b = (model(input_ids=ids).logits for _ in range(2))
    assert model.training and torch.equal(a, b) and model.config.attention_dropout == 0.0


def test_reference_refresh_counts_updates_not_version_numbers(tmp_path: Path) -> None:
    learner = make(beta=0.04, ref_refresh_steps=3)
    learner.version = 7  # the trainer's first push after a resume or behind newer replicas jumps the version
    batch = synthetic_groups()
    refreshed = []
    for _ in range(6):
        before = {k: v.clone() for k, v in learner.ref_model.state_dict().items()}
        learner.step(batch)
        refreshed.append(any(not torch.equal(before[k], v) for k, v in learner.ref_model.state_dict().items()))
    assert refreshed == [False, False, True, False, False, True]  # every 3rd update, whatever the version
    (tmp_path / "ckpt").mkdir()
    state = learner.save_state(tmp_path / "ckpt")
    assert state == {"version": 13, "updates": 6}


def test_bf16_runs_policy_old_and_reference_at_one_precision() -> None:
    """precision bf16 (autocast, on CPU here as on a GPU): π_θ, the recomputed π_old and the reference all run the
    same bf16 forward, so the first pass has ratio 1 and KL 0 exactly, while its numbers are bf16's, not fp32's."""
    from grpo.trainer.learner.batch import build_micro_batches
    from grpo.trainer.learner.policy import forward_logprobs

    batch = synthetic_groups()
    mb = build_micro_batches(batch, micro_batch_size=len(batch), pad_id=0)[0]
    logps = {}
    for precision in ("fp32", "bf16"):
        learner = make(beta=0.1, ppo_epochs=2, precision=precision)
        metrics = learner.accumulate_gradients(batch)
        assert metrics["kl"] == 0.0 and metrics["ratio_mean"] == 1.0 and metrics["clip_frac"] == 0.0
        with torch.no_grad(), learner.backend.autocast():
            logp, _ = forward_logprobs(learner.model, mb, 1.0)
        assert logp.dtype == torch.float32  # log-probs (hence ratios and KL) are fp32 at either precision
        logps[precision] = logp
    gap = float(((logps["bf16"] - logps["fp32"]) * mb.completion_mask).abs().max())
    assert 1e-4 < gap < 0.5, f"bf16 log-probs differ from fp32 by {gap:.2e}: is autocast on?"


def test_precision_auto_and_its_conflict_with_exact_sampler_logprobs() -> None:
    from grpo.trainer.learner.config import resolve_precision

    assert resolve_precision("auto", on_gpu=True, sampler_exact=False) == "bf16"
    assert resolve_precision("auto", on_gpu=True, sampler_exact=True) == "fp32"
    assert resolve_precision("auto", on_gpu=False, sampler_exact=False) == "fp32"
    assert resolve_precision("bf16", on_gpu=False, sampler_exact=False) == "bf16"
    with pytest.raises(ValueError, match="sampler_exact"):
        LearnerConfig(precision="bf16", sampler_exact=True).validate()
    with pytest.raises(ValueError, match="precision"):
        LearnerConfig(precision="fp16").validate()
