"""Weight push to every live rollout replica, each verified, none able to stall the run.

Two ways (the trainer's `weight_push`): `direct` sends every replica its own copy, concurrently, so the
trainer's egress grows with the replicas; `relay` sends one copy into a tree of replicas that pass it on
(grpo.common.weight_relay). Either way every replica gets one `PushResult` that says how it went.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import grpc

from grpo.common.auth import bearer_metadata
from grpo.common.channels import make_channel
from grpo.common.retry import Backoff, RetryPolicy
from grpo.common.send_rate import SendRate, send_rate
from grpo.common.weight_broadcast import WeightBroadcaster, describe
from grpo.common.weight_relay import Relayer, TensorPayload, relay_tree
from grpo.common.weight_transport import sender_for
from grpo.common.weights import weights_checksum
from grpo.v1 import rollout_pb2, rollout_pb2_grpc

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


MAX_STREAMS = 16  # direct pushes at once (docs/scaling.md sizes t_push by it)
PUSHED_FILE = "pushed_version"  # in the run's output dir: the highest version ever pushed from it


def highest_pushed(output_dir: Path) -> int:
    """The highest policy version ever pushed from `output_dir` (0 when none): a restarted trainer numbers its
    next version above it, whatever the replicas report (restarted too, they report 0)."""
    try:
        return int((output_dir / PUSHED_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return 0


def record_pushed(output_dir: Path, version: int) -> None:
    """Durably raise the high-water mark to `version` before it is pushed (temp file, fsync, rename)."""
    if version <= highest_pushed(output_dir):
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = output_dir / f".{PUSHED_FILE}.tmp"
    with tmp.open("w") as f:
        f.write(str(version))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(output_dir / PUSHED_FILE)


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
    route: str = "direct"  # how the update reached it: "direct", "relay root", "relayed via r1", ...
    bytes_sent: int = 0  # the update's bytes this trainer sent for it (its egress: a relayed replica's is 0)


PushMode = Literal["direct", "relay"]


def push_mode(setting: Literal["auto", "direct", "relay"], replicas: int) -> PushMode:
    """The way to push to `replicas` replicas: `auto` relays from 2 on (with 2, a relay halves the trainer's
    egress for one ~6 ms hop: 40 s against 80 s at a bandwidth cap, docs/scaling.md; with 1 there is nothing
    to relay)."""
    if setting == "auto":
        return "relay" if replicas >= 2 else "direct"
    return setting


def verify_reply(reply: rollout_pb2.UpdateWeightsResponse, version: int, checksum: str) -> str:
    """'' when the replica loaded exactly what was sent, else what differs."""
    if reply.version != version:
        return f"replica reports version {reply.version}, pushed {version}"
    if reply.checksum != checksum:
        return f"replica reports checksum {reply.checksum[:12]}…, pushed {checksum[:12]}…"
    return ""


@dataclass(frozen=True)
class _Round:
    """One version's push, as every way of pushing (direct, relay, broadcast) shares it."""

    tensors: Mapping[str, torch.Tensor]
    version: int
    checksum: Future[str]  # hashed once for every replica, while the bytes already flow
    token: str | None
    deadline: float
    ca_file: str | None
    rate: SendRate | None  # one bucket: the trainer host's NIC, whatever the number of streams


def _push_one(push: _Round, target: ReplicaTarget, retries: int, route: str = "direct") -> PushResult:
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


def push_to_replicas(
    targets: Sequence[ReplicaTarget],
    tensors: Mapping[str, torch.Tensor],
    version: int,
    *,
    token: str | None = None,
    timeout_s: float = 120.0,
    retries: int = 1,
    ca_file: str | None = None,
    mode: PushMode = "direct",
    fanout: int = 2,
    broadcaster: WeightBroadcaster | None = None,
    send_rate_mb_s: float = 0.0,
) -> list[PushResult]:
    """Push `tensors` as `version` to all `targets`, `direct`ly or by `relay` (a tree of `fanout`, 1: a chain);
    one result per target, in order, within ~timeout_s whatever happens. With a `broadcaster`, the bytes go
    once to all of them by collective broadcast first; those it did not update are pushed to by `mode`.
    `send_rate_mb_s` > 0 caps the trainer's pushing, all streams together (grpo.common.send_rate)."""
    if not targets:
        return []
    started = time.monotonic()
    deadline = started + timeout_s
    # The checksum on a thread of its own: in the pushers' pool, its thread would take up a 17th stream.
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="push-checksum") as hashing,
        ThreadPoolExecutor(max_workers=min(len(targets), MAX_STREAMS), thread_name_prefix="push") as pool,
    ):
        checksum = hashing.submit(weights_checksum, tensors)
        push = _Round(tensors, version, checksum, token, deadline, ca_file, send_rate(send_rate_mb_s))
        done = _broadcast(push, broadcaster, targets) if broadcaster is not None else {}
        left = [t for i, t in enumerate(targets) if i not in done]
        if mode == "relay" and len(left) > 1:
            pushed = _relay(push, left, retries, fanout, pool)
        else:
            pushed = [f.result() for f in [pool.submit(_push_one, push, t, retries) for t in left]]
        rest = iter(pushed)
        results = [done[i] if i in done else next(rest) for i in range(len(targets))]
    # One INFO line per push (every step): each replica's own line is DEBUG, a failure an ERROR of its own.
    for r in results:
        if r.ok:
            log.debug("pushed version %d to %s in %.2fs (%s)", version, r.replica_id, r.seconds, r.route)
        else:
            log.error("weight push of version %d to %s (%s) failed (%s): %s", version, r.replica_id, r.address,
                      r.route, r.error)  # fmt: skip
    log.info("pushed version %d to %d of %d replicas in %.2fs; the trainer sent %.1f MB", version,
             sum(r.ok for r in results), len(results), time.monotonic() - started,
             sum(r.bytes_sent for r in results) / 1e6)  # fmt: skip
    return results


