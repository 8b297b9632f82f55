"""The colocated replica's settings (grpo.trainer.colocated), checked with the trainer's own at start-up: this
module loads no torch, so `grpo up` checks a stack file in its own process without it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

if TYPE_CHECKING:
    from grpo.rollout.settings import RolloutSettings
    from grpo.trainer.config import TrainerSettings

# The trainer's, whatever the colocate mapping says: the replica serves this run, from this policy.
TRAINERS = ("model", "redis_url", "run")


def replica_settings(s: TrainerSettings, model: str) -> RolloutSettings:
    """The hosted replica's rollout settings: `s.colocate` over colocated defaults (ephemeral ports, no data port),
    with the trainer's model, Redis and run. ValueError naming what is wrong."""
    values = dict(s.colocate or {})
    given = sorted(k for k in TRAINERS if k in values)
    if given:
        raise ValueError(f"colocate: {', '.join(given)} are the trainer's own (the replica shares its policy and "
                         "run); leave them out")  # fmt: skip
    if values.get("engine", "hf") != "hf":
        raise ValueError(f"colocate: engine {values['engine']!r}: a colocated replica generates with the hf engine "
                         "on the learner's module (vLLM keeps weights of its own); run vLLM as separate replicas")  # fmt: skip
    if not values.get("reward_addr"):
        raise ValueError("colocate.reward_addr is required: the reward service's host:port, which the replica's "
                         "groups are scored by")  # fmt: skip
    try:
        from grpo.rollout.settings import RolloutSettings
    except ImportError:
        raise ValueError("colocate needs the rollout service's package (grpo-rollout) installed beside the "
                         "trainer") from None  # fmt: skip
    defaults = {"grpc_port": 0, "http_port": 0, "weights_data_port": -1, "replica_id": f"{s.run_id}-colocated"}
    try:
        return RolloutSettings.model_validate(
            {**defaults, **values, "engine": "hf", "model": model, "redis_url": s.redis_url, "run": s.run_id}
        )
    except ValidationError as exc:
        problems = [f"colocate.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ValueError("; ".join(problems)) from None
