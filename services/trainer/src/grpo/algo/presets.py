"""The loss settings' one definition (LossConfig's field defaults) and the named presets built from it.

Every other place takes its defaults from here: the `grpo` preset is LossConfig's defaults, the other presets
change only what their paper changes, the trainer's settings default to None ("the preset's"), LearnerConfig's
loss fields and group_advantages' keywords default to DEFAULTS' values, and policy_loss has none of its own.
Pure data, no torch: the trainer's settings read it before torch loads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

LABELS = ("name", "source", "notes")  # what names and documents a preset; not a setting


@dataclass(frozen=True)
class LossConfig:
    """One algorithm's knobs. Its field defaults are the project's defaults (the `grpo` preset, R1's settings)."""

    name: str
    source: str  # the paper (and section) the values come from
    # advantages (group_advantages)
    advantage_mode: str = "grpo"
    std_unbiased: bool = True  # ÷(G−1), as the seeds' pseudo-code, TRL and veRL (torch.std); False: ÷G
    advantage_eps: float = 1e-4  # TRL's; 1e-6 turns float-noise reward differences into ±0.5 advantages
    reward_clip: tuple[float, float] | None = None  # clamp rewards before the group statistics
    # policy loss (policy_loss)
    clip_low: float = 0.2
    clip_high: float = 0.2
    beta: float = 0.001
    kl_kind: str = "k3"
    agg: str = "seq_mean_token_mean"
    ratio_level: str = "token"
    tis_cap: float | None = None
    mask_truncated: bool = False  # completions cut by the length limit leave the loss (DAPO); R1 and TRL keep them
    # sampling and the run around the loss (read by the trainer and the reward service)
    group_size: int = 16
    skip_zero_variance: bool = True  # drop groups whose rewards are all equal (their advantages are 0)
    refill_zero_variance: bool = False  # DAPO dynamic sampling: keep sampling until the batch is full
    # What "all equal" compares: `reward` (clipped, as the advantages see it), `accuracy` (the math/code
    # correctness score, DAPO's filter), or `auto`: accuracy with dynamic sampling, else the reward.
    zero_variance_on: str = "auto"
    ref_refresh_steps: int | None = 400  # π_ref ← π_θ every N steps; None = never (or no reference at beta 0)
    overlong_soft_penalty: bool = False  # DAPO soft overlong punishment, applied by the reward service
    overlong_buffer: int | None = None  # tokens before the hard limit where that penalty ramps up
    # credit (credit.py): `outcome`, one advantage per completion; `process`, per step from step scores;
    # `vineppo`, per step from value estimates by continuations sampled at the step boundaries
    credit: str = "outcome"
    process_advantage: str = "cumulative"  # DeepSeekMath's Σ of later normalised steps, or `step_aligned`
    process_weight: float = 1.0  # A = (1 − w)·A_outcome + w·A_process; 1: pure process supervision
    vine_k: int = 4  # VinePPO: continuations sampled per split point
    vine_max_splits: int = 4  # VinePPO: split points per completion at most (evenly spread over its steps)
    notes: str = field(default="", compare=False)

    @classmethod
    def knobs(cls) -> tuple[str, ...]:
        """The settings' names (all fields but the labels), in declaration order: each is a trainer setting too."""
        return tuple(f.name for f in fields(cls) if f.name not in LABELS)

    def advantage_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for group_advantages (group_size aside)."""
        return {
            "mode": self.advantage_mode,
            "eps": self.advantage_eps,
            "std_unbiased": self.std_unbiased,
            "clip": self.reward_clip,
        }

    def zero_variance_basis(self) -> str:
        """`reward` or `accuracy`: what the zero-variance filter compares (resolves `auto`).

        DAPO filters on accuracy: a group all wrong is dropped even when the overlong penalty varies.
        Without refills, skipping only drops groups the advantages would zero anyway, so it uses the reward:
        a group all wrong whose format reward varies still carries a gradient and is trained.
        """
        if self.zero_variance_on not in ("auto", "reward", "accuracy"):
            raise ValueError(f"zero_variance_on must be auto, reward or accuracy, got {self.zero_variance_on!r}")
        if self.zero_variance_on == "auto":
            return "accuracy" if self.refill_zero_variance else "reward"
        return self.zero_variance_on

    def loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for policy_loss (add max_len for seq_mean_token_sum, sampler_logp for TIS)."""
        return {
            "clip_low": self.clip_low,
            "clip_high": self.clip_high,
            "beta": self.beta,
            "kl_kind": self.kl_kind,
            "agg": self.agg,
            "ratio_level": self.ratio_level,
            "tis_cap": self.tis_cap,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, e.g. to seed a pydantic model or log the run's algorithm."""
        return asdict(self)

    def with_overrides(self, **changes: Any) -> LossConfig:
        """A copy with some fields changed (the preset itself is frozen)."""
        return replace(self, **changes)


Preset = LossConfig

# The defaults as a value: the grpo preset, and what LearnerConfig and group_advantages default to.
DEFAULTS = LossConfig(
    name="grpo",
    source="Shao et al. 2024, DeepSeekMath (arXiv 2402.03300) §4; DeepSeek-AI 2025, DeepSeek-R1 (arXiv 2501.12948)",
    notes="R1's settings: beta 0.001 with k3, G 16, reference refresh every 400 steps, skip all-equal groups.",
)

PRESETS: dict[str, LossConfig] = {
    "grpo": DEFAULTS,
    "dapo": replace(
        DEFAULTS,
        name="dapo",
        source="Yu et al. 2025, DAPO (arXiv 2503.14476) §3",
        clip_high=0.28,
        beta=0.0,
        agg="token_mean",
        refill_zero_variance=True,
        ref_refresh_steps=None,
        overlong_soft_penalty=True,
        overlong_buffer=4096,
        mask_truncated=True,
        notes="Clip-higher 0.2/0.28, dynamic sampling, token-level loss, overlong masking and shaping "
        "(L_cache 4096), no KL.",
    ),
    "dr_grpo": replace(
        DEFAULTS,
        name="dr_grpo",
        source="Liu et al. 2025, Understanding R1-Zero-Like Training (arXiv 2503.20783)",
        advantage_mode="dr_grpo",
        beta=0.0,
        agg="seq_mean_token_sum",
        ref_refresh_steps=None,
        notes="No std division, no per-answer length division (constant max_len instead), no KL.",
    ),
    "rloo": replace(
        DEFAULTS,
        name="rloo",
        source="Ahmadian et al. 2024, Back to Basics (arXiv 2402.14740); Kool et al. 2019",
        advantage_mode="rloo",
        notes="GRPO with the leave-one-out baseline and no std division; everything else as grpo.",
    ),
    "reinforce_pp": replace(
        DEFAULTS,
        name="reinforce_pp",
        source="Hu 2025, REINFORCE++ (arXiv 2501.03262), the REINFORCE++-baseline variant",
        advantage_mode="reinforce_pp",
        kl_kind="k2",
        agg="token_mean",
        notes="Group-mean baseline, batch-global std normalisation, k2 KL as a loss term, token-mean loss.",
    ),
    "gspo": replace(
        DEFAULTS,
        name="gspo",
        source="Zheng et al. 2025, Group Sequence Policy Optimization (arXiv 2507.18071)",
        ratio_level="sequence",
        clip_low=3e-4,
        clip_high=4e-4,
        beta=0.0,
        ref_refresh_steps=None,
        notes="Length-normalised sequence ratio, clip range 3e-4/4e-4 as in the paper's experiments, no KL.",
    ),
    "prm": replace(
        DEFAULTS,
        name="prm",
        source="Shao et al. 2024, DeepSeekMath (arXiv 2402.03300) §4.1.3, process supervision; the seed's §15.7.4",
        credit="process",
        process_weight=0.5,
        notes="Step scores (a rule or a PRM) normalised over the whole group; each token gets the sum of the "
        "normalised scores of its step and the steps after it, mixed half and half with the outcome advantage.",
    ),
    "vineppo": replace(
        DEFAULTS,
        name="vineppo",
        source="Kazemnejad et al. 2024, VinePPO (arXiv 2410.01679) §3; the seed's §15.8",
        credit="vineppo",
        notes="No critic: the value of each step boundary is the mean reward of vine_k continuations sampled there; "
        "a step's advantage is the value after it minus the value before (the prompt's value is the group's mean "
        "reward, the last value the completion's own reward). Costs vine_k × split points extra rollouts.",
    ),
}


def get_preset(name: str) -> LossConfig:
    """The preset called `name`; ValueError listing the valid names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}") from None


def check_kl_loss(kind: str, beta: float) -> None:
    """Refuse an estimator whose gradient regularises nothing as a loss term.

    On tokens sampled from π_θ, E[∇k1] = E[∇log π_θ] = 0: β·k1 in the loss only adds noise. k2's gradient
    is the reverse KL(π_θ‖π_ref)'s; k3's is the forward KL(π_ref‖π_θ)'s (its value, not its gradient, is
    the unbiased reverse-KL estimate). k1 remains available as a measurement (beta = 0).
    """
    if beta > 0 and kind == "k1":
        raise ValueError(
            "kl_kind='k1' with beta > 0 regularises nothing: its expected gradient is E[∇log π] = 0. "
            "Use k3 (GRPO, DeepSeekMath) or k2 (the reverse-KL gradient) as the loss term, or beta=0 to only measure k1"
        )
