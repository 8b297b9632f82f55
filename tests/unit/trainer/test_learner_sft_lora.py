"""SFT mode (loss on response tokens only) and LoRA (only adapters train, pushes merged HF weights)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from grpo.algo.logprobs import sft_loss
from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.learner import Learner, LearnerConfig, LoraOptions, SftPair, TrainableSample
from grpo.trainer.learner.batch import build_micro_batches, sft_to_samples


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def pairs(n: int = 6, seed: int = 0) -> list[SftPair]:
    rng = random.Random(seed)
    return [
        SftPair([rng.randrange(5, 400) for _ in range(rng.randint(3, 6))], [rng.randrange(5, 400) for _ in range(5)])
        for _ in range(n)
    ]


def make(**kw: object) -> Learner:
    # beta 0 unless a test sets it: no reference model (LearnerConfig's own default is the grpo preset's beta)
    kw = {"lr": 3e-3, "micro_batch_size": 4, "beta": 0.0, **kw}
    return Learner(LearnerConfig(model=str(ensure_tiny_model()), **kw))  # type: ignore[arg-type]


def test_sft_lowers_the_response_loss() -> None:
    learner, data = make(), pairs()
    start = learner.sft_eval_loss(data)
    for _ in range(5):
        metrics = learner.sft_step(data)
    assert learner.sft_eval_loss(data) < start - 0.5
    assert metrics["tokens"] == 6 * 5  # response tokens only


def test_sft_ignores_prompt_labels() -> None:
    learner = make()
    mb = build_micro_batches(sft_to_samples(pairs(4)), micro_batch_size=4, pad_id=0)[0]
    with torch.no_grad():
        logits = learner.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1]
    scrambled = torch.where(mb.completion_mask.bool(), mb.targets, torch.randint_like(mb.targets, 5, 400))
    assert not torch.equal(scrambled, mb.targets)
    assert float(sft_loss(logits, scrambled, mb.completion_mask)) == float(
        sft_loss(logits, mb.targets, mb.completion_mask)
    )
    assert mb.n_tokens == 4 * 5


def test_lora_step_changes_only_adapters_and_pushes_merged_base_names() -> None:
    learner = make(lora=LoraOptions(r=4, alpha=8), lr=1e-2)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    plain_names = set(make().state_dict_for_push())
    pushed_before = {k: v.clone() for k, v in learner.state_dict_for_push().items()}
    batch = [TrainableSample([5, 6, 7], [8, 9, 10 + i], advantage=1.0 if i % 2 else -1.0) for i in range(4)]
    for _ in range(2):
        learner.step(batch)
    changed = {n for n, p in learner.model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_A" in n for n in changed) and any("lora_B" in n for n in changed)
    pushed = learner.state_dict_for_push()
    assert set(pushed) == plain_names
    assert not torch.equal(
        pushed["model.layers.0.self_attn.q_proj.weight"], pushed_before["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(pushed["model.layers.0.mlp.up_proj.weight"], pushed_before["model.layers.0.mlp.up_proj.weight"])


def test_lora_dropout_is_refused() -> None:
    """The learner trains without dropout (test_learner: the ratio compares one function); adapters too."""
    with pytest.raises(ValueError, match=r"LoRA dropout=0.1: must be 0"):
        LoraOptions(r=4, dropout=0.1)
    assert LoraOptions(r=4).dropout == 0.0


def test_lora_checkpoint_round_trip(tmp_path: Path) -> None:
    from grpo.trainer.checkpoint import resume, save_checkpoint

    batch = [TrainableSample([5, 6, 7], [8, 9, 10 + i], advantage=1.0 if i % 2 else -1.0) for i in range(4)]
    a = make(lora=LoraOptions(r=4, alpha=8), lr=1e-2)
    a.step(batch)
    save_checkpoint(tmp_path, a, step=1)
    assert (tmp_path / "step-00000001" / "model" / "adapter_model.safetensors").is_file()
    b = make(lora=LoraOptions(r=4, alpha=8), lr=1e-2)
    assert resume(tmp_path, b) is not None
    a.step(batch)
    b.step(batch)
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q), name
