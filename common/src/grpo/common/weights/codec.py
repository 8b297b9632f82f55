"""The weight update wire codec the trainer (sender) and rollout replicas (receivers) share: pure, no I/O.

The stream is one `WeightHeader` then the raw tensor bytes, in header order. Canonical
order is the tensor names sorted; the names are the checkpoint names (what
`save_pretrained` writes to model.safetensors: tied weights appear once). The checksum
is the sha256 hex digest of the concatenated little-endian bytes of every tensor in that
order, so sender and receiver compute the same value from the same weights. How the bytes travel is
the transport's business (grpo.common.weights: one module per transport).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from grpo.v1 import rollout_pb2

if TYPE_CHECKING:
    import torch

CHUNK_BYTES = 4 * 1024 * 1024
UPDATE_WEIGHTS_METHOD = f"/{rollout_pb2.DESCRIPTOR.services_by_name['RolloutService'].full_name}/UpdateWeights"
# safetensors dtype name -> (torch dtype attribute, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}

FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}

Specs = dict[str, tuple[str, tuple[int, ...]]]


class WeightUpdateError(ValueError):
    """A weight stream that cannot be applied; the message says what is wrong."""

    def __init__(self, message: str, precondition: bool = False) -> None:
        super().__init__(message)
        # True when the stream is fine but does not fit the state (an older version).
        self.precondition = precondition


def dtype_name(dtype: torch.dtype) -> str:
    for name, (attr, _) in DTYPES.items():
        if str(dtype) == f"torch.{attr}":
            return name
    raise WeightUpdateError(f"unsupported tensor dtype {dtype}")


def to_torch_dtype(name: str) -> torch.dtype:
    import torch

    if name not in DTYPES:
        raise WeightUpdateError(f"unsupported dtype {name!r}; known: {sorted(DTYPES)}")
    return getattr(torch, DTYPES[name][0])


def nbytes(dtype: str, shape: Iterable[int]) -> int:
    count = 1
    for d in shape:
        count *= int(d)
    return count * DTYPES[dtype][1]


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's raw bytes without a copy when it is already contiguous on the CPU."""
    import torch

    flat = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    # ndarray.data is memoryview(ndarray); numpy types ndarray as a Buffer only for Python >= 3.12
    return flat.numpy().data


def model_weights(model: Any) -> dict[str, torch.Tensor]:
    """A model's checkpoint tensors by name, tied duplicates (e.g. lm_head = embeddings) dropped."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


def specs_of(tensors: Mapping[str, torch.Tensor]) -> Specs:
    return {name: (dtype_name(t.dtype), tuple(t.shape)) for name, t in tensors.items()}


def weights_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 hex of the tensor bytes in canonical (sorted-name) order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(tensor_bytes(tensors[name]))
    return h.hexdigest()


def make_header(
    tensors: Mapping[str, torch.Tensor], version: int, checksum: str | None = None
) -> rollout_pb2.WeightHeader:
    specs = specs_of(tensors)
    names = sorted(tensors)
    return rollout_pb2.WeightHeader(
        version=version,
        tensors=[rollout_pb2.TensorSpec(name=n, dtype=specs[n][0], shape=specs[n][1]) for n in names],
        sha256=checksum or weights_checksum(tensors),
        total_bytes=sum(nbytes(*specs[n]) for n in names),
    )


def data_pieces(tensors: Mapping[str, torch.Tensor], chunk_bytes: int) -> Iterator[list[memoryview]]:
    """The tensor bytes in canonical order, grouped into chunks of at most `chunk_bytes` (views, no copies).

    Small tensors are packed together; large ones are sliced, so no copy of the whole model is made.
    """
    pending: list[memoryview] = []
    size = 0
    for name in sorted(tensors):
        view = tensor_bytes(tensors[name])
        start = 0
        while start < len(view):
            take = min(chunk_bytes - size, len(view) - start)
            pending.append(view[start : start + take])
            size += take
            start += take
            if size == chunk_bytes:
                yield pending
                pending, size = [], 0
    if pending:
        yield pending


def data_chunks(tensors: Mapping[str, torch.Tensor], chunk_bytes: int) -> Iterator[memoryview]:
    """`data_pieces`, each chunk as one view: a sliced tensor as it is, small tensors packed together copied once."""
    for pieces in data_pieces(tensors, chunk_bytes):
        yield pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))


def iter_weight_chunks(
    tensors: Mapping[str, torch.Tensor],
    version: int,
    chunk_bytes: int = CHUNK_BYTES,
    checksum: str | None = None,
) -> Iterator[rollout_pb2.WeightChunk]:
    """The stream as proto messages: the header, then the bytes in chunks of at most `chunk_bytes`."""
    yield rollout_pb2.WeightChunk(header=make_header(tensors, version, checksum))
    for pieces in data_pieces(tensors, chunk_bytes):
        yield rollout_pb2.WeightChunk(data=b"".join(pieces))


# The wire fast path. A data chunk is the protobuf encoding of WeightChunk(data=...): the tag of
# field 2 (length-delimited), a varint length, the bytes. Building and reading that by hand
# saves three of the four copies protobuf makes per chunk; the bytes on the wire are the same,
# so a client or server that uses the generated code interoperates unchanged.
DATA_TAG = b"\x12"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def encode_data(pieces: Sequence[memoryview]) -> bytes:
    """The wire bytes of WeightChunk(data=b"".join(pieces)), made with one copy."""
    return b"".join([DATA_TAG, _varint(sum(len(p) for p in pieces)), *pieces])


def iter_wire_messages(
    tensors: Mapping[str, torch.Tensor],
    version: int,
    chunk_bytes: int = CHUNK_BYTES,
    checksum: str | None = None,
) -> Iterator[bytes]:
    """`iter_weight_chunks`, already serialised (send with no request serializer)."""
    yield rollout_pb2.WeightChunk(header=make_header(tensors, version, checksum)).SerializeToString()
    for pieces in data_pieces(tensors, chunk_bytes):
        yield encode_data(pieces)
