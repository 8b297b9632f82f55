"""Weight transport: chunking, assembling, checksums and every kind of rejected stream."""

from __future__ import annotations

import hashlib

import pytest
import torch

from grpo.common.weights.codec import WeightUpdateError, iter_weight_chunks, model_weights, specs_of, weights_checksum
from grpo.common.weights.receiver import WeightAssembler, assemble
from grpo.v1 import rollout_pb2


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "b.weight": torch.randn(33, 17, generator=g),
        "a.bias": torch.randn(5, generator=g).to(torch.bfloat16),
        "c.scale": torch.randn(1000, generator=g).half(),
        "d.empty": torch.zeros(0, 4),
    }


def _chunks(
    tensors: dict[str, torch.Tensor], version: int = 1, chunk_bytes: int = 256
) -> list[rollout_pb2.WeightChunk]:
    return list(iter_weight_chunks(tensors, version, chunk_bytes=chunk_bytes))


def test_round_trip_preserves_every_tensor_and_the_checksum() -> None:
    tensors = _tensors()
    chunks = _chunks(tensors, version=3)
    assert chunks[0].WhichOneof("kind") == "header"
    assert all(len(c.data) <= 256 for c in chunks[1:])
    header = chunks[0].header
    assert [t.name for t in header.tensors] == sorted(tensors)
    assert header.total_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    version, checksum, out = assemble(chunks, specs_of(tensors), loaded_version=0)
    assert version == 3 and checksum == weights_checksum(tensors) == header.sha256
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and torch.equal(out[name], t), name


def test_checksum_is_sha256_of_bytes_in_sorted_name_order() -> None:
    tensors = _tensors()
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    assert weights_checksum(tensors) == h.hexdigest()
    # Insertion order does not matter; values do.
    assert weights_checksum(dict(reversed(tensors.items()))) == h.hexdigest()
    changed = {**tensors, "b.weight": tensors["b.weight"] + 1e-3}
    assert weights_checksum(changed) != h.hexdigest()


def test_tied_weights_appear_once() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    assert list(model_weights(Tied())) == ["embed.weight"]


def _reject(chunks: list[rollout_pb2.WeightChunk], specs: dict, match: str, loaded: int = 0) -> WeightUpdateError:
    with pytest.raises(WeightUpdateError, match=match) as info:
        assemble(chunks, specs, loaded_version=loaded)
    return info.value


def test_corrupted_byte_is_a_sha_mismatch() -> None:
    tensors = _tensors()
    chunks = _chunks(tensors)
    data = bytearray(chunks[2].data)
    data[7] ^= 0xFF
    chunks[2] = rollout_pb2.WeightChunk(data=bytes(data))
    _reject(chunks, specs_of(tensors), "sha256 mismatch")


def test_truncated_and_oversize_streams() -> None:
    tensors = _tensors()
    chunks = _chunks(tensors)
    _reject(chunks[:-1], specs_of(tensors), "truncated")
    _reject([*chunks, rollout_pb2.WeightChunk(data=b"x")], specs_of(tensors), "longer than")


def test_header_must_match_the_model() -> None:
    tensors = _tensors()
    specs = specs_of(tensors)
    wrong_shape = {**tensors, "b.weight": torch.zeros(17, 33)}
    _reject(_chunks(wrong_shape), specs, r"b\.weight: got shape \[17, 33\], the model has \[33, 17\]")
    wrong_dtype = {**tensors, "b.weight": tensors["b.weight"].to(torch.int32)}
    _reject(_chunks(wrong_dtype), specs, "b.weight: got dtype I32, the model has F32")
    renamed = {("z.weight" if k == "b.weight" else k): v for k, v in tensors.items()}
    _reject(_chunks(renamed), specs, r"missing \['b\.weight'\], unknown \['z\.weight'\]")


def test_float_weights_of_another_precision_are_accepted() -> None:
    """An fp32 trainer pushes to a bf16 replica: the bytes arrive as sent, the engine casts on apply."""
    tensors = _tensors()
    replica = specs_of({k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in tensors.items()})
    _, checksum, out = assemble(_chunks(tensors), replica, loaded_version=0)
    assert checksum == weights_checksum(tensors)  # the version's identity is what the trainer sent
    assert out["b.weight"].dtype == torch.float32 and torch.equal(out["b.weight"], tensors["b.weight"])


def test_missing_header_second_header_and_older_version() -> None:
    tensors = _tensors()
    chunks = _chunks(tensors, version=5)
    _reject(chunks[1:], specs_of(tensors), "before the header")
    _reject([chunks[0], *chunks], specs_of(tensors), "second header")
    _reject([], specs_of(tensors), "no header")
    err = _reject(chunks, specs_of(tensors), "not newer than the loaded version 5", loaded=5)
    assert err.precondition


def test_assembler_rejects_at_the_first_bad_chunk() -> None:
    tensors = _tensors()
    assembler = WeightAssembler(specs_of(tensors), loaded_version=0)
    chunks = _chunks(tensors)
    for c in chunks:
        assembler.feed(c)
    with pytest.raises(WeightUpdateError, match="longer than"):
        assembler.feed(rollout_pb2.WeightChunk(data=b"\0"))


def test_big_tensor_is_sliced_into_full_chunks() -> None:
    tensors = {"w": torch.arange(3000, dtype=torch.float32)}
    chunks = _chunks(tensors, chunk_bytes=4096)
    assert [len(c.data) for c in chunks[1:]] == [4096, 4096, 3808]
