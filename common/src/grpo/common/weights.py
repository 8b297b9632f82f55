"""Weight transport between the trainer (sender) and rollout replicas (receivers).

The stream is one `WeightHeader` then the raw tensor bytes, in header order. Canonical
order is the tensor names sorted; the names are the checkpoint names (what
`save_pretrained` writes to model.safetensors: tied weights appear once). The checksum
is the sha256 hex digest of the concatenated little-endian bytes of every tensor in that
order, so sender and receiver compute the same value from the same weights.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from grpo.common.auth import bearer_metadata
from grpo.common.channels import make_channel
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
# What a receiver reads from the stream: a parsed WeightChunk, or a data chunk's bytes (`decode_chunk`).
StreamMessage = rollout_pb2.WeightChunk | memoryview


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


def _data_pieces(tensors: Mapping[str, torch.Tensor], chunk_bytes: int) -> Iterator[list[memoryview]]:
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


def iter_weight_chunks(
    tensors: Mapping[str, torch.Tensor],
    version: int,
    chunk_bytes: int = CHUNK_BYTES,
    checksum: str | None = None,
) -> Iterator[rollout_pb2.WeightChunk]:
    """The stream as proto messages: the header, then the bytes in chunks of at most `chunk_bytes`."""
    yield rollout_pb2.WeightChunk(header=make_header(tensors, version, checksum))
    for pieces in _data_pieces(tensors, chunk_bytes):
        yield rollout_pb2.WeightChunk(data=b"".join(pieces))


# The wire fast path. A data chunk is the protobuf encoding of WeightChunk(data=...): the tag of
# field 2 (length-delimited), a varint length, the bytes. Building and reading that by hand
# saves three of the four copies protobuf makes per chunk; the bytes on the wire are the same,
# so a client or server that uses the generated code interoperates unchanged.
_DATA_TAG = b"\x12"


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
    return b"".join([_DATA_TAG, _varint(sum(len(p) for p in pieces)), *pieces])


def iter_wire_messages(
    tensors: Mapping[str, torch.Tensor],
    version: int,
    chunk_bytes: int = CHUNK_BYTES,
    checksum: str | None = None,
) -> Iterator[bytes]:
    """`iter_weight_chunks`, already serialised (send with no request serializer)."""
    yield rollout_pb2.WeightChunk(header=make_header(tensors, version, checksum)).SerializeToString()
    for pieces in _data_pieces(tensors, chunk_bytes):
        yield encode_data(pieces)


def decode_chunk(raw: bytes) -> StreamMessage:
    """A received message: a data chunk as a zero-copy view into `raw`, anything else parsed by protobuf."""
    if raw[:1] == _DATA_TAG:
        size, shift, pos = 0, 0, 1
        while pos < len(raw) and pos < 11:
            byte = raw[pos]
            size |= (byte & 0x7F) << shift
            shift += 7
            pos += 1
            if not byte & 0x80:
                if pos + size == len(raw):
                    return memoryview(raw)[pos:]
                break
    return rollout_pb2.WeightChunk.FromString(raw)


class PipelinedSha256:
    """sha256 of the bytes as they arrive, computed in a worker thread.

    hashlib releases the GIL on large buffers, so hashing chunk k overlaps with receiving
    chunk k+1: one core receives, the other hashes, and the digest is ready when the last
    chunk is. Views must stay valid until `hexdigest` (they point into the assembly buffer).
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._queue: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="weights-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (view := self._queue.get()) is not None:
            self._hash.update(view)

    def update(self, view: memoryview) -> None:
        self._queue.put(view)

    def hexdigest(self) -> str:
        self.close()
        self._thread.join()
        return self._hash.hexdigest()

    def close(self) -> None:
        """Stop the worker (idempotent); an abandoned stream leaves no thread behind."""
        if self._thread.is_alive():
            self._queue.put(None)


