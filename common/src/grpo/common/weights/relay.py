"""Relay fan-out: a weight update sent once into a chain or tree of replicas, each passing the bytes on.

The trainer sends an update to the root of a `RelayPlan` only; every replica that has children in the
plan forwards the bytes to them *while* it receives them (from its receive buffer, as it fills), over
each child's data port (the gRPC stream when that cannot be reached), and makes the child's UpdateWeights
call with the header it got, its own `weights_token` and TLS. Each replica checks version and sha256
itself exactly as a direct push is checked (grpo.common.weights.receiver), so a relay cannot vouch for
bytes it did not get right: a corrupt hop is rejected by every replica below it.

The plan rides in the call's metadata (`RELAY_PLAN_KEY`), so a replica knows its children before any
byte arrives (the data port sends bytes before the header). A reply carries the `RelayResult` of the
replica's whole subtree; a rejected call carries them in trailing metadata (`RELAYED_KEY`), but only
when the replica got the whole update and so gave its children a fair chance. When a child's call fails
without them (it died, or never got the bytes), the sender re-routes: it forwards to the child's children
itself, from byte 0 of its own buffer. The trainer is the root's sender (`TensorPayload`), so a dead root
is re-routed the same way. Everything is bounded by the push's deadline, each hop a little shorter than
its sender's, so a sender always has time to report. `RelaySender` is the trainer's side (a `FleetSender`).

Over ~400 lines because the relay is one protocol with both its ends (`Relayer` sends, `ReplicaRelay` and
`ReceivePayload` forward on a replica); read apart, neither side would say what the other may rely on.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

import grpc

from grpo.common.auth import bearer_metadata
from grpo.common.channels import DEFAULT_OPTIONS, make_channel
from grpo.common.net import shutdown_socket, split_host
from grpo.common.send_rate import SendRate
from grpo.common.weights.base import (
    FleetSender,
    PushResult,
    ReplicaTarget,
    Round,
    remaining,
    resolve,
    update_call,
    verify_reply,
)
from grpo.common.weights.codec import CHUNK_BYTES, data_chunks, encode_data, make_header
from grpo.common.weights.data_port import DATA_TOKEN_KEY, connect, new_token, send_data
from grpo.common.weights.direct import DirectSender, push_one
from grpo.common.weights.receiver import StreamMessage, WeightAssembler
from grpo.v1 import rollout_pb2, rollout_pb2_grpc

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

RELAY_PLAN_KEY = "grpo-relay-bin"  # UpdateWeights call metadata: the receiving replica's RelayPlan
RELAYED_KEY = "grpo-relayed-bin"  # trailing metadata of a rejected call: UpdateWeightsResponse(relayed=...)
# A plan is nested messages: protobuf parses at most 100 levels, so a longer chain becomes a tree (`relay_tree`).
MAX_DEPTH = 64
# The plan and a rejected call's results ride in metadata: gRPC's default 8 KiB holds a plan of ~150 replicas,
# and an error trailer is accepted up to this size by the senders (errors are cut to ERROR_CHARS).
CHANNEL_OPTIONS = (*DEFAULT_OPTIONS, ("grpc.max_metadata_size", 1 << 20))
ERROR_CHARS = 300


class RelayBroken(RuntimeError):
    """This node's own copy of the update will not be complete: nothing it forwards can be."""


class Payload(ABC):
    """One update as a sending node holds it: its size, its header, its bytes from byte 0 as they come."""

    @abstractmethod
    def size(self, deadline: float) -> int: ...

    @abstractmethod
    def header(self, deadline: float) -> rollout_pb2.WeightHeader: ...

    @abstractmethod
    def pieces(self, deadline: float) -> Iterator[memoryview]:
        """All the bytes in order, waiting for those not here yet; RelayBroken when they will not come."""

    def broken(self) -> bool:
        return False


class TensorPayload(Payload):
    """The trainer's tensors: all here; the header (with the shared sha256) made once, on first need."""

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor],
        version: int,
        checksum: str | Future[str] | None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.tensors, self.version, self.checksum, self.chunk_bytes = tensors, version, checksum, chunk_bytes
        self._header: rollout_pb2.WeightHeader | None = None
        self._lock = threading.Lock()

    def size(self, deadline: float) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def header(self, deadline: float) -> rollout_pb2.WeightHeader:
        with self._lock:
            if self._header is None:
                self._header = make_header(self.tensors, self.version, resolve(self.checksum))
            return self._header

    def pieces(self, deadline: float) -> Iterator[memoryview]:
        return data_chunks(self.tensors, self.chunk_bytes)