def _relay(
    push: _Round, targets: Sequence[ReplicaTarget], retries: int, fanout: int, pool: ThreadPoolExecutor
) -> list[PushResult]:
    """One copy into a relay tree of `targets`; a replica the relay left without the version (and that a retry
    may help) is then pushed to directly, with what is left of the deadline."""
    start, version, checksum = time.monotonic(), push.version, push.checksum
    relayer = Relayer("trainer", push.token, push.ca_file, rate=push.rate)
    hops = [rollout_pb2.RelayHop(replica_id=t.replica_id, address=t.address, data_port=t.data_port) for t in targets]
    payload = TensorPayload(push.tensors, version, checksum)
    relayed = {r.replica_id: r for r in relayer.relay([relay_tree(hops, fanout)], payload, push.deadline)}
    results: list[PushResult | tuple[Future[PushResult], int]] = []
    for t in targets:
        r = relayed.get(t.replica_id)
        if r is None:  # a relay that did not report a replica has not done it: never counted as done
            r = rollout_pb2.RelayResult(replica_id=t.replica_id, address=t.address, error="no result came back")
        route = _route(r)
        error = r.error or verify_reply(rollout_pb2.UpdateWeightsResponse(version=r.version, checksum=r.checksum),
                                        version, checksum.result())  # fmt: skip
        sent = relayer.bytes_sent.get(t.replica_id, 0)
        if not error:
            results.append(PushResult(t.replica_id, t.address, True, r.version, r.checksum, "",
                                      r.seconds, 1, route, sent))  # fmt: skip
        elif retries > 0 and not error.startswith(grpc.StatusCode.FAILED_PRECONDITION.name):
            log.warning("relay of version %d to %s failed (%s: %s); pushing to it directly", version, t.replica_id,
                        route, error)  # fmt: skip
            retry = pool.submit(_push_one, push, t, retries - 1, f"direct, after the relay failed ({route}: {error})")
            results.append((retry, sent))
        else:
            results.append(PushResult(t.replica_id, t.address, False, error=error, seconds=time.monotonic() - start,
                                      route=route, bytes_sent=sent))  # fmt: skip
    return [r if isinstance(r, PushResult) else _after_relay(*r) for r in results]


def _after_relay(retry: Future[PushResult], relay_bytes: int) -> PushResult:
    """A direct push after a failed relay counts the relay as one more attempt, and its bytes."""
    r = retry.result()
    return replace(r, attempts=r.attempts + 1, bytes_sent=r.bytes_sent + relay_bytes)


def _route(r: rollout_pb2.RelayResult) -> str:
    """How a relayed update reached (or missed) a replica, for the logs and the run's records."""
    if not r.sender:
        return "not reached"
    if r.rerouted_around:  # its sender took the place of a hop that failed (died, or never got the bytes)
        return f"{r.rerouted_around} failed mid-relay; re-routed through {r.sender}"
    return "relay root" if r.sender == "trainer" else f"relayed via {r.sender}"


def _broadcast(push: _Round, broadcaster: WeightBroadcaster, targets: Sequence[ReplicaTarget]) -> dict[int, PushResult]:
    """The targets (by index) that the broadcast updated; the rest fall back. It gets half the push's time."""
    start, version, checksum = time.monotonic(), push.version, push.checksum
    outcomes = broadcaster.push([t.address for t in targets], push.tensors, version, token=push.token,
                                deadline=start + (push.deadline - start) / 2, checksum=checksum,
                                ca_file=push.ca_file)  # fmt: skip
    done = {}
    for i, (target, outcome) in enumerate(zip(targets, outcomes, strict=True)):
        if isinstance(outcome, rollout_pb2.UpdateWeightsResponse) and not verify_reply(
            outcome, version, checksum.result()
        ):
            done[i] = PushResult(target.replica_id, target.address, True, outcome.version, outcome.checksum, "",
                                 time.monotonic() - start, route="broadcast")  # fmt: skip
        else:
            log.warning(
                "broadcast to %s did not take (%s); pushing to it without the broadcast",
                target.replica_id,
                describe(outcome),
            )
    return done


def replica_status(
    address: str, timeout_s: float = 5.0, token: str | None = None, ca_file: str | None = None
) -> rollout_pb2.RolloutStatus:
    """A replica's GetStatus (its loaded weight version and checksum)."""
    with make_channel(address, ca_file) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        return stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=timeout_s, metadata=bearer_metadata(token))
