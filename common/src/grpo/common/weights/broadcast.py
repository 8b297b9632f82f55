"""The broadcast transport: one collective send of a weight update to every replica of a group.

Where trainer and replicas share GPUs or a fast fabric, sending the bytes once by NCCL broadcast (as
vLLM's weight-transfer engine, TRL and prime-rl do) beats N point-to-point copies. The group is a
`torch.distributed` process group built directly on a `TCPStore` the trainer hosts, never the global
default group (as vLLM's StatelessProcessGroup), so it can be re-formed whenever replicas come and go:
each formation is a new *epoch* with its own key prefix in the store. `backend` picks gloo (CPU, what the
tests run) or NCCL (GPU); both take the same path through this module.

The control path is the other transports': each replica gets one UpdateWeights call whose metadata holds
an `Invitation` (`BROADCAST_KEY`: store, epoch, rank, world, byte count, timeout) and whose stream holds
only the header. The replica joins the group (or keeps the one it joined in an earlier round), receives
the bytes by `broadcast(src=0)` straight into its staging buffer (`WeightAssembler.receive`), then reads
the header; the assembler checks size, specs, version and sha256 as for every transport, so a bad
broadcast is rejected and the old weights keep serving. The trainer (rank 0) makes all the calls at once,
forms the group if it must, broadcasts once and returns one reply (or error) per replica.

Nothing waits forever: joining, forming and every broadcast piece are bounded by the invitation's timeout.
A round that fails (a replica that never joins, dies mid-broadcast, or refuses) marks the group broken:
the caller pushes to the replicas that did not confirm by the data port, and the next round forms a new
epoch. The store and the collective are unauthenticated (as NCCL's are): the sha256 in the authenticated
call still guards what is applied, but bind the store to a private interface. `BroadcastSender` is the
trainer's side as a `FleetSender`.

Over ~400 lines because the group's life (forming, joining, rounds, leaving) is one protocol between the
trainer (`WeightBroadcaster`) and its replicas (`BroadcastMember`); apart, neither half would read alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import grpc

from grpo.common.auth import bearer_metadata
from grpo.common.channels import make_channel
from grpo.common.net import local_host_towards, split_address
from grpo.common.weights.base import (
    FleetSender,
    Push,
    PushResult,
    ReplicaTarget,
    Round,
    WeightSource,
    remaining,
    resolve,
    update_call,
    verify_reply,
)
from grpo.common.weights.codec import WeightUpdateError, data_pieces, make_header
from grpo.common.weights.receiver import StreamMessage, WeightAssembler
from grpo.v1 import rollout_pb2

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

BROADCAST_KEY = "grpo-broadcast"  # UpdateWeights call metadata: an Invitation
# Each collective moves at most this much: the replica hashes one piece while the next arrives, and on GPU
# a piece is all the device memory a transfer needs (vLLM's packed weight transfer buckets the same way).
PIECE_BYTES = 64 * 1024 * 1024
Backend = Literal["gloo", "nccl"]
# One round's reply per replica: its UpdateWeights reply, the error it ended with, or None (not attempted).
Outcome = rollout_pb2.UpdateWeightsResponse | Exception | None


class BroadcastFailed(RuntimeError):
    """The group could not be formed or a broadcast did not complete: the round falls back to the data port."""


@dataclass(frozen=True)
class Invitation:
    """What the trainer tells one replica, in its UpdateWeights metadata, about this round's broadcast."""

    store: str  # host:port of the trainer's TCPStore ([v6]:port)
    epoch: int  # the group's formation; a new one whenever members change or a round failed
    rank: int  # 1..world-1; the trainer is 0
    world: int
    size: int  # bytes that will be broadcast (the header's total_bytes)
    piece_bytes: int  # bytes per collective: the sender's choice, so both sides cut the same pieces
    timeout_s: float  # bound on joining and on each broadcast piece
    backend: Backend = "gloo"
    fresh: bool = True  # the group is formed this round (else the replica must already be in it)

    def encode(self) -> str:
        fields = (self.store, self.epoch, self.rank, self.world, self.size, self.piece_bytes, self.timeout_s,
                  self.backend, int(self.fresh))  # fmt: skip
        return ",".join(str(f) for f in fields)

    @classmethod
    def parse(cls, text: str) -> Invitation:
        """The invitation in `text`; WeightUpdateError naming the metadata key when it is malformed."""
        fields = text.split(",")
        try:
            store, epoch, rank, world, size, piece, timeout_s, backend, fresh = fields
            host, port = split_address(store)
            inv = cls(store, int(epoch), int(rank), int(world), int(size), int(piece), float(timeout_s),
                      backend, fresh == "1")  # type: ignore[arg-type]  # fmt: skip
        except ValueError:
            inv = None
        if inv is None or not (host and 0 < port < 65536 and 0 < inv.rank < inv.world and inv.size > 0
                               and inv.piece_bytes > 0 and inv.timeout_s > 0 and backend in ("gloo", "nccl")
                               and fresh in ("0", "1")):  # fmt: skip
            raise WeightUpdateError(
                f"{BROADCAST_KEY} metadata must be 'host:port,epoch,rank,world,size,piece_bytes,timeout_s,gloo|nccl,0|1'"
            )
        return inv


