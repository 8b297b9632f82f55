"""Every Redis call of the GRPO loop rides out an outage of up to redis_outage_s, then fails the run (never hangs)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol, TypeVar

from grpo.common.queue import QueueUnavailable
from grpo.common.retry import RetryPolicy, retry
from grpo.trainer.control import RunControl

log = logging.getLogger(__name__)
T = TypeVar("T")
REDIS_RETRY = RetryPolicy(base_s=0.5, cap_s=5.0)  # every Redis call of the loop; deadline_s is redis_outage_s


class Retry(Protocol):
    """What the loop's parts call Redis through: `retry(call, what)` (what: "reading groups", for the error)."""

    def __call__(self, call: Callable[[], T], what: str, /) -> T: ...


class RedisRetry:
    """Retries a call on QueueUnavailable for up to `outage_s`; a stop request ends the wait. Then RuntimeError
    "Redis unavailable while <what>": reported, the run fails."""

    def __init__(self, outage_s: float, control: RunControl) -> None:
        self.outage_s = outage_s
        self.control = control

    def __call__(self, call: Callable[[], T], what: str, /) -> T:
        policy = replace(REDIS_RETRY, deadline_s=self.outage_s)
        try:
            return retry(call, what, policy, on=QueueUnavailable, stop=self.control.stop_event, logger=log,
                         describe=lambda exc: f"Redis unavailable: {exc}")  # fmt: skip
        except QueueUnavailable as exc:
            why = "stopping" if self.control.stopping else f"for {self.outage_s:.0f}s"
            raise RuntimeError(f"Redis unavailable while {what} ({why})") from exc
