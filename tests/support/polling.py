"""Waiting in tests: poll a condition until it holds or a deadline passes, and fail saying what was awaited."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _never() -> str | None:
    return None


def _nothing() -> str:
    return ""


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    every: float = 0.05,
    stop: Callable[[], str | None] = _never,
    context: Callable[[], str] = _nothing,
) -> T:
    """Poll `predicate` until it returns something truthy, and return that.

    Fails (AssertionError) after `timeout` s naming `what`, or at once when `stop()` gives a reason to give up
    (a process that exited: waiting on would only run out the clock); `context()` (a log tail, the last answer)
    is appended to either message.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        reason = stop()
        if reason:
            raise AssertionError(f"{reason} while waiting for {what}{context()}")
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{context()}")


def exited(proc: subprocess.Popen[bytes], *, failed_only: bool = False) -> Callable[[], str | None]:
    """A `stop` for wait_until: the process has exited (with `failed_only`, with a code other than 0)."""

    def reason() -> str | None:
        code = proc.poll()
        if code is None or (failed_only and code == 0):
            return None
        return f"the process exited with code {code}"

    return reason