def form_group(store: Any, epoch: int, rank: int, world: int, backend: Backend, timeout_s: float, host: str) -> Any:
    """A process group of `world` ranks over `store` under this epoch's prefix, outside torch's global state.

    Blocks until every rank has joined, or raises after `timeout_s` (gloo: RuntimeError)."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"grpo-broadcast/{epoch}/pg", store)
    if backend == "nccl":  # not exercised on CPU: see docs/gpu-weight-broadcast.md
        import torch

        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout_s)
        group: Any = dist.ProcessGroupNCCL(prefixed, rank, world, options)
        # NCCL connects lazily; one tiny collective makes a missing rank fail here, not mid-transfer.
        group.broadcast([torch.zeros(1, device="cuda")], dist.BroadcastOptions()).wait()
        return group
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # the stubs lack it
    options._timeout = timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(prefixed, rank, world, options)


def broadcast_piece(group: Any, piece: torch.Tensor, timeout_s: float) -> None:
    """One collective from rank 0 into `piece` on every rank; RuntimeError when it does not complete in time."""
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([piece], options).wait(timedelta(seconds=max(timeout_s, 0.1)))


def piece_reader(group: Any, inv: Invitation, deadline: float) -> Callable[[memoryview], int]:
    """`recv_into` for WeightAssembler.receive: each call receives the next piece into the staging buffer."""
    import torch

    def read_into(view: memoryview) -> int:
        size = min(len(view), inv.piece_bytes)
        host = torch.frombuffer(view[:size], dtype=torch.uint8)  # the staging buffer itself, no copy
        left = min(inv.timeout_s, deadline - time.monotonic())
        if left <= 0:
            raise WeightUpdateError("the weight broadcast did not arrive in time")
        try:
            if inv.backend == "nccl":
                device = torch.empty(size, dtype=torch.uint8, device="cuda")
                broadcast_piece(group, device, left)
                host.copy_(device)  # the sha256 is checked on the host bytes, as for every transport
            else:
                broadcast_piece(group, host, left)
        except RuntimeError as exc:
            raise WeightUpdateError(f"the weight broadcast failed: {exc}") from None
        return size

    return read_into


def round_key(epoch: int) -> str:
    """The store prefix of one formation: `joined/<rank>` from each replica, then `go` or `abort` from rank 0."""
    return f"grpo-broadcast/{epoch}"


def await_go(store: Any, epoch: int, deadline: float) -> None:
    """Wait for rank 0 to say that every rank has announced itself (`go`) or that the round is off (`abort`).

    Forming a gloo or NCCL group blocks until every rank connects; waiting here first means a replica
    that never comes costs the others one short abort, not the whole collective timeout."""
    go, abort = f"{round_key(epoch)}/go", f"{round_key(epoch)}/abort"
    while not store.check([go]):
        if store.check([abort]):
            raise WeightUpdateError(f"the trainer called off broadcast group {epoch} (a replica did not join)")
        if time.monotonic() > deadline:
            raise WeightUpdateError(f"broadcast group {epoch} was not formed in time")
        time.sleep(0.01)


class BroadcastMember:
    """A replica's membership: the group it joined, kept from round to round until an invitation names
    another epoch (or a broadcast fails). One broadcast at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._joined: tuple[str, int, int, int] | None = None  # (store, epoch, rank, world)
        self._store: Any = None
        self._group: Any = None

    def receive(self, inv: Invitation, assembler: WeightAssembler, deadline: float) -> None:
        """Join (or reuse) the group `inv` names and receive its `size` bytes into `assembler`."""
        if not self._lock.acquire(timeout=max(min(inv.timeout_s, deadline - time.monotonic()), 0.0)):
            raise WeightUpdateError("another weight broadcast is still being received here")
        try:
            group = self._join(inv)
            try:
                assembler.receive(inv.size, piece_reader(group, inv, deadline))
            except WeightUpdateError:
                self.leave()  # a failed collective leaves the group unusable; the trainer re-forms it
                raise
        finally:
            self._lock.release()

    def _join(self, inv: Invitation) -> Any:
        key = (inv.store, inv.epoch, inv.rank, inv.world)
        if self._joined == key and not inv.fresh:  # a fresh one may reuse an old key: a restarted trainer's
            return self._group
        if not inv.fresh:
            self.leave()
            raise WeightUpdateError(f"not a member of broadcast group {inv.epoch} (restarted?); it re-forms next round")
        self.leave()
        import torch.distributed as dist

        host, port = split_address(inv.store)
        timeout = timedelta(seconds=inv.timeout_s)
        try:
            store = dist.TCPStore(host, port, None, False, timeout)
            store.set(f"{round_key(inv.epoch)}/joined/{inv.rank}", "1")
            await_go(store, inv.epoch, time.monotonic() + inv.timeout_s)
            group = form_group(store, inv.epoch, inv.rank, inv.world, inv.backend, inv.timeout_s,
                               local_host_towards(host, port))  # fmt: skip
        except (RuntimeError, OSError) as exc:
            raise WeightUpdateError(
                f"could not join weight broadcast group {inv.epoch} at {inv.store}: {exc}"
            ) from None
        self._joined, self._store, self._group = key, store, group
        log.info("joined weight broadcast group %d as rank %d of %d (%s)", inv.epoch, inv.rank, inv.world, inv.backend)
        return group

    def leave(self) -> None:
        self._joined, self._store, self._group = None, None, None


