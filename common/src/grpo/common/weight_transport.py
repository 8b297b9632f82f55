"""Weight transports: how the bytes of a weight update travel from the trainer to one rollout replica.

Every update has the same control path, whatever carries its bytes: one authenticated UpdateWeights
call whose first message is the `WeightHeader` (version, tensor specs, sha256), answered with the
version and checksum the replica loaded. A transport decides only how the bytes get into the
replica's receive buffer:

* `StreamSender` / `StreamSource` (here): in the gRPC stream, after the header. Always available;
  every other transport falls back to it.
* `DataPortSender` / `DataPortSource` (grpo.common.weight_data_port): on a side TCP connection
  named by a one-time token in the call's metadata, ~3x faster.
* `WeightBroadcaster` / `BroadcastSource` (grpo.common.weight_broadcast): one collective send (gloo on
  CPU, NCCL on GPU) to every replica of a group the trainer hosts, named by an invitation in each call's
  metadata. It updates many replicas at once, so the pusher calls it for all of them and sends the
  ones it did not update by data port (docs/gpu-weight-broadcast.md).

Between the first two, the replica's one setting, `weights_data_port` (-1: stream only), decides: the
replica advertises the port in the Redis registry and in GetStatus, and `sender_for` picks the
transport from that advertisement, so trainer and replica cannot disagree. The broadcast is the
trainer's choice (`weight_transport`); a replica that cannot join falls back like any other failure.

Either sender goes to one replica. Relay fan-out (grpo.common.weight_relay) sends one copy into a tree
of replicas instead: a replica with children in the call's `RelayPlan` forwards its receive buffer to
them as it fills, over the same two transports, and every replica still checks what it got itself.

A new backend (NCCL broadcast, a shared-memory or filesystem drop) is one file with a
`WeightSender` and a `WeightSource`: the sender starts the bytes moving and makes the UpdateWeights
call with the header (naming the bytes in the call's metadata, as the data port names its token);
the source, given that metadata on the replica, puts exactly the header's `total_bytes` into the
`WeightAssembler` (`receive` for bytes that come before the header) and feeds it the call's
messages. The assembler checks size, specs, version and sha256 the same way for every transport,
so nothing is applied that the header does not vouch for. Wire it into `sender_for` and the
replica's `WeightUpdates.source` with whatever it advertises.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeAlias

import grpc

from grpo.common.auth import bearer_metadata
from grpo.common.channels import make_channel
from grpo.common.send_rate import SendRate
from grpo.common.weight_receiver import StreamMessage, WeightAssembler
from grpo.common.weights import CHUNK_BYTES, UPDATE_WEIGHTS_METHOD, iter_wire_messages
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
            update = channel.stream_unary(
                UPDATE_WEIGHTS_METHOD,
                request_serializer=None,  # the messages are already wire bytes
                response_deserializer=rollout_pb2.UpdateWeightsResponse.FromString,
            )
            deadline = start + timeout_s
            return self.send(
                Push(update, address, tensors, version, bearer_metadata(token), deadline, checksum, ca_file)
            )

    @abstractmethod
    def send(self, push: Push) -> rollout_pb2.UpdateWeightsResponse:
        """Move the bytes and make the `push.update` call (header first) with its metadata by its deadline."""


class StreamSender(WeightSender):
    """The bytes in the gRPC stream, in chunks of at most `chunk_bytes` after the header."""

    via = "stream"

    def send(self, push: Push) -> rollout_pb2.UpdateWeightsResponse:
        messages = iter_wire_messages(push.tensors, push.version, self.chunk_bytes, resolve(push.checksum))
        reply: rollout_pb2.UpdateWeightsResponse = push.update(
            self._counted(messages), timeout=remaining(push.deadline), metadata=push.metadata
        )
        return reply

    def _counted(self, messages: Iterable[bytes]) -> Iterator[bytes]:
        for i, message in enumerate(messages):
            if i and self.rate is not None:
                self.rate.take(len(message))
            yield message
            if i:  # the first is the header; a data message is its bytes and a few of framing
                self.bytes_sent += len(message)


class WeightSource(ABC):
    """The replica's side of a transport: fills one update's `WeightAssembler`, which checks everything."""

    via: ClassVar[str]

    @abstractmethod
    def fill(self, assembler: WeightAssembler, messages: Iterable[StreamMessage], deadline: float) -> None:
        """Put the header (from `messages`, the call's stream) and all the bytes into `assembler` by `deadline`;
        WeightUpdateError when they do not come."""

    def abandon(self) -> None:  # noqa: B027 - most sources reserve nothing
        """The update was refused before `fill` (too many at once): release what the sender reserved."""


class StreamSource(WeightSource):
    """The bytes follow the header in the call's stream."""

    via = "stream"

    def fill(self, assembler: WeightAssembler, messages: Iterable[StreamMessage], deadline: float) -> None:
        for message in messages:  # the stream's own limit (the servicer's StreamLimit) bounds this
            assembler.feed(message)


def sender_for(data_port: int, chunk_bytes: int = CHUNK_BYTES, rate: SendRate | None = None) -> WeightSender:
    """The transport for a replica that advertises `data_port` (0: none, so the gRPC stream), sending at most at
    `rate` (shared with the host's other senders) when set."""
    if data_port:
        from grpo.common.weight_data_port import DataPortSender  # it imports this module

        return DataPortSender(data_port, chunk_bytes, rate)
    return StreamSender(chunk_bytes, rate)


def resolve(checksum: str | Future[str] | None) -> str | None:
    return checksum.result() if isinstance(checksum, Future) else checksum


def remaining(deadline: float, least_s: float = 1.0) -> float:
    """Seconds left until `deadline`, at least `least_s` (a call always gets a chance to be answered)."""
    return max(deadline - time.monotonic(), least_s)


__all__: list[str] = [
    "StreamSender",
    "StreamSource",
    "UpdateCall",
    "WeightSender",
    "WeightSource",
    "remaining",
    "resolve",
    "sender_for",
]
