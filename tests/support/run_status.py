"""Polling a trainer's /v1/status until a condition holds, for the tests that run the services as a user does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Status = dict[str, Any]


def wait_for_status(
    fetch: Callable[[], Status | None],
    predicate: Callable[[Status], bool],
    what: str,
    timeout: float,
    context: Callable[[], str],
    on_status: Callable[[Status], None] = lambda status: None,
) -> Status:
    """Poll `fetch` (None while the trainer is not answering) until `predicate` holds.

    A failed run or the deadline raises AssertionError with `context()` (logs, pod states) appended.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = fetch()
        if status is not None:
            on_status(status)
            if status.get("phase") == "failed":
                raise AssertionError(f"the run failed: {status.get('error')}\n{context()}")
            if predicate(status):
                return status
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{context()}")
