"""The relay's pure parts: the tree a plan makes, its metadata, and a receive buffer forwarded as it fills."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from grpo.common.weights.codec import make_header, specs_of, tensor_bytes
from grpo.common.weights.receiver import WeightAssembler
from grpo.common.weights.relay import RELAY_PLAN_KEY, ReceivePayload, RelayBroken, plan_in, relay_tree, walk
from grpo.v1 import rollout_pb2 as pb


def shape(hop: pb.RelayHop) -> object:
    return (hop.replica_id, [shape(c) for c in hop.children]) if hop.children else hop.replica_id


def hops(n: int) -> list[pb.RelayHop]:
    return [pb.RelayHop(replica_id=f"r{i}", address=f"h{i}:1", data_port=i) for i in range(n)]


def test_a_fanout_of_one_is_a_chain_and_more_a_breadth_first_tree() -> None:
    assert shape(relay_tree(hops(3), 1)) == ("r0", [("r1", ["r2"])])
    assert shape(relay_tree(hops(6), 2)) == ("r0", [("r1", ["r3", "r4"]), ("r2", ["r5"])])
    assert shape(relay_tree(hops(1), 4)) == "r0"
    assert [h.replica_id for h in walk([relay_tree(hops(6), 2)])] == ["r0", "r1", "r3", "r4", "r2", "r5"]
    with pytest.raises(ValueError):
        relay_tree([], 2)
    # A chain longer than protobuf nests becomes a tree; its plan still parses.
    long = relay_tree(hops(200), 1)
    assert len(long.children) == 2 and len(list(walk([long]))) == 200
    assert pb.RelayPlan.FromString(pb.RelayPlan(hops=[long]).SerializeToString()) == pb.RelayPlan(hops=[long])


def test_the_plan_travels_as_binary_metadata() -> None:
    plan = pb.RelayPlan(hops=[relay_tree(hops(3), 1)])
    got = plan_in({RELAY_PLAN_KEY: plan.SerializeToString()})
    assert got == plan and plan_in({}) is None
    with pytest.raises(ValueError, match=RELAY_PLAN_KEY):
        plan_in({RELAY_PLAN_KEY: b"\xff\xff"})


def _assembler_and_bytes(payload: ReceivePayload) -> tuple[WeightAssembler, bytes, pb.WeightHeader]:
    tensors = {"w": torch.arange(4096, dtype=torch.float32)}
    assembler = WeightAssembler(specs_of(tensors), -1, on_progress=payload.progress)
    return assembler, bytes(tensor_bytes(tensors["w"])), make_header(tensors, 1)


def test_a_receive_buffer_is_forwarded_as_it_fills_and_the_header_when_it_comes() -> None:
    payload = ReceivePayload()
    assembler, data, header = _assembler_and_bytes(payload)
    forwarded: list[bytes] = []
    reader = threading.Thread(target=lambda: forwarded.extend(bytes(v) for v in payload.pieces(time.monotonic() + 10)))
    reader.start()
    pos = 0

    def read_into(view: memoryview) -> int:  # the data port, 1000 bytes at a time
        nonlocal pos
        n = min(1000, len(view), len(data) - pos)
        view[:n] = data[pos : pos + n]
        pos += n
        time.sleep(0.001)
        return n

    assembler.receive(len(data), read_into)
    reader.join(10)
    assert b"".join(forwarded) == data and len(forwarded) > 1  # in pieces, while it arrived
    for message in payload.watch([pb.WeightChunk(header=header)]):
        assembler.feed(message)
    assert payload.header(time.monotonic() + 1) == header
    payload.end()
    assert payload.complete() and not payload.broken()
    assert assembler.finish()[0] == 1


def test_a_receive_that_ends_short_breaks_what_is_forwarded() -> None:
    payload = ReceivePayload()
    assembler, data, _ = _assembler_and_bytes(payload)
    chunks = iter([data[:5000], b""])

    def read_into(view: memoryview) -> int:
        chunk = next(chunks)
        view[: len(chunk)] = chunk
        return len(chunk)

    assembler.receive(len(data), read_into)
    payload.end()
    pieces = payload.pieces(time.monotonic() + 1)
    assert bytes(next(pieces)) == data[:5000]
    with pytest.raises(RelayBroken):
        next(pieces)
    assert payload.broken() and not payload.complete()
    with pytest.raises(RelayBroken):
        payload.header(time.monotonic() + 1)