class BroadcastSource(WeightSource):
    """The bytes by broadcast from rank 0 into the staging buffer; then the call's stream, header only."""

    via = "broadcast"

    def __init__(self, member: BroadcastMember, invitation: Invitation) -> None:
        self.member = member
        self.invitation = invitation

    def fill(self, assembler: WeightAssembler, messages: Iterable[StreamMessage], deadline: float) -> None:
        self.member.receive(self.invitation, assembler, deadline)
        for message in messages:
            assembler.feed(message)


class WeightBroadcaster:
    """The trainer's side, rank 0: hosts the store and sends each update once to all replicas of the group.

    `address` is where replicas reach the store ("host:port", port 0: any free one) and the interface the
    group listens on. The group is kept while the same replicas are pushed to and every round succeeds.
    """

    def __init__(
        self, address: str, backend: Backend = "gloo", timeout_s: float = 30.0, piece_bytes: int = PIECE_BYTES
    ) -> None:
        import torch.distributed as dist

        self.host, port = split_address(address)
        self.backend: Backend = backend
        self.timeout_s = timeout_s
        self.piece_bytes = piece_bytes
        self._store: Any = dist.TCPStore(
            self.host, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False
        )
        self.port: int = self._store.port
        self.epoch = 0
        self._group: Any = None
        self._members: tuple[str, ...] = ()
        self.pieces_sent = 0  # collectives issued (each sends its piece once, for every member)

    @property
    def store_address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def push(
        self,
        addresses: Sequence[str],
        tensors: Mapping[str, torch.Tensor],
        version: int,
        *,
        token: str | None = None,
        deadline: float,
        checksum: str | Future[str] | None = None,
        ca_file: str | None = None,
    ) -> list[Outcome]:
        """`tensors` as `version` to the replicas at `addresses` by `deadline` (time.monotonic()), as
        WeightSender.push does for one replica; one outcome per address."""
        with ExitStack() as channels:
            pushes = []
            for address in addresses:
                channel = channels.enter_context(make_channel(address, ca_file))
                update = update_call(channel)
                pushes.append(
                    Push(update, address, tensors, version, bearer_metadata(token), deadline, checksum, ca_file)
                )
            return self.send_all(pushes)

    def send_all(self, pushes: Sequence[Push]) -> list[Outcome]:
        """One update to every push's replica: the calls at once, the bytes once. One outcome per push, in order."""
        if not pushes:
            return []
        members = tuple(p.address for p in pushes)
        fresh = self._group is None or members != self._members
        if fresh:
            self.leave()
            self.epoch += 1
        first = pushes[0]
        size = sum(t.numel() * t.element_size() for t in first.tensors.values())
        with ThreadPoolExecutor(1, thread_name_prefix="weights-sha256") as hasher:
            header = hasher.submit(lambda: make_header(first.tensors, first.version, resolve(first.checksum)))

            def header_message() -> Iterator[bytes]:  # gRPC's sending thread waits here for the hash
                yield rollout_pb2.WeightChunk(header=header.result()).SerializeToString()

            calls = []
            for rank, push in enumerate(pushes, start=1):
                inv = Invitation(self.store_address, self.epoch, rank, len(pushes) + 1, size, self.piece_bytes,
                                 self.timeout_s, self.backend, fresh)  # fmt: skip
                metadata = (*push.metadata, (BROADCAST_KEY, inv.encode()))
                calls.append(push.update.future(header_message(), timeout=remaining(push.deadline), metadata=metadata))
            failed = False
            try:
                if fresh:
                    self._group = self._form(calls, len(pushes) + 1)
                    self._members = members
                self._broadcast(first, min(p.deadline for p in pushes))
            except BroadcastFailed as exc:
                log.warning("weight broadcast of version %d (group %d) failed: %s", first.version, self.epoch, exc)
                failed = True
            outcomes = self._collect(calls, failed)
        if not all(isinstance(o, rollout_pb2.UpdateWeightsResponse) for o in outcomes):
            # A member that did not take part in every collective is out of step with the others: start over.
            self.leave()
        return outcomes

    def _collect(self, calls: Sequence[grpc.Future], failed: bool) -> list[Outcome]:
        """The replies. Once the round has failed (here, or at any member) rank 0 leaves the group, so every live
        member still in a collective fails at once, and a member that had all the bytes applies them; the rest
        get `timeout_s` to answer, then their calls are cancelled (a frozen replica): the fallback follows."""
        grace: float | None = None
        while not all(call.done() for call in calls):
            if grace is None and (failed or any(call.done() and call.code() != grpc.StatusCode.OK for call in calls)):
                self.leave()
                grace = time.monotonic() + self.timeout_s
            if grace is not None and time.monotonic() > grace:
                for call in calls:
                    call.cancel()  # a no-op for those already answered
                break
            time.sleep(0.01)
        return [_outcome(call) for call in calls]

    def _form(self, calls: Sequence[grpc.Future], world: int) -> Any:
        """Wait for every replica to announce itself (a call that ends first means it will not come), then
        form the group."""
        prefix = round_key(self.epoch)
        keys = [f"{prefix}/joined/{rank}" for rank in range(1, world)]
        deadline = time.monotonic() + self.timeout_s
        while not self._store.check(keys):
            ended = [c for c in calls if c.done()]
            late = time.monotonic() > deadline
            if ended or late:
                self._store.set(f"{prefix}/abort", "1")  # the replicas that did join stop waiting now
                why = f"answered before joining: {describe(_outcome(ended[0]))}" if ended else "did not join in time"
                raise BroadcastFailed(f"a replica {why}")
            time.sleep(0.01)
        self._store.set(f"{prefix}/go", "1")
        try:
            return form_group(self._store, self.epoch, 0, world, self.backend, self.timeout_s, self.host)
        except RuntimeError as exc:
            raise BroadcastFailed(f"forming group {self.epoch}: {exc}") from None

    def _broadcast(self, push: Push, deadline: float) -> None:
        import torch

        for pieces in data_pieces(push.tensors, self.piece_bytes):
            piece = torch.frombuffer(pieces[0] if len(pieces) == 1 else _joined(pieces), dtype=torch.uint8)
            if self.backend == "nccl":
                piece = piece.to("cuda", non_blocking=False)
            left = min(self.timeout_s, deadline - time.monotonic())
            try:
                if left <= 0:
                    raise RuntimeError("the push deadline passed")
                broadcast_piece(self._group, piece, left)
            except RuntimeError as exc:
                raise BroadcastFailed(str(exc)) from None
            self.pieces_sent += 1

    def leave(self) -> None:
        """Drop the group (the next round forms a new epoch)."""
        self._group, self._members = None, ()

    def close(self) -> None:
        self.leave()
        self._store = None


