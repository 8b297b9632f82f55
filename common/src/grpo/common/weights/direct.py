"""Direct push: every replica gets its own copy, concurrently, by the transport it advertises (data port or stream).

The trainer's egress grows with the replicas (relay and broadcast send fewer copies); each replica is retried on
its own, within the push's deadline, under the one retry policy (grpo.common.retry).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc

from grpo.common.retry import Backoff, RetryPolicy
from grpo.common.weights.base import FleetSender, PushResult, ReplicaTarget, Round, verify_reply
from grpo.common.weights.data_port import sender_for

log = logging.getLogger(__name__)


class DirectSender(FleetSender):
    """Each target its own push (`sender_for` its advertised data port), `retries` more attempts each."""

    def __init__(self, retries: int) -> None:
        self.retries = retries

    def send(self, push: Round, targets: Sequence[ReplicaTarget]) -> list[PushResult | None]:
        futures = [push.pool.submit(push_one, push, t, self.retries) for t in targets]
        return [f.result() for f in futures]


def push_one(push: Round, target: ReplicaTarget, retries: int, route: str = "direct") -> PushResult:
    """One replica's push, retried up to `retries` times while the deadline allows; its `PushResult`."""
    start, version, deadline, checksum = time.monotonic(), push.version, push.deadline, push.checksum
    sender = sender_for(target.data_port, rate=push.rate)
    # The one retry policy (grpo.common.retry), bounded by the push's own deadline as well as by `retries`.
    policy = RetryPolicy(base_s=0.5, cap_s=5.0, attempts=retries + 1, deadline_s=max(deadline - start, 0.0))
    backoff = Backoff(policy, f"weight push of version {version} to {target.replica_id}", logger=log)
    error, attempts = "", 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0.5:
            error = error or "push deadline passed"
            break
        attempts += 1
        try:
            reply = sender.push(target.address, push.tensors, version, token=push.token, timeout_s=remaining,
                                checksum=checksum, ca_file=push.ca_file)  # fmt: skip
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            error = f"{code.name if code else 'error'}: {exc.details() if hasattr(exc, 'details') else exc}"
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                break  # the replica holds a newer version: a retry cannot fix it
            # ABORTED (another update in progress), UNAVAILABLE, ...: worth another attempt after a wait
        else:
            error = verify_reply(reply, version, checksum.result())
            if not error:
                return PushResult(target.replica_id, target.address, True, reply.version, reply.checksum, "",
                                  time.monotonic() - start, attempts, route, sender.bytes_sent)  # fmt: skip
        if not backoff.wait(error):
            break
    return PushResult(target.replica_id, target.address, False, error=error, seconds=time.monotonic() - start,
                      attempts=attempts, route=route, bytes_sent=sender.bytes_sent)  # fmt: skip
