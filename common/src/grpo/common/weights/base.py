"""The interfaces of the weight transports: `FleetSender` (one version to many replicas), `WeightSender` (to one
replica) and `WeightSource` (a replica's side), with what they pass: `Round`, `ReplicaTarget`, `PushResult`."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeAlias

import grpc

from grpo.common.auth import bearer_metadata
from grpo.common.channels import make_channel
from grpo.common.send_rate import SendRate
from grpo.common.weights.codec import CHUNK_BYTES, UPDATE_WEIGHTS_METHOD
from grpo.common.weights.receiver import StreamMessage, WeightAssembler
from grpo.v1 import rollout_pb2

if TYPE_CHECKING:
    import torch

# The UpdateWeights call as the senders make it: pre-serialised messages in, the parsed reply out.
UpdateCall: TypeAlias = grpc.StreamUnaryMultiCallable


@dataclass(frozen=True)
class Push:
    """One update of one replica, as a sender's `send` gets it."""

    update: UpdateCall  # the UpdateWeights call on a channel to the replica
    address: str
    tensors: Mapping[str, torch.Tensor]
    version: int
    metadata: tuple[tuple[str, str], ...]  # the bearer token, if any
    deadline: float  # time.monotonic() by which the reply must be in
    checksum: str | Future[str] | None  # None: the sender computes it
    ca_file: str | None  # TLS to the replica when set


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


@dataclass(frozen=True)
class Round:
    """One version's push, as every fleet sender (direct, relay, broadcast) shares it."""

    tensors: Mapping[str, torch.Tensor]
    version: int
    checksum: Future[str]  # hashed once for every replica, while the bytes already flow
    token: str | None
    deadline: float
    ca_file: str | None
    rate: SendRate | None  # one bucket: the trainer host's NIC, whatever the number of streams
    pool: ThreadPoolExecutor  # the round's push streams (grpo.trainer.pusher sizes it)


class FleetSender(ABC):
    """The trainer's way of pushing one version to many replicas: direct, relay or broadcast.

    The pusher tries its fleet senders in order, each with the targets the ones before it did not update.
    """

    @abstractmethod
    def send(self, push: Round, targets: Sequence[ReplicaTarget]) -> list[PushResult | None]:
        """One outcome per target, in order, by `push.deadline`; None: this way did not update it (the next
        way tries)."""


def verify_reply(reply: rollout_pb2.UpdateWeightsResponse, version: int, checksum: str) -> str:
    """'' when the replica loaded exactly what was sent, else what differs."""
    if reply.version != version:
        return f"replica reports version {reply.version}, pushed {version}"
    if reply.checksum != checksum:
        return f"replica reports checksum {reply.checksum[:12]}…, pushed {checksum[:12]}…"
    return ""


class WeightSender(ABC):
    """The trainer's side of a transport: one update of one replica, answered by its UpdateWeights reply."""

    via: ClassVar[str]  # the replica counts applied bytes under this label (grpo_rollout_weight_update_bytes)

    def __init__(self, chunk_bytes: int = CHUNK_BYTES, rate: SendRate | None = None) -> None:
        self.chunk_bytes = chunk_bytes
        self.rate = rate  # the host's send-rate cap, shared by all its senders (grpo.common.send_rate)
        self.bytes_sent = 0  # the update's data bytes this sender has sent, over every `send` (the pusher's egress)

    def push(
        self,
        address: str,
        tensors: Mapping[str, torch.Tensor],
        version: int,
        *,
        token: str | None = None,
        timeout_s: float = 120.0,
        checksum: str | Future[str] | None = None,
        ca_file: str | None = None,
    ) -> rollout_pb2.UpdateWeightsResponse:
        """Send `tensors` as `version` to the replica at `address` (TLS when `ca_file` is set); raises
        grpc.RpcError when it rejects them. `checksum` may be a future (one hash shared by the pushes to
        several replicas); None means compute it here."""
        start = time.monotonic()
        with make_channel(address, ca_file) as channel:
            update = update_call(channel)
            deadline = start + timeout_s
            return self.send(
                Push(update, address, tensors, version, bearer_metadata(token), deadline, checksum, ca_file)
            )

    @abstractmethod
    def send(self, push: Push) -> rollout_pb2.UpdateWeightsResponse:
        """Move the bytes and make the `push.update` call (header first) with its metadata by its deadline."""


class WeightSource(ABC):
    """The replica's side of a transport: fills one update's `WeightAssembler`, which checks everything."""

    via: ClassVar[str]

    @abstractmethod
    def fill(self, assembler: WeightAssembler, messages: Iterable[StreamMessage], deadline: float) -> None:
        """Put the header (from `messages`, the call's stream) and all the bytes into `assembler` by `deadline`;
        WeightUpdateError when they do not come."""

    def abandon(self) -> None:  # noqa: B027 - most sources reserve nothing
        """The update was refused before `fill` (too many at once): release what the sender reserved."""


def update_call(channel: grpc.Channel) -> UpdateCall:
    """The UpdateWeights call on `channel`, as every sender makes it: wire bytes in, the parsed reply out."""
    return channel.stream_unary(
        UPDATE_WEIGHTS_METHOD,
        request_serializer=None,  # the messages are already wire bytes
        response_deserializer=rollout_pb2.UpdateWeightsResponse.FromString,
    )


def resolve(checksum: str | Future[str] | None) -> str | None:
    return checksum.result() if isinstance(checksum, Future) else checksum


def remaining(deadline: float, least_s: float = 1.0) -> float:
    """Seconds left until `deadline`, at least `least_s` (a call always gets a chance to be answered)."""
    return max(deadline - time.monotonic(), least_s)
