"""What the trainer is waiting for, said every few seconds while it waits: a missing replica is otherwise silence."""

from __future__ import annotations

import logging
import time

from grpo.common.queue import QueueUnavailable, RunQueue, redacted
from grpo.common.registry import ReplicaRegistry

log = logging.getLogger(__name__)

REPORT_EVERY_S = 15.0  # how often a wait is reported
IDLE_HINT_S = 30.0  # tasks queued this long with no replica taking one: say where to look


class WaitReporter:
    """Call `tick(what)` from a waiting loop and `done()` when the wait is over (a group came, replicas joined).

    Every `every_s` of one wait it logs what is awaited, what Redis holds for the run (tasks queued and taken),
    which rollout replicas are registered, and a hint when none is, or none takes a task for `idle_hint_s`."""

    def __init__(
        self,
        queue: RunQueue,
        registry: ReplicaRegistry,
        redis_url: str,
        every_s: float = REPORT_EVERY_S,
        idle_hint_s: float = IDLE_HINT_S,
    ) -> None:
        self.queue, self.registry, self.url = queue, registry, redacted(redis_url)
        self.every_s, self.idle_hint_s = every_s, idle_hint_s
        self._since: float | None = None
        self._reported = 0.0
        self._last_delivered: str | None = None  # the tasks stream's last delivered id: it moves when one is taken
        self._taken_at = 0.0

    def done(self) -> None:
        """The wait is over; the next one starts its own clock."""
        self._since = None

    def tick(self, what: str) -> None:
        """Log `what` (what the loop awaits) with Redis' view, if this wait has gone unreported for `every_s`."""
        now = time.monotonic()
        if self._since is None:
            self._since = self._reported = now
            return
        if now - self._reported >= self.every_s:
            self._reported = now
            log.info("%s", self.describe(what, now - self._since, now))

    def describe(self, what: str, waited_s: float, now: float) -> str:
        run = self.queue.run
        try:
            tasks = self.queue.stats()["tasks"]
            live = self.registry.live_replicas()
        except QueueUnavailable as exc:
            return f"{what} (waited {waited_s:.0f}s); Redis at {self.url} is unreachable: {exc}"
        if tasks.last_delivered != self._last_delivered:
            self._last_delivered, self._taken_at = tasks.last_delivered, now
        names = f" ({', '.join(r.replica_id for r in live)})" if live else ""
        text = (
            f"{what} (waited {waited_s:.0f}s); run {run!r} on {self.url}: {tasks.lag} task(s) queued, "
            f"{tasks.pending} taken by a replica and not done, {len(live)} live rollout replica(s){names}"
        )
        idle_s = now - self._taken_at
        if not live:
            return (
                f"{text}. No rollout replica is registered: is the rollout service running with "
                f"--redis-url {self.url} --run {run}?"
            )
        if tasks.lag and idle_s >= self.idle_hint_s:
            return (
                f"{text}. No rollout replica has taken a task in {idle_s:.0f}s: are they stuck or overloaded "
                "(see their logs and /metrics)?"
            )
        return text
