"""Weight push to every live rollout replica, concurrently, each verified, none able to stall the run."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from grpo.common.auth import bearer_metadata
from grpo.common.channels import make_channel
from grpo.common.retry import Backoff, RetryPolicy
from grpo.common.weight_broadcast import WeightBroadcaster, describe
from grpo.common.weight_transport import sender_for
from grpo.common.weights import weights_checksum
from grpo.v1 import rollout_pb2, rollout_pb2_grpc

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaTarget:
    """A rollout replica to push to (from the Redis registry)."""

    replica_id: str
    address: str
    data_port: int = 0  # its weights data port (the bytes go there when set)


@dataclass(frozen=True)
class PushResult:
    """How one replica's push went; `ok` only when it reports the version and checksum that were sent."""

    replica_id: str
    address: str
    ok: bool
    version: int = 0
    checksum: str = ""
    error: str = ""
    seconds: float = 0.0
    attempts: int = 1


def verify_reply(reply: rollout_pb2.UpdateWeightsResponse, version: int, checksum: str) -> str:
    """'' when the replica loaded exactly what was sent, else what differs."""
    if reply.version != version:
        return f"replica reports version {reply.version}, pushed {version}"
    if reply.checksum != checksum:
        return f"replica reports checksum {reply.checksum[:12]}…, pushed {checksum[:12]}…"
    return ""


def _push_one(
    target: ReplicaTarget,
    tensors: Mapping[str, torch.Tensor],
    version: int,
    checksum: Future[str],
    token: str | None,
    deadline: float,
    retries: int,
    ca_file: str | None = None,
) -> PushResult:
    start = time.monotonic()
    sender = sender_for(target.data_port)
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
            reply = sender.push(
                target.address, tensors, version, token=token, timeout_s=remaining, checksum=checksum, ca_file=ca_file
            )
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
                                  time.monotonic() - start, attempts)  # fmt: skip
        if not backoff.wait(error):
            break
    return PushResult(target.replica_id, target.address, False, error=error, seconds=time.monotonic() - start,
                      attempts=attempts)  # fmt: skip


def push_to_replicas(
    targets: Sequence[ReplicaTarget],
    tensors: Mapping[str, torch.Tensor],
    version: int,
    *,
    token: str | None = None,
    timeout_s: float = 120.0,
    retries: int = 1,
    ca_file: str | None = None,
    broadcaster: WeightBroadcaster | None = None,
) -> list[PushResult]:
    """Push `tensors` as `version` to all `targets` at once; returns within ~timeout_s whatever happens.
    With a `broadcaster`, the bytes go once to all of them; those it did not update get the data port."""
    if not targets:
        return []
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(max_workers=min(len(targets), 16) + 1, thread_name_prefix="push") as pool:
        # Hashed once for every replica, while the bytes already flow to their data ports.
        checksum = pool.submit(weights_checksum, tensors)
        done: dict[int, PushResult] = {}
        if broadcaster is not None:
            done = _broadcast(broadcaster, targets, tensors, version, checksum, token, deadline, ca_file)
        futures = {
            i: pool.submit(_push_one, t, tensors, version, checksum, token, deadline, retries, ca_file)
            for i, t in enumerate(targets)
            if i not in done
        }
        results = [done[i] if i in done else futures[i].result() for i in range(len(targets))]
    for r in results:
        if r.ok:
            log.info("pushed version %d to %s in %.2fs", version, r.replica_id, r.seconds)
        else:
            log.error("weight push of version %d to %s (%s) failed: %s", version, r.replica_id, r.address, r.error)
    return results


def _broadcast(
    broadcaster: WeightBroadcaster,
    targets: Sequence[ReplicaTarget],
    tensors: Mapping[str, torch.Tensor],
    version: int,
    checksum: Future[str],
    token: str | None,
    deadline: float,
    ca_file: str | None,
) -> dict[int, PushResult]:
    """The targets (by index) that the broadcast updated; the rest fall back. It gets half the push's time."""
    start = time.monotonic()
    outcomes = broadcaster.push([t.address for t in targets], tensors, version, token=token,
                                deadline=start + (deadline - start) / 2, checksum=checksum, ca_file=ca_file)  # fmt: skip
    done = {}
    for i, (target, outcome) in enumerate(zip(targets, outcomes, strict=True)):
        if isinstance(outcome, rollout_pb2.UpdateWeightsResponse) and not verify_reply(
            outcome, version, checksum.result()
        ):
            done[i] = PushResult(target.replica_id, target.address, True, outcome.version, outcome.checksum, "",
                                 time.monotonic() - start)  # fmt: skip
        else:
            log.warning("broadcast to %s did not take (%s); pushing by data port", target.replica_id, describe(outcome))
    return done


def replica_status(
    address: str, timeout_s: float = 5.0, token: str | None = None, ca_file: str | None = None
) -> rollout_pb2.RolloutStatus:
    """A replica's GetStatus (its loaded weight version and checksum)."""
    with make_channel(address, ca_file) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        return stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=timeout_s, metadata=bearer_metadata(token))