class StagingBuffers:
    """Receive buffers kept from one update to the next.

    A fresh 200 MB buffer is ~50k page faults on first touch; on the VMs we measured, that took
    longer than the gRPC transfer itself. A kept buffer is already mapped. At most `keep` are
    kept (one per stream received at once); a borrower beyond that gets a fresh one.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    @contextmanager
    def borrow(self) -> Iterator[Callable[[int], bytearray]]:
        """An allocator for one update: a kept buffer when the size fits; it is kept again after the update."""
        with self._lock:
            held = self._free.pop() if self._free else None

        def allocate(size: int) -> bytearray:
            nonlocal held
            if held is None or len(held) != size:
                held = bytearray(size)
            return held

        try:
            yield allocate
        finally:
            with self._lock:
                if held is not None and len(self._free) < self._keep:
                    self._free.append(held)


class WeightAssembler:
    """Receives a weight stream and checks it against the engine's specs before anything is applied.

    `allocate(size)` gives the buffer the bytes are received into (see StagingBuffers); the
    tensors `finish` returns are views into it.
    """

    def __init__(self, specs: Specs, loaded_version: int, allocate: Callable[[int], bytearray] = bytearray) -> None:
        self.specs = specs
        self.loaded_version = loaded_version
        self.header: rollout_pb2.WeightHeader | None = None
        self._allocate = allocate
        self.buffer = bytearray()
        self.offset = 0
        self.hash: PipelinedSha256 | None = None

    def feed(self, chunk: StreamMessage) -> None:
        """One message of the stream: a WeightChunk, or a data chunk's bytes as `decode_chunk` gives them."""
        if isinstance(chunk, memoryview):
            if self.header is None:
                raise WeightUpdateError("data arrived before the header; the first message must be the header")
            self._accept_data(chunk)
            return
        kind = chunk.WhichOneof("kind")
        if kind == "header":
            if self.header is not None:
                raise WeightUpdateError("a second header arrived; send exactly one header, first")
            self._accept_header(chunk.header)
        elif kind == "data":
            if self.header is None:
                raise WeightUpdateError("data arrived before the header; the first message must be the header")
            self._accept_data(chunk.data)
        else:
            raise WeightUpdateError("empty WeightChunk: set either header or data")

    def _accept_header(self, header: rollout_pb2.WeightHeader) -> None:
        if header.version <= self.loaded_version:
            raise WeightUpdateError(
                f"version {header.version} is not newer than the loaded version {self.loaded_version}",
                precondition=True,
            )
        got = {t.name: (t.dtype, tuple(t.shape)) for t in header.tensors}
        if len(got) != len(header.tensors):
            raise WeightUpdateError("the header names a tensor twice")
        missing, extra = sorted(set(self.specs) - set(got)), sorted(set(got) - set(self.specs))
        if missing or extra:
            raise WeightUpdateError(f"tensor names differ from the model's: missing {missing[:5]}, unknown {extra[:5]}")
        for name, (dtype, shape) in self.specs.items():
            sent_dtype, sent_shape = got[name]
            if sent_shape != shape:
                raise WeightUpdateError(f"tensor {name}: got shape {list(sent_shape)}, the model has {list(shape)}")
            # A bf16 replica takes an fp32 trainer's weights: the engine casts when it copies them in.
            if sent_dtype != dtype and not {sent_dtype, dtype} <= FLOAT_DTYPES:
                raise WeightUpdateError(f"tensor {name}: got dtype {sent_dtype}, the model has {dtype}")
        expected = sum(nbytes(*got[t.name]) for t in header.tensors)
        if header.total_bytes != expected:
            raise WeightUpdateError(f"header total_bytes {header.total_bytes} != {expected} implied by the tensors")
        if len(header.sha256) != 64:
            raise WeightUpdateError("header sha256 must be a 64-character hex digest")
        self.header = header
        self.buffer = self._allocate(expected)
        self.hash = PipelinedSha256()

    def _accept_data(self, data: bytes | memoryview) -> None:
        end = self.offset + len(data)
        if end > len(self.buffer):
            raise WeightUpdateError(f"stream is longer than the header's total_bytes {len(self.buffer)}")
        self.buffer[self.offset : end] = data
        assert self.hash is not None  # set with the header
        self.hash.update(memoryview(self.buffer)[self.offset : end])
        self.offset = end

    def finish(self) -> tuple[int, str, dict[str, torch.Tensor]]:
        """(version, checksum, tensors) once the whole stream has arrived and checked out."""
        import torch

        if self.header is None:
            raise WeightUpdateError("the stream had no header")
        if self.offset != len(self.buffer):
            raise WeightUpdateError(f"stream truncated: got {self.offset} of {len(self.buffer)} bytes")
        assert self.hash is not None  # set with the header
        digest = self.hash.hexdigest()
        if digest != self.header.sha256:
            raise WeightUpdateError(
                f"sha256 mismatch: the bytes hash to {digest}, the header says {self.header.sha256}"
            )
        tensors: dict[str, torch.Tensor] = {}
        offset = 0
        for spec in self.header.tensors:
            size = nbytes(spec.dtype, spec.shape)
            if size:
                flat = torch.frombuffer(self.buffer, dtype=torch.uint8, count=size, offset=offset)
                tensors[spec.name] = flat.view(to_torch_dtype(spec.dtype)).reshape(tuple(spec.shape))
            else:
                tensors[spec.name] = torch.empty(tuple(spec.shape), dtype=to_torch_dtype(spec.dtype))
            offset += size
        return self.header.version, digest, tensors

    def close(self) -> None:
        """Release the hashing thread of a stream that will not be finished (rejected, cancelled)."""
        if self.hash is not None:
            self.hash.close()


def assemble(chunks: Iterable[StreamMessage], specs: Specs, loaded_version: int) -> tuple[int, str, dict]:
    assembler = WeightAssembler(specs, loaded_version)
    try:
        for chunk in chunks:
            assembler.feed(chunk)
        return assembler.finish()
    finally:
        assembler.close()


def push_weights(
    address: str,
    tensors: Mapping[str, torch.Tensor],
    version: int,
    token: str | None = None,
    timeout_s: float = 120.0,
    chunk_bytes: int = CHUNK_BYTES,
    checksum: str | None = None,
    ca_file: str | None = None,
) -> rollout_pb2.UpdateWeightsResponse:
    """Stream `tensors` as `version` to the rollout replica at `address` (TLS when `ca_file` is set);
    raises grpc.RpcError on rejection."""
    start = time.monotonic()
    with make_channel(address, ca_file) as channel:
        update = channel.stream_unary(
            UPDATE_WEIGHTS_METHOD,
            request_serializer=None,  # the messages are already wire bytes
            response_deserializer=rollout_pb2.UpdateWeightsResponse.FromString,
        )
        messages = iter_wire_messages(tensors, version, chunk_bytes, checksum)
        remaining = max(timeout_s - (time.monotonic() - start), 1.0)
        return update(messages, timeout=remaining, metadata=bearer_metadata(token))
