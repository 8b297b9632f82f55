"""The rollout replicas' copy of the weights: which replicas hold the current version, and a push to those that do not.

A replica holds a version by its heartbeat, or, since the heartbeat lags a push by up to heartbeat_s, by this
incarnation's reply to the push. The push itself (direct, relay or broadcast) is pusher.py's; this module decides
whom to push to, keeps the replies, and counts what a step pushed (push/* metrics).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from grpo.common.registry import ReplicaInfo, ReplicaRegistry
from grpo.common.weights.broadcast import WeightBroadcaster
from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.errors import RunError
from grpo.trainer.pusher import ReplicaTarget, highest_pushed_in_run, push_mode, push_to_replicas, record_pushed
from grpo.trainer.redis_retry import Retry
from grpo.trainer.waiting import WaitReporter

if TYPE_CHECKING:
    import torch

    from grpo.trainer.colocated import ColocatedDriver

log = logging.getLogger(__name__)
RESYNC_S = 2.0  # while groups are awaited, how often the registry is read for replicas that lack the weights


class ReplicaSync:
    """The live replicas (from the registry) and which of them took which version (from the push replies)."""

    def __init__(
        self,
        settings: TrainerSettings,
        registry: ReplicaRegistry,
        retry: Retry,
        broadcaster: WeightBroadcaster | None = None,
    ) -> None:
        self.s = settings
        self.registry = registry
        self.retry = retry
        self.broadcaster = broadcaster
        self.confirmed: dict[str, int] = {}  # replica id -> version it confirmed (push reply)
        # replica id -> the incarnation that confirmed it: one restarted under the same id is back on the model from
        # disk, and is pushed to again
        self.confirmed_by: dict[str, str] = {}
        self.synced_at = 0.0  # when the last resync looked for replicas that lack the current weights
        self.push_stats: dict[str, float] = {}  # this step's push/* counts, summed over its pushes
        self.colocated: ColocatedDriver | None = None  # this process's own replica (colocated.py), never pushed to

    def live(self) -> list[ReplicaInfo]:
        return self.retry(self.registry.live_replicas, "reading the replica registry")

    def await_replicas(self, control: RunControl, waiting: WaitReporter) -> list[ReplicaInfo] | None:
        """The live replicas once min_replicas are (None: a stop came first); RuntimeError after replica_wait_s."""
        s = self.s
        deadline = time.monotonic() + s.replica_wait_s
        live = self.live()
        while len(live) < s.min_replicas:
            if control.stopping:
                return None
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(live)} live rollout replica(s) for run {s.run_id!r} after "
                    f"{s.replica_wait_s:.0f}s (need {s.min_replicas}); are they started with the same "
                    "--redis-url and run name?"
                )
            waiting.tick(f"waiting for rollout replicas: {len(live)} of {s.min_replicas} live "
                         f"(the run fails after {s.replica_wait_s:.0f}s)")  # fmt: skip
            control.stop_event.wait(0.5)
            live = self.live()
        waiting.done()
        return live

    def fresh_version(self, live: list[ReplicaInfo], version: int) -> int:
        """A version above every one ever pushed in this run (every stage's output dir), not only the live
        replicas': restarted with the trainer, they report 0, and the lost lineage's first version would be reused,
        its groups trained as on-policy; and a heartbeat can lag the last stage's final push, whose version would
        then be reused for this stage's other weights (the replica, holding it, never pushed)."""
        newest = max([r.weight_version for r in live], default=0)
        return max(version, newest, highest_pushed_in_run(self.s.output_dir, self.s.stage > 0)) + 1

    def holds(self, replica: ReplicaInfo, version: int) -> bool:
        """Whether `replica` holds `version`: by its heartbeat, or by this incarnation's push reply (a colocated
        replica: by its own word, it shares the learner's weights)."""
        if self.colocated is not None and replica.replica_id == self.colocated.rollout.replica_id:
            return self.colocated.rollout.version >= version
        if replica.weight_version >= version:
            return True
        confirmed = self.confirmed.get(replica.replica_id) == version
        return confirmed and self.confirmed_by.get(replica.replica_id) == replica.incarnation

    def push(
        self, version: int, tensors: Callable[[], Mapping[str, torch.Tensor]], live: list[ReplicaInfo] | None = None
    ) -> float:
        """Push `version` (tensors() gathers it) to every live replica that does not hold it yet; seconds spent."""
        s = self.s
        live = self.live() if live is None else live
        targets = [
            ReplicaTarget(r.replica_id, r.address, r.weights_data_port) for r in live if not self.holds(r, version)
        ]
        if not targets:
            return 0.0
        started = time.monotonic()
        record_pushed(s.output_dir, version)  # durable before any replica can hold it
        results = push_to_replicas(
            targets, tensors(), version, token=s.weights_token, timeout_s=s.push_timeout_s,
            retries=s.push_retries, ca_file=s.rollout_tls_ca_file,
            mode=push_mode(s.weight_push, len(targets)), fanout=s.relay_fanout,
            broadcaster=self.broadcaster, send_rate_mb_s=s.weights_send_rate_mb_s,
        )  # fmt: skip
        incarnations = {r.replica_id: r.incarnation for r in live}
        for r in results:
            if r.ok:
                self.confirmed[r.replica_id] = r.version
                self.confirmed_by[r.replica_id] = incarnations.get(r.replica_id, "")
        # Judged over every live replica, not this call's targets: one that took the version earlier serves it.
        if not any(self.holds(r, version) for r in live):
            log.error("no replica accepted version %d; its groups will be dropped as stale until one does",
                      version)  # fmt: skip
        for key, value in (  # summed: a step may push twice (before collecting, after training)
            ("push/ok", sum(r.ok for r in results)),
            ("push/failed", sum(not r.ok for r in results)),
            ("push/bytes_sent", sum(r.bytes_sent for r in results)),
        ):
            self.push_stats[key] = self.push_stats.get(key, 0.0) + float(value)
        return time.monotonic() - started

    def resync_due(self) -> bool:
        """Whether RESYNC_S passed since the last resync (and, if so, the clock restarts): while groups are awaited,
        replicas that joined or restarted since the step began are pushed to. They take no task published under
        weights they lack, so without it they would idle until the step's end, or, the only replica, stall the run."""
        if time.monotonic() - self.synced_at < RESYNC_S:
            return False
        self.synced_at = time.monotonic()
        return True

    def take_stats(self) -> dict[str, float]:
        """This step's push/* counts; the next step starts from none."""
        stats, self.push_stats = self.push_stats, {}
        return stats

    def close(self) -> None:
        if self.broadcaster is not None:
            self.broadcaster.close()


def check_replica_caps(
    live: list[ReplicaInfo], max_new_tokens: int, longest_prompt: int = 0, sample_budget: int = 0
) -> None:
    """RunError naming each replica that would refuse tasks: the run's max_new_tokens (a turn's limit) over its
    cap, or the longest prompt with a sample's budget (`sample_budget`: an episode's max_episode_tokens; 0 = one
    turn of max_new_tokens) past its engine's context (vLLM's --max-model-len may be below the model's). Said at
    start-up, not after `max_failed_steps` steps of failed groups. (0: a replica that does not say.)"""
    short = [f"{r.replica_id} (cap {r.max_new_tokens_cap})" for r in live if 0 < r.max_new_tokens_cap < max_new_tokens]
    if short:
        raise RunError(
            f"max_new_tokens {max_new_tokens} is over what rollout replica(s) {', '.join(short)} generate: lower "
            "max_new_tokens, or start the rollout service with a larger --max-new-tokens-cap"
        )
    budget = sample_budget or max_new_tokens
    limit = f"an episode's {budget} tokens" if sample_budget else f"max_new_tokens {budget}"
    need = longest_prompt + budget
    small = [f"{r.replica_id} ({r.max_context})" for r in live if 0 < r.max_context < need]
    if small:
        raise RunError(
            f"the longest prompt ({longest_prompt} tokens) with {limit} needs a context of "
            f"{need} tokens, more than rollout replica(s) {', '.join(small)} hold: raise the rollout's context "
            "(vLLM: --vllm-max-model-len), lower max_new_tokens, or leave long prompts out (overlong_prompts: drop "
            "drops only those past the model's own context)"
        )
