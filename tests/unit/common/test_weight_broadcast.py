"""The broadcast transport's parts, in one process: the invitation, and rank 0 and a replica over real gloo."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import torch

from grpo.common.net import split_address
from grpo.common.weights.base import Push
from grpo.common.weights.broadcast import BroadcastMember, Invitation, WeightBroadcaster, describe, round_key
from grpo.common.weights.codec import WeightUpdateError, make_header, specs_of, weights_checksum
from grpo.common.weights.receiver import WeightAssembler
from grpo.v1 import rollout_pb2


def test_an_invitation_survives_its_encoding() -> None:
    for store in ("10.0.0.7:29500", "[::1]:29500"):
        inv = Invitation(store, 3, 2, 4, 1234, 1000, 2.5, "nccl", False)
        assert Invitation.parse(inv.encode()) == inv
    assert split_address("[::1]:29500") == ("::1", 29500)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "10.0.0.7:29500,1,1,2,100,100,5",  # too few fields
        "10.0.0.7:29500,1,0,2,100,100,5,gloo,1",  # rank 0 is the trainer
        "10.0.0.7:29500,1,2,2,100,100,5,gloo,1",  # rank outside the world
        "10.0.0.7:29500,1,1,2,0,100,5,gloo,1",  # nothing to receive
        "10.0.0.7:29500,1,1,2,100,0,5,gloo,1",  # no piece size
        "10.0.0.7:29500,1,1,2,100,100,0,gloo,1",  # no timeout
        "10.0.0.7:29500,1,1,2,100,100,5,mpi,1",  # unknown backend
        "10.0.0.7:29500,1,1,2,100,100,5,gloo,yes",
        "10.0.0.7,1,1,2,100,100,5,gloo,1",  # no port
        ":29500,1,1,2,100,100,5,gloo,1",  # no host
        "10.0.0.7:29500,1,1,2,1e3,100,5,gloo,1",  # not an integer
    ],
)
def test_a_malformed_invitation_is_a_weight_update_error(text: str) -> None:
    with pytest.raises(WeightUpdateError, match="grpo-broadcast metadata must be"):
        Invitation.parse(text)


@pytest.fixture
def sender() -> Iterator[WeightBroadcaster]:
    broadcaster = WeightBroadcaster("127.0.0.1:0", timeout_s=10)
    yield broadcaster
    broadcaster.close()


def receive_in_thread(member: BroadcastMember, inv: Invitation, assembler: WeightAssembler) -> dict[str, Any]:
    """Runs the replica's side in a thread; the dict gets `error` or `done`."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            member.receive(inv, assembler, time.monotonic() + 30)
            out["done"] = time.monotonic()
        except WeightUpdateError as exc:
            out["error"], out["at"] = exc, time.monotonic()

    out["thread"] = threading.Thread(target=run, daemon=True)
    out["thread"].start()
    return out


def test_the_pieces_land_in_the_staging_buffer_and_the_header_vouches_for_them(sender: WeightBroadcaster) -> None:
    """Pieces of 1000 bytes: big tensors are sliced across pieces, small ones packed into one; the replica
    reads them into its buffer piece by piece, and the assembler's sha256 check passes only for these bytes."""
    tensors = {"a": torch.randn(700), "b": torch.arange(3, dtype=torch.int64), "c": torch.randn(10, 30)}
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    inv = Invitation(sender.store_address, 1, 1, 2, size, 1000, 10.0)
    sender.epoch, sender.piece_bytes = 1, 1000
    assembler = WeightAssembler(specs_of(tensors), 0)
    member = BroadcastMember()
    got = receive_in_thread(member, inv, assembler)
    sender._group = sender._form([], 2)
    sender._broadcast(Push(None, "", tensors, 1, (), time.monotonic() + 30, None, None), time.monotonic() + 30)  # type: ignore[arg-type]
    got["thread"].join(30)
    assert "done" in got, got
    assert size == 4024 and sender.pieces_sent == 5
    assembler.feed(rollout_pb2.WeightChunk(header=make_header(tensors, 1)))
    version, checksum, received = assembler.finish()
    assert (version, checksum) == (1, weights_checksum(tensors))
    assert all(torch.equal(received[k], tensors[k]) for k in tensors)


def test_an_abort_releases_a_waiting_replica_at_once(sender: WeightBroadcaster) -> None:
    member = BroadcastMember()
    got = receive_in_thread(member, Invitation(sender.store_address, 7, 1, 3, 8, 8, 30.0), WeightAssembler({}, 0))
    deadline = time.monotonic() + 10
    while not sender._store.check([f"{round_key(7)}/joined/1"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    aborted = time.monotonic()
    sender._store.set(f"{round_key(7)}/abort", "1")
    got["thread"].join(10)
    assert "called off" in str(got.get("error")), got
    assert got["at"] - aborted < 1.0  # not the 30 s timeout


def test_no_go_from_rank_0_ends_at_the_invitations_timeout(sender: WeightBroadcaster) -> None:
    start = time.monotonic()
    with pytest.raises(WeightUpdateError, match="not formed in time"):
        BroadcastMember().receive(Invitation(sender.store_address, 8, 1, 2, 8, 8, 0.5), WeightAssembler({}, 0),
                                  time.monotonic() + 30)  # fmt: skip
    assert time.monotonic() - start < 3


def test_a_replica_never_in_a_kept_group_says_so_instead_of_waiting(sender: WeightBroadcaster) -> None:
    """A restarted replica invited to reuse a group it never joined: it fails at once, and the trainer re-forms."""
    start = time.monotonic()
    with pytest.raises(WeightUpdateError, match="not a member of broadcast group 4"):
        BroadcastMember().receive(Invitation(sender.store_address, 4, 1, 2, 8, 8, 30.0, fresh=False),
                                  WeightAssembler({}, 0), time.monotonic() + 30)  # fmt: skip
    assert time.monotonic() - start < 1


def test_every_outcome_describes_itself_in_one_line() -> None:
    assert describe(None) == "not attempted"
    assert describe(grpc.FutureCancelledError()).startswith("cancelled")
    assert describe(RuntimeError("")) == "RuntimeError"
    assert describe(RuntimeError("first\nsecond")) == "first"
