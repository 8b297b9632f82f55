"""Weight push to every live rollout replica, each verified, none able to stall the run.

Two ways (the trainer's `weight_push`): `direct` sends every replica its own copy, concurrently, so the
trainer's egress grows with the replicas (grpo.common.weights.direct); `relay` sends one copy into a tree of
replicas that pass it on (grpo.common.weights.relay). With a broadcaster (`weight_transport: broadcast`) the
broadcast goes first and the other way takes the replicas it did not update. All three are `FleetSender`s
(grpo.common.weights.base); every replica gets one `PushResult` that says how it went.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from grpo.common.auth import bearer_metadata
from grpo.common.channels import make_channel
from grpo.common.send_rate import send_rate
from grpo.common.weights.base import FleetSender, PushResult, ReplicaTarget, Round, verify_reply
from grpo.common.weights.broadcast import BroadcastSender, WeightBroadcaster
from grpo.common.weights.codec import weights_checksum
from grpo.common.weights.direct import DirectSender
from grpo.common.weights.relay import RelaySender
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


def highest_pushed_in_run(output_dir: Path, staged: bool) -> int:
    """highest_pushed over the whole run: a staged run's stages (output_dir/../stage-<i>-<mode>) push to the same
    replicas, so each must number its weights above every earlier stage's, or a replica still holding the last
    stage's weights under a higher version counts as holding this stage's and is never pushed."""
    folders = [output_dir, *(output_dir.parent.glob("stage-*") if staged else ())]
    return max(highest_pushed(folder) for folder in folders)


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


PushMode = Literal["direct", "relay"]


def push_mode(setting: Literal["auto", "direct", "relay"], replicas: int) -> PushMode:
    """The way to push to `replicas` replicas: `auto` relays from 2 on (with 2, a relay halves the trainer's
    egress for one ~6 ms hop: 40 s against 80 s at a bandwidth cap, docs/scaling.md; with 1 there is nothing
    to relay)."""
    if setting == "auto":
        return "relay" if replicas >= 2 else "direct"
    return setting


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
    # Each way pushes to the targets the ways before it did not update: the broadcast first, when there is one.
    ways: list[FleetSender] = [BroadcastSender(broadcaster)] if broadcaster is not None else []
    ways.append(RelaySender(fanout, retries) if mode == "relay" else DirectSender(retries))
    # The checksum on a thread of its own: in the pushers' pool, its thread would take up a 17th stream.
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="push-checksum") as hashing,
        ThreadPoolExecutor(max_workers=min(len(targets), MAX_STREAMS), thread_name_prefix="push") as pool,
    ):
        checksum = hashing.submit(weights_checksum, tensors)
        push = Round(tensors, version, checksum, token, deadline, ca_file, send_rate(send_rate_mb_s), pool)
        outcomes: list[PushResult | None] = [None] * len(targets)
        for way in ways:
            left = [i for i, r in enumerate(outcomes) if r is None]
            for i, r in zip(left, way.send(push, [targets[i] for i in left]) if left else [], strict=True):
                outcomes[i] = r
    results = [r for r in outcomes if r is not None]
    assert len(results) == len(targets), "the last way (direct or relay) answers for every target it is given"
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


def replica_status(
    address: str, timeout_s: float = 5.0, token: str | None = None, ca_file: str | None = None
) -> rollout_pb2.RolloutStatus:
    """A replica's GetStatus (its loaded weight version and checksum)."""
    with make_channel(address, ca_file) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        return stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=timeout_s, metadata=bearer_metadata(token))


# Where the pusher's callers have always found them (they live with the fleet senders now).
__all__ = [
    "MAX_STREAMS",
    "PushMode",
    "PushResult",
    "ReplicaTarget",
    "highest_pushed",
    "highest_pushed_in_run",
    "push_mode",
    "push_to_replicas",
    "record_pushed",
    "replica_status",
    "verify_reply",
]