class ReceivePayload(Payload):
    """A relaying replica's own receive buffer, forwarded as its WeightAssembler fills it.

    `watch` sees the call's messages go by (for the header, whatever this replica makes of it),
    `progress` is the assembler's callback, `end` says the receive is over, complete or not.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._buffer: bytearray | None = None
        self._offset = 0
        self._header: rollout_pb2.WeightHeader | None = None
        self._ended = False

    def watch(self, messages: Iterable[StreamMessage]) -> Iterator[StreamMessage]:
        for message in messages:
            if isinstance(message, rollout_pb2.WeightChunk) and message.WhichOneof("kind") == "header":
                with self._cond:
                    self._header = message.header
                    self._cond.notify_all()
            yield message

    def progress(self, assembler: WeightAssembler) -> None:
        with self._cond:
            self._buffer, self._offset = assembler.buffer, assembler.offset
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def complete(self) -> bool:
        with self._cond:
            return self._header is not None and self._buffer is not None and self._offset == len(self._buffer)

    def broken(self) -> bool:
        with self._cond:
            return self._ended and not (
                self._header is not None and self._buffer is not None and self._offset == len(self._buffer)
            )

    def _check(self, ready: bool) -> None:
        if not ready:
            raise RelayBroken("this replica's own receive failed" if self._ended else "the update did not come in time")

    def size(self, deadline: float) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._buffer is not None or self._ended, deadline - time.monotonic())
            self._check(self._buffer is not None)
            assert self._buffer is not None
            return len(self._buffer)

    def header(self, deadline: float) -> rollout_pb2.WeightHeader:
        with self._cond:
            self._cond.wait_for(lambda: self._header is not None or self._ended, deadline - time.monotonic())
            self._check(self._header is not None)
            assert self._header is not None
            return self._header

    def _past(self, sent: int) -> bool:
        return self._offset > sent or self._ended

    def pieces(self, deadline: float) -> Iterator[memoryview]:
        size, sent = self.size(deadline), 0
        while sent < size:
            with self._cond:
                self._cond.wait_for(functools.partial(self._past, sent), deadline - time.monotonic())
                self._check(self._offset > sent)
                assert self._buffer is not None
                view, sent = memoryview(self._buffer)[sent : self._offset], self._offset
            yield view


class Relayer:
    """Sends an update to hops of a plan and gathers their subtrees' results, re-routing around failed hops.

    `name` is this sender ("trainer" or the replica id); `token` and `ca_file` are what it presents to and
    trusts in the hops. `bytes_sent` counts the update bytes it sent, per hop it sent them to; `on_sent(n)`
    hears of each piece (a replica's metric). `rate` caps what it sends, all hops together (one NIC).
    """

    def __init__(
        self,
        name: str,
        token: str | None = None,
        ca_file: str | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        on_sent: Callable[[int], None] | None = None,
        rate: SendRate | None = None,
    ) -> None:
        self.name, self.token, self.ca_file, self.chunk_bytes = name, token, ca_file, chunk_bytes
        self.rate = rate
        self.bytes_sent: dict[str, int] = {}
        self._on_sent = on_sent
        self._lock = threading.Lock()

    def relay(
        self, hops: Sequence[rollout_pb2.RelayHop], payload: Payload, deadline: float, rerouted_around: str = ""
    ) -> list[rollout_pb2.RelayResult]:
        """Every hop at once; the results of all of them and their subtrees, by `deadline`."""
        if not hops:
            return []
        with ThreadPoolExecutor(len(hops), thread_name_prefix="relay") as pool:
            futures = [pool.submit(self.forward, hop, payload, deadline, rerouted_around) for hop in hops]
            return [result for f in futures for result in f.result()]

    def forward(
        self, hop: rollout_pb2.RelayHop, payload: Payload, deadline: float, rerouted_around: str = ""
    ) -> list[rollout_pb2.RelayResult]:
        start = time.monotonic()
        result = rollout_pb2.RelayResult(
            replica_id=hop.replica_id, address=hop.address, sender=self.name, rerouted_around=rerouted_around
        )
        subtree: list[rollout_pb2.RelayResult] | None = None
        try:
            reply = self._send(hop, payload, deadline)
        except RelayBroken as exc:
            result.error = f"not sent: {exc}"
            subtree = []  # our sender sees our failure and re-routes; nothing we say below counts
        except grpc.RpcError as exc:
            result.error = describe(exc)
            subtree = relayed_in(exc)
            if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                self._already_held(hop, payload.header(deadline), result)
        else:
            header = payload.header(deadline)
            result.version, result.checksum = reply.version, reply.checksum
            result.ok = (reply.version, reply.checksum) == (header.version, header.sha256)
            if not result.ok:
                result.error = f"reports version {reply.version} ({reply.checksum[:12]}), sent {header.version}"
            # A replica that does not relay (an older build) answers for itself only: its children are ours to reach.
            subtree = list(reply.relayed) if reply.relayed or not hop.children else None
        result.seconds, result.error = time.monotonic() - start, result.error[:ERROR_CHARS]
        if subtree is None:  # the hop failed and took its subtree's fate with it: reach its children ourselves
            subtree = self._reroute(hop, result.error, payload, deadline)
        return [result, *subtree]

    def _already_held(
        self, hop: rollout_pb2.RelayHop, header: rollout_pb2.WeightHeader, result: rollout_pb2.RelayResult
    ) -> None:
        """A hop that refused the version as not newer may hold exactly it (from a sender that died after passing
        it on): then it is done, not failed."""
        try:
            with make_channel(hop.address, self.ca_file) as channel:
                status = rollout_pb2_grpc.RolloutServiceStub(channel).GetStatus(
                    rollout_pb2.GetStatusRequest(), timeout=5, metadata=bearer_metadata(self.token)
                )
        except grpc.RpcError:
            return
        if (status.weight_version, status.weight_checksum) == (header.version, header.sha256):
            result.ok, result.error = True, ""
            result.version, result.checksum = status.weight_version, status.weight_checksum

    def _reroute(
        self, hop: rollout_pb2.RelayHop, error: str, payload: Payload, deadline: float
    ) -> list[rollout_pb2.RelayResult]:
        if not hop.children:
            return []
        if payload.broken() or deadline - time.monotonic() < 1.0:
            return [unreached(child, f"not reached: {hop.replica_id} failed ({error})") for child in walk(hop.children)]
        log.warning("relay: %s failed mid-relay (%s); %s re-routes its %d children", hop.replica_id, error,
                    self.name, len(hop.children))  # fmt: skip
        return self.relay(hop.children, payload, deadline, rerouted_around=hop.replica_id)

    def _send(self, hop: rollout_pb2.RelayHop, payload: Payload, deadline: float) -> rollout_pb2.UpdateWeightsResponse:
        """One hop's UpdateWeights call with its children's plan, the bytes pumped as they come."""
        size = payload.size(deadline)
        # The hop answers a little before we must: time for us to report, whatever happens below it.
        left = deadline - time.monotonic()
        hop_deadline = deadline - min(2.0, 0.05 * max(left, 0.0))
        metadata: list[tuple[str, str | bytes]] = list(bearer_metadata(self.token))
        if hop.children:
            metadata.append((RELAY_PLAN_KEY, rollout_pb2.RelayPlan(hops=hop.children).SerializeToString()))
        token = new_token()
        conn = connect(split_host(hop.address), hop.data_port, token, size, self.ca_file) if hop.data_port else None
        with make_channel(hop.address, self.ca_file, CHANNEL_OPTIONS) as channel:
            update = update_call(channel)
            if conn is None:  # logged by connect: the bytes follow the header in the stream
                messages = self._stream(hop.replica_id, payload, deadline)
                call = update.future(messages, timeout=remaining(hop_deadline), metadata=metadata)
            else:
                metadata.append((DATA_TOKEN_KEY, token))
                call = update.future(
                    _header_only(payload, deadline), timeout=remaining(hop_deadline), metadata=metadata
                )
                # Open until the reply: a TLS socket closed with unread data (the hop's session tickets) is reset,
                # and the hop would lose the bytes still in flight.
                with conn:
                    self._pump(conn, call, hop.replica_id, payload, deadline)
                    call.exception()  # waits for the reply
            reply: rollout_pb2.UpdateWeightsResponse = call.result()
            return reply

    def _pump(self, conn: socket.socket, call: grpc.Future, replica_id: str, payload: Payload, deadline: float) -> None:
        call.add_done_callback(lambda _: shutdown_socket(conn))  # a rejected or dead hop unblocks our send
        conn.settimeout(remaining(deadline))
        try:
            send_data(conn, payload.pieces(deadline), self.rate, functools.partial(self._count, replica_id))
        except OSError as exc:
            log.debug("relay: weight data to %s stopped: %s (its reply says why)", replica_id, exc)
        except RelayBroken:
            call.cancel()  # the hop must not take a short update: it sees the cut and rejects it
            raise

    def _stream(self, replica_id: str, payload: Payload, deadline: float) -> Iterator[bytes]:
        yield from _header_only(payload, deadline)
        for view in payload.pieces(deadline):
            for start in range(0, len(view), self.chunk_bytes):
                piece = view[start : start + self.chunk_bytes]
                if self.rate is not None:
                    self.rate.take(len(piece))
                yield encode_data([piece])
                self._count(replica_id, len(piece))

    def _count(self, replica_id: str, size: int) -> None:
        with self._lock:
            self.bytes_sent[replica_id] = self.bytes_sent.get(replica_id, 0) + size
        if self._on_sent is not None:
            self._on_sent(size)


def _header_only(payload: Payload, deadline: float) -> Iterator[bytes]:
    # gRPC's sending thread waits here: a replica has the header only after the bytes when they came by data port.
    yield rollout_pb2.WeightChunk(header=payload.header(deadline)).SerializeToString()


def relay_tree(hops: Sequence[rollout_pb2.RelayHop], fanout: int) -> rollout_pb2.RelayHop:
    """The hops (childless) as one tree in breadth-first order: hop i's children are i*fanout+1 ...; fanout 1
    is a chain, unless it would be deeper than MAX_DEPTH (then 2). The sender sends to the root only."""
    if not hops or fanout < 1:
        raise ValueError("a relay tree needs at least one hop and a fanout of at least 1")
    if fanout == 1 and len(hops) > MAX_DEPTH:
        log.warning(
            "relay: a chain of %d replicas is deeper than %d; relaying through a tree of 2", len(hops), MAX_DEPTH
        )
        fanout = 2

    def subtree(i: int) -> rollout_pb2.RelayHop:
        hop = rollout_pb2.RelayHop()
        hop.CopyFrom(hops[i])
        first = i * fanout + 1
        hop.children.extend(subtree(c) for c in range(first, min(first + fanout, len(hops))))
        return hop

    return subtree(0)


def walk(hops: Iterable[rollout_pb2.RelayHop]) -> Iterator[rollout_pb2.RelayHop]:
    """Every hop of a plan and its subtrees."""
    for hop in hops:
        yield hop
        yield from walk(hop.children)


def unreached(hop: rollout_pb2.RelayHop, error: str) -> rollout_pb2.RelayResult:
    return rollout_pb2.RelayResult(replica_id=hop.replica_id, address=hop.address, error=error)


def plan_in(metadata: Mapping[str, str | bytes]) -> rollout_pb2.RelayPlan | None:
    """The RelayPlan an UpdateWeights call carries, if any (ValueError when it cannot be parsed)."""
    raw = metadata.get(RELAY_PLAN_KEY)
    if raw is None:
        return None
    try:
        return rollout_pb2.RelayPlan.FromString(raw if isinstance(raw, bytes) else raw.encode())
    except Exception as exc:  # protobuf's DecodeError
        raise ValueError(f"{RELAY_PLAN_KEY} metadata is not a RelayPlan: {exc}") from None


def relayed_in(exc: grpc.RpcError) -> list[rollout_pb2.RelayResult] | None:
    """The subtree results a rejected call carried in its trailing metadata; None when it carried none."""
    trailing = exc.trailing_metadata() if isinstance(exc, grpc.Call) else None
    for key, value in trailing or ():
        if key == RELAYED_KEY:
            return list(rollout_pb2.UpdateWeightsResponse.FromString(value).relayed)
    return None


def relayed_trailer(results: Sequence[rollout_pb2.RelayResult]) -> tuple[tuple[str, bytes], ...]:
    return ((RELAYED_KEY, rollout_pb2.UpdateWeightsResponse(relayed=results).SerializeToString()),)


def describe(exc: grpc.RpcError) -> str:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    return f"{code.name if code else 'error'}: {details}"


class ReplicaRelay:
    """A relaying replica's side of one update: forwards its receive buffer to the plan's hops in a thread."""

    def __init__(self, relayer: Relayer, plan: rollout_pb2.RelayPlan, deadline: float) -> None:
        self.payload = ReceivePayload()
        self._results: list[rollout_pb2.RelayResult] = []
        self._thread = threading.Thread(
            target=self._run, args=(relayer, list(plan.hops), deadline), name="relay", daemon=True
        )
        self._thread.start()

    def _run(self, relayer: Relayer, hops: list[rollout_pb2.RelayHop], deadline: float) -> None:
        try:
            self._results = relayer.relay(hops, self.payload, deadline)
        except Exception:  # a bug here must not hang the call: the sender then re-routes
            log.exception("relay: forwarding failed")

    def join(self) -> None:
        """Wait until every hop has answered (they read the receive buffer until then)."""
        self.payload.end()
        self._thread.join()

    def results(self) -> list[rollout_pb2.RelayResult] | None:
        """The subtree's results; None when this replica's own receive was incomplete (they do not count)."""
        self.join()
        return self._results if self.payload.complete() else None


class RelaySender(FleetSender):
    """One copy into a relay tree of the targets (`fanout` children a hop, 1: a chain); a replica the relay left
    without the version (and that a retry may help) is then pushed to directly, with what is left of the
    deadline. One target is a relay to one hop with no children: a direct push."""

    def __init__(self, fanout: int, retries: int) -> None:
        self.fanout, self.retries = fanout, retries

    def send(self, push: Round, targets: Sequence[ReplicaTarget]) -> list[PushResult | None]:
        if len(targets) <= 1:
            return DirectSender(self.retries).send(push, targets)
        start, version, checksum = time.monotonic(), push.version, push.checksum
        relayer = Relayer("trainer", push.token, push.ca_file, rate=push.rate)
        hops = [
            rollout_pb2.RelayHop(replica_id=t.replica_id, address=t.address, data_port=t.data_port) for t in targets
        ]
        payload = TensorPayload(push.tensors, version, checksum)
        relayed = {r.replica_id: r for r in relayer.relay([relay_tree(hops, self.fanout)], payload, push.deadline)}
        results: list[PushResult | tuple[Future[PushResult], int]] = []
        for t in targets:
            r = relayed.get(t.replica_id)
            if r is None:  # a relay that did not report a replica has not done it: never counted as done
                r = rollout_pb2.RelayResult(replica_id=t.replica_id, address=t.address, error="no result came back")
            route = relay_route(r)
            error = r.error or verify_reply(rollout_pb2.UpdateWeightsResponse(version=r.version, checksum=r.checksum),
                                            version, checksum.result())  # fmt: skip
            sent = relayer.bytes_sent.get(t.replica_id, 0)
            if not error:
                results.append(PushResult(t.replica_id, t.address, True, r.version, r.checksum, "",
                                          r.seconds, 1, route, sent))  # fmt: skip
            elif self.retries > 0 and not error.startswith(grpc.StatusCode.FAILED_PRECONDITION.name):
                log.warning("relay of version %d to %s failed (%s: %s); pushing to it directly", version, t.replica_id,
                            route, error)  # fmt: skip
                retry = push.pool.submit(push_one, push, t, self.retries - 1,
                                         f"direct, after the relay failed ({route}: {error})")  # fmt: skip
                results.append((retry, sent))
            else:
                results.append(PushResult(t.replica_id, t.address, False, error=error,
                                          seconds=time.monotonic() - start, route=route, bytes_sent=sent))  # fmt: skip
        return [r if isinstance(r, PushResult) else _after_relay(*r) for r in results]


def _after_relay(retry: Future[PushResult], relay_bytes: int) -> PushResult:
    """A direct push after a failed relay counts the relay as one more attempt, and its bytes."""
    r = retry.result()
    return replace(r, attempts=r.attempts + 1, bytes_sent=r.bytes_sent + relay_bytes)


def relay_route(r: rollout_pb2.RelayResult) -> str:
    """How a relayed update reached (or missed) a replica, for the logs and the run's records."""
    if not r.sender:
        return "not reached"
    if r.rerouted_around:  # its sender took the place of a hop that failed (died, or never got the bytes)
        return f"{r.rerouted_around} failed mid-relay; re-routed through {r.sender}"
    return "relay root" if r.sender == "trainer" else f"relayed via {r.sender}"
