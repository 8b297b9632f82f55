"""Polling a trainer's /v1/status until a condition holds, for the tests that run the services as a user does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.polling import wait_until

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

    def holds() -> Status | None:
        status = fetch()
        if status is None:
            return None
        on_status(status)
        if status.get("phase") == "failed":
            raise AssertionError(f"the run failed: {status.get('error')}\n{context()}")
        return status if predicate(status) else None

    return wait_until(holds, timeout, what, every=2, context=lambda: f"\n{context()}")
