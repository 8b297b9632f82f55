"""policy_loss over a multi-turn episode: environment tokens (mask 0) reach no term, no metric, no gradient.

The worked example of docs/multi-turn.md: a prompt of 3 tokens, then the completion [m, m, e, e, m] — two model
tokens, a tool result of two environment tokens, one more model token. The environment positions hold what a record
holds there (sampler log-prob 0.0) and values chosen so that any term reading them changes the result.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo.algo.logprobs import token_logprobs
from tests.unit.algo.helpers import plain_loss

MASK = [1, 1, 0, 0, 1]
MODEL = [0, 1, 4]  # the model tokens' columns
# Model tokens: log π_θ, log π_old, log π_ref, log π_sampler. Environment columns: a policy far from π_old
# (ratio e^±3), a reference far away, and the record's 0.0 sampler log-prob.
LOGP = [-1.0, -0.5, -4.0, -0.1, -2.0]
OLD = [-1.1, -0.5, -1.0, -3.1, -1.8]
REF = [-1.2, -0.4, -9.0, -9.0, -2.0]
SAMPLER = [-1.0, -0.6, 0.0, 0.0, -1.9]
ADV = 1.0
SETTINGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


def episode(requires_grad: bool = False) -> dict[str, torch.Tensor]:
    row = {"logp": LOGP, "old_logp": OLD, "ref_logp": REF, "sampler_logp": SAMPLER}
    out = {k: torch.tensor([v]) for k, v in row.items()}
    out["logp"].requires_grad_(requires_grad)
    return out


def model_only(requires_grad: bool = False) -> dict[str, torch.Tensor]:
    """The same episode with its environment columns removed: what the masked loss must equal."""
    return {k: v.detach()[:, MODEL].clone().requires_grad_(requires_grad and k == "logp") for k, v in episode().items()}


def run(t: dict[str, torch.Tensor], mask: list[int], **kw: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    adv, m = torch.tensor([ADV]), torch.tensor([mask])
    return plain_loss(t["logp"], t["old_logp"], adv, m, ref_logp=t["ref_logp"], **kw)


def test_hand_computed_token_loss_counts_model_tokens_only() -> None:
    # ratios e^0.1, e^0, e^-0.2 are inside [0.8, 1.2]: the loss is −mean(ρ) over the 3 model tokens, never over 5
    loss, m = run(episode(), MASK, agg="token_mean")
    ratios = [math.exp(0.1), 1.0, math.exp(-0.2)]
    assert loss.item() == pytest.approx(-sum(ratios) / 3, abs=1e-6)
    assert m["ratio_max"].item() == pytest.approx(math.exp(0.1), abs=1e-6)  # not the environment's e^3
    assert m["ratio_min"].item() == pytest.approx(math.exp(-0.2), abs=1e-6)  # nor its e^-3
    assert m["clip_frac"].item() == 0.0
    k3 = [math.exp(d) - d - 1 for d in (-0.2, 0.1, 0.0)]  # d = log π_ref − log π_θ on the model tokens
    assert m["kl"].item() == pytest.approx(sum(k3) / 3, abs=1e-6)


def test_hand_computed_sequence_ratio_averages_model_tokens_only() -> None:
    # GSPO: s = exp(mean over the 3 model tokens of log ρ) = exp((0.1 + 0 − 0.2) / 3); every model token carries s
    loss, m = run(episode(), MASK, agg="seq_mean_token_mean", ratio_level="sequence")
    s = math.exp(-0.1 / 3)
    assert loss.item() == pytest.approx(-s, abs=1e-6)
    assert m["ratio_mean"].item() == pytest.approx(s, abs=1e-6)


def test_hand_computed_tis_and_kl_terms() -> None:
    loss, m = run(episode(), MASK, agg="token_mean", beta=0.1, sampler_logp=episode()["sampler_logp"], tis_cap=1.05)
    w = [min(math.exp(o - s), 1.05) for o, s in ((-1.1, -1.0), (-0.5, -0.6), (-1.8, -1.9))]
    ratios = [math.exp(0.1), 1.0, math.exp(-0.2)]
    k3 = [math.exp(d) - d - 1 for d in (-0.2, 0.1, 0.0)]
    expected = -sum(r * wt for r, wt in zip(ratios, w, strict=True)) / 3 + 0.1 * sum(k3) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert m["tis_weight_mean"].item() == pytest.approx(sum(w) / 3, abs=1e-6)
    assert m["tis_truncated_frac"].item() == pytest.approx(2 / 3, abs=1e-6)  # e^0.1 > 1.05 twice; e^-0.1 not


@pytest.mark.parametrize("agg", SETTINGS)
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_masked_episode_equals_its_model_tokens_alone(agg: str, ratio_level: str) -> None:
    """Loss, every metric and the model tokens' gradients equal those of the model columns alone; the
    environment columns get a gradient of exactly 0 (KL, TIS, clipping and entropy all on)."""
    kw = {"agg": agg, "ratio_level": ratio_level, "max_len": 8, "beta": 0.05, "tis_cap": 2.0}
    full, alone = episode(requires_grad=True), model_only(requires_grad=True)
    entropy = torch.tensor([[0.5, 0.7, 9.0, 9.0, 0.3]])
    loss, m = run(full, MASK, sampler_logp=full["sampler_logp"], entropy=entropy, **kw)
    ref_loss, ref_m = run(alone, [1, 1, 1], sampler_logp=alone["sampler_logp"], entropy=entropy[:, MODEL], **kw)
    assert loss.item() == pytest.approx(ref_loss.item(), abs=1e-6)
    assert m.keys() == ref_m.keys()
    for key in m:
        assert m[key].item() == pytest.approx(ref_m[key].item(), abs=1e-6), key
    loss.backward()
    ref_loss.backward()
    assert full["logp"].grad is not None and alone["logp"].grad is not None
    assert full["logp"].grad[0, [2, 3]].tolist() == [0.0, 0.0]
    torch.testing.assert_close(full["logp"].grad[:, MODEL], alone["logp"].grad)


@pytest.mark.parametrize("agg", SETTINGS)
def test_per_token_advantages_at_environment_positions_are_ignored(agg: str) -> None:
    """Per-token credit: whatever advantage sits on an environment token, the loss does not move."""
    t = episode()
    losses = []
    for env_adv in (0.0, 50.0, -7.0):
        adv = torch.tensor([[1.0, 0.5, env_adv, env_adv, -1.0]])
        loss, _ = plain_loss(t["logp"], t["old_logp"], adv, torch.tensor([MASK]), agg=agg, max_len=8)
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-7) == pytest.approx(losses[2], abs=1e-7)
    assert losses[0] != 0.0


def test_environment_token_ids_do_not_matter_given_the_logits() -> None:
    """The same logits, the environment's target ids changed: the same loss, the same gradient on the logits at
    model positions, and none at environment positions (the model is never trained to predict a tool's output)."""
    torch.manual_seed(0)
    base = torch.randn(1, 5, 11)
    losses, grads = [], []
    for env_ids in ([3, 4], [9, 0]):
        logits = base.clone().requires_grad_(True)
        targets = torch.tensor([[1, 2, *env_ids, 5]])
        logp = token_logprobs(logits, targets)
        loss, _ = plain_loss(logp, logp.detach() - 0.05, torch.tensor([1.0]), torch.tensor([MASK]), agg="token_mean")
        loss.backward()
        assert logits.grad is not None
        losses.append(loss.item())
        grads.append(logits.grad.clone())
    assert losses[0] == losses[1]
    torch.testing.assert_close(grads[0], grads[1])
    assert grads[0][0, [2, 3]].abs().max().item() == 0.0
    assert grads[0][0, MODEL].abs().max().item() > 0.0
