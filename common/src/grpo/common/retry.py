"""The one retry policy: exponential backoff with a cap and jitter, an attempts and a time limit, a stop event.

Every retry loop in the services uses it (docs/reliability.md lists them), so there is one place to read how
a failure is retried. `retry(call, ...)` wraps a call that raises; `Backoff` is the same policy for loops of
another shape (a worker loop that runs forever and resets after each success, a push judged by its reply).

>>> retry(lambda: 42, "reading the answer", RetryPolicy(attempts=3))
42
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait between attempts and when to give up."""

    base_s: float = 0.5
    """Wait after the first failure; doubled after each further one."""
    cap_s: float = 10.0
    """Longest wait between two attempts."""
    attempts: int | None = None
    """Attempts in all, the first included; None: no limit."""
    deadline_s: float | None = None
    """Give up once this long has passed since the first failure; the last wait is cut short to end on it."""
    jitter: float = 0.5
    """Each wait is scaled by a random factor in [1 - jitter, 1 + jitter], so replicas do not retry in step."""

    def delay(self, failures: int) -> float:
        """Seconds to wait after `failures` consecutive failed attempts (1-based)."""
        plain = min(self.cap_s, self.base_s * 2 ** min(failures - 1, 30))
        return plain * (1 + self.jitter * (2 * random.random() - 1))


class Backoff:
    """One retry loop's state: call `wait(reason)` after each failed attempt and `reset()` after a success."""

    def __init__(
        self, policy: RetryPolicy, what: str, stop: threading.Event | None = None, logger: logging.Logger = log
    ) -> None:
        self.policy, self.what, self.stop, self.log = policy, what, stop, logger
        self.failures = 0
        self.first_failure = 0.0

    def reset(self) -> None:
        self.failures = 0

    def wait(self, reason: object, *, exc_info: bool = False) -> bool:
        """Log the failure and wait before the next attempt; False, at once, when the attempts or the time are
        spent or the stop event is set (the caller then gives up and reports `reason`). `exc_info` adds the
        traceback of the exception being handled to the log line (for errors that look like bugs)."""
        now = time.monotonic()
        self.failures += 1
        if self.failures == 1:
            self.first_failure = now
        p = self.policy
        if (p.attempts is not None and self.failures >= p.attempts) or (self.stop is not None and self.stop.is_set()):
            return False
        delay = p.delay(self.failures)
        if p.deadline_s is not None:
            left = self.first_failure + p.deadline_s - now
            if left <= 0:
                return False
            delay = min(delay, left)
        self.log.warning(
            "%s failed (%s); retry %d in %.2fs", self.what, reason, self.failures, delay, exc_info=exc_info
        )
        if self.stop is not None:
            return not self.stop.wait(delay)
        time.sleep(delay)
        return True

    @property
    def elapsed_s(self) -> float:
        """Seconds since the first of the current run of failures."""
        return time.monotonic() - self.first_failure if self.failures else 0.0


def retry(
    call: Callable[[], T],
    what: str,
    policy: RetryPolicy,
    *,
    on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    retryable: Callable[[BaseException], bool] = lambda exc: True,
    stop: threading.Event | None = None,
    describe: Callable[[BaseException], str] = lambda exc: f"{type(exc).__name__}: {exc}",
    logger: logging.Logger = log,
) -> T:
    """`call()`, retried under `policy` while it raises one of `on` that `retryable` accepts; once the policy
    gives up (or `stop` is set) the last exception propagates, for the caller to turn into its own error.
    `describe` says why an attempt failed in the log line."""
    backoff = Backoff(policy, what, stop, logger)
    while True:
        try:
            return call()
        except on as exc:
            if not retryable(exc) or not backoff.wait(describe(exc)):
                raise
