"""The weight pusher's retries follow the one retry policy (grpo.common.retry): they wait, and stop at the deadline."""

from __future__ import annotations

import time

import torch

from grpo.common.net import free_port
from grpo.trainer.pusher import ReplicaTarget, push_to_replicas


def test_a_failed_push_waits_before_each_retry() -> None:
    target = ReplicaTarget("gone", f"127.0.0.1:{free_port()}")  # nothing listens: UNAVAILABLE at once
    start = time.monotonic()
    [result] = push_to_replicas([target], {"w": torch.zeros(4)}, 1, timeout_s=30, retries=2)
    took = time.monotonic() - start
    assert not result.ok and result.attempts == 3 and "UNAVAILABLE" in result.error
    # Backoff 0.5 s then 1 s, each jittered by at most ±50%: no retry storm against a restarting replica.
    assert 0.7 <= took < 5, took


def test_retries_end_at_the_push_deadline() -> None:
    start = time.monotonic()
    [result] = push_to_replicas([ReplicaTarget("gone", f"127.0.0.1:{free_port()}")], {"w": torch.zeros(4)}, 1,
                                timeout_s=2, retries=100)  # fmt: skip
    assert not result.ok and time.monotonic() - start < 3.5


def test_a_broadcast_to_nobody_falls_back_and_still_ends_at_once() -> None:
    """With a broadcaster, a replica that is not there fails the round at once (its call ends before it
    joins) and gets the ordinary push, with its retries, instead of a collective timeout."""
    from grpo.common.weight_broadcast import WeightBroadcaster

    broadcaster = WeightBroadcaster("127.0.0.1:0", timeout_s=30)
    try:
        start = time.monotonic()
        [result] = push_to_replicas([ReplicaTarget("gone", f"127.0.0.1:{free_port()}")], {"w": torch.zeros(4)}, 1,
                                    timeout_s=30, retries=1, broadcaster=broadcaster)  # fmt: skip
        took = time.monotonic() - start
    finally:
        broadcaster.close()
    assert not result.ok and result.attempts == 2 and "UNAVAILABLE" in result.error
    assert took < 5, took  # not the 30 s collective timeout
    assert broadcaster.epoch == 1 and broadcaster.pieces_sent == 0