def _joined(pieces: Sequence[memoryview]) -> bytearray:
    """Small tensors' pieces in one writable buffer (torch.frombuffer wants one it may write)."""
    out = bytearray(sum(len(p) for p in pieces))
    offset = 0
    for p in pieces:
        out[offset : offset + len(p)] = p
        offset += len(p)
    return out


def describe(outcome: Outcome) -> str:
    """An outcome in a log line."""
    if isinstance(outcome, grpc.RpcError) and isinstance(outcome, grpc.Call):
        return f"{outcome.code().name}: {outcome.details()}"
    if outcome is None:
        return "not attempted"
    if isinstance(outcome, grpc.FutureCancelledError):
        return "cancelled: no answer in time after the round failed"
    return (str(outcome).splitlines() or [type(outcome).__name__])[0][:300]


def _outcome(call: grpc.Future) -> Outcome:
    try:
        reply: rollout_pb2.UpdateWeightsResponse = call.result()
        return reply
    except grpc.RpcError as exc:
        return exc
    except grpc.FutureCancelledError as exc:
        return exc


class BroadcastSender(FleetSender):
    """The broadcast as a way of pushing: the targets it updated get their result, the rest None (the next way
    pushes to them). It gets half the push's time."""

    def __init__(self, broadcaster: WeightBroadcaster) -> None:
        self.broadcaster = broadcaster

    def send(self, push: Round, targets: Sequence[ReplicaTarget]) -> list[PushResult | None]:
        start, version, checksum = time.monotonic(), push.version, push.checksum
        outcomes = self.broadcaster.push([t.address for t in targets], push.tensors, version, token=push.token,
                                         deadline=start + (push.deadline - start) / 2, checksum=checksum,
                                         ca_file=push.ca_file)  # fmt: skip
        done: list[PushResult | None] = []
        for target, outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, rollout_pb2.UpdateWeightsResponse) and not verify_reply(
                outcome, version, checksum.result()
            ):
                done.append(PushResult(target.replica_id, target.address, True, outcome.version, outcome.checksum,
                                       "", time.monotonic() - start, route="broadcast"))  # fmt: skip
            else:
                log.warning("broadcast to %s did not take (%s); pushing to it without the broadcast",
                            target.replica_id, describe(outcome))  # fmt: skip
                done.append(None)
        return done


__all__: list[str] = [
    "BROADCAST_KEY",
    "BroadcastFailed",
    "BroadcastMember",
    "BroadcastSender",
    "BroadcastSource",
    "Invitation",
    "Outcome",
    "WeightBroadcaster",
    "describe",
]
