"""policy_loss with the settings the hand-computed tests assume: it has no defaults of its own (theirs are
LossConfig's), and a hand computation must not move when a project default does."""

from __future__ import annotations

import functools

from grpo.algo import policy_loss

# PPO's ε = 0.2 both ways, no KL (the cases pass no ref_logp unless they set beta), per-token ratios, no TIS.
PLAIN_SETTINGS = {
    "clip_low": 0.2,
    "clip_high": 0.2,
    "beta": 0.0,
    "kl_kind": "k3",
    "agg": "seq_mean_token_mean",
    "ratio_level": "token",
    "tis_cap": None,
}

# A call's own keywords override these (functools.partial), e.g. plain_loss(*batch, agg="token_mean").
plain_loss = functools.partial(policy_loss, **PLAIN_SETTINGS)
