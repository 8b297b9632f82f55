"""The weight stream's wire fast path: hand-made frames are exactly protobuf's, and are read back without copies."""

from __future__ import annotations

import pytest
import torch
from google.protobuf.message import DecodeError

from grpo.common.weights.codec import encode_data, iter_weight_chunks, iter_wire_messages, specs_of, weights_checksum
from grpo.common.weights.receiver import StagingBuffers, WeightAssembler, assemble, decode_chunk
from grpo.v1 import rollout_pb2


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"w": torch.randn(300, 7, generator=g), "b": torch.randn(9, generator=g).half()}


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16383, 16384, 70_000])
def test_encoded_data_chunk_is_byte_identical_to_protobuf(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    pieces = [memoryview(data)[: size // 3], memoryview(data)[size // 3 :]]
    wire = encode_data(pieces)
    assert wire == rollout_pb2.WeightChunk(data=data).SerializeToString()
    assert rollout_pb2.WeightChunk.FromString(wire).data == data
    decoded = decode_chunk(wire)
    assert isinstance(decoded, memoryview) and decoded.obj is wire  # a view into the received bytes, not a copy
    assert decoded.tobytes() == data


def test_other_messages_are_parsed_by_protobuf() -> None:
    header = next(iter_weight_chunks(_tensors(), 4))
    decoded = decode_chunk(header.SerializeToString())
    assert isinstance(decoded, rollout_pb2.WeightChunk) and decoded.header.version == 4
    # Data followed by more fields is not a plain data frame: protobuf decides (the last oneof member wins).
    mixed = encode_data([memoryview(b"abc")]) + header.SerializeToString()
    parsed = decode_chunk(mixed)
    assert isinstance(parsed, rollout_pb2.WeightChunk) and parsed.WhichOneof("kind") == "header"
    # A length that runs past the end is not sliced: protobuf rejects it.
    with pytest.raises(DecodeError):
        decode_chunk(b"\x12\x05abc")
    empty = decode_chunk(b"")
    assert isinstance(empty, rollout_pb2.WeightChunk) and empty.WhichOneof("kind") is None


def test_wire_messages_decode_to_the_same_weights_as_proto_messages() -> None:
    tensors = _tensors()
    wire = [decode_chunk(m) for m in iter_wire_messages(tensors, 2, chunk_bytes=1000)]
    proto = list(iter_weight_chunks(tensors, 2, chunk_bytes=1000))
    assert len(wire) == len(proto)
    assert all(isinstance(m, memoryview) for m in wire[1:])
    version, checksum, out = assemble(wire, specs_of(tensors), loaded_version=1)
    assert version == 2 and checksum == weights_checksum(tensors)
    assert all(torch.equal(out[k], v) for k, v in tensors.items())


def test_staging_buffers_are_reused_and_bounded() -> None:
    pool = StagingBuffers(keep=1)
    with pool.borrow() as allocate:
        first = allocate(64)
        assert allocate(64) is first  # one buffer per borrow
        with pool.borrow() as other:  # in use: another borrower gets a fresh one
            second = other(64)
            assert second is not first
    with pool.borrow() as allocate:
        again = allocate(64)
        assert again is first or again is second  # one of them was kept...
        with pool.borrow() as other:
            assert other(64) is not again  # ...and only one (keep=1)
    with pool.borrow() as allocate:
        resized = allocate(32)  # a stream of another size (an fp32 push to a bf16 replica) gets its own
        assert len(resized) == 32
    with pool.borrow() as allocate:
        assert allocate(32) is resized


def test_assembler_receives_into_the_allocated_buffer() -> None:
    tensors = _tensors()
    buffers: list[bytearray] = []

    def allocate(size: int) -> bytearray:
        buffers.append(bytearray(size))
        return buffers[-1]

    assembler = WeightAssembler(specs_of(tensors), 0, allocate)
    for chunk in iter_weight_chunks(tensors, 1, chunk_bytes=500):
        assembler.feed(chunk)
    _, _, out = assembler.finish()
    assert len(buffers) == 1 and assembler.buffer is buffers[0]
    assert all(torch.equal(out[k], v) for k, v in tensors.items())
    b_bytes = tensors["b"].numel() * 2  # "b" sorts first; "w" starts right after it
    out["w"].zero_()  # the tensors are views into the buffer
    assert not any(buffers[0][b_bytes:]) and any(buffers[0][:b_bytes])
