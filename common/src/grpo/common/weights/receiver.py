"""Weight transport, the receiving side: read a stream, verify it, hand the engine its tensors.

Nothing here touches the live weights: `WeightAssembler.finish` returns tensors only once the
whole stream has arrived and its sha256 matches the header (see grpo.common.weights.codec).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from grpo.common.weights.codec import DATA_TAG, FLOAT_DTYPES, Specs, WeightUpdateError, nbytes, to_torch_dtype
from grpo.v1 import rollout_pb2

if TYPE_CHECKING:
    import torch

# Bytes read from the data port are handed to the hashing thread in pieces of this size.
HASH_BYTES = 4 * 1024 * 1024
# What a receiver reads from the stream: a parsed WeightChunk, or a data chunk's bytes (`decode_chunk`).
StreamMessage = rollout_pb2.WeightChunk | memoryview


def decode_chunk(raw: bytes) -> StreamMessage:
    """A received message: a data chunk as a zero-copy view into `raw`, anything else parsed by protobuf."""
    if raw[:1] == DATA_TAG:
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
    tensors `finish` returns are views into it. `on_progress(self)` is called once the buffer exists and
    whenever `offset` moves (a relaying replica forwards the buffer as it fills: grpo.common.weights.relay).
    """

    def __init__(
        self,
        specs: Specs,
        loaded_version: int,
        allocate: Callable[[int], bytearray] = bytearray,
        on_progress: Callable[[WeightAssembler], None] | None = None,
    ) -> None:
        self.specs = specs
        self._on_progress = on_progress
        self.loaded_version = loaded_version
        self.header: rollout_pb2.WeightHeader | None = None
        self._allocate = allocate
        self.buffer = bytearray()
        self.offset = 0
        self.hash: PipelinedSha256 | None = None
        self.from_data_port = False  # the bytes came by `receive`, before the header

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
        if self.from_data_port and expected != len(self.buffer):
            raise WeightUpdateError(
                f"header total_bytes {expected} != the {len(self.buffer)} bytes sent to the data port"
            )
        self.header = header
        if not self.from_data_port:
            self.buffer = self._allocate(expected)
            self.hash = PipelinedSha256()
            self._progressed()

    def _accept_data(self, data: bytes | memoryview) -> None:
        if self.from_data_port:
            raise WeightUpdateError("the bytes came over the data port: the stream must hold only the header")
        end = self.offset + len(data)
        if end > len(self.buffer):
            raise WeightUpdateError(f"stream is longer than the header's total_bytes {len(self.buffer)}")
        self.buffer[self.offset : end] = data
        assert self.hash is not None  # set with the header
        self.hash.update(memoryview(self.buffer)[self.offset : end])
        self.offset = end
        self._progressed()

    def receive(self, size: int, read_into: Callable[[memoryview], int]) -> None:
        """`size` bytes read straight into the buffer by `read_into` (a socket's recv_into), hashed as they
        arrive; before the header, which is checked against them when it comes.

        Stops when the buffer is full or `read_into` returns 0 (end of stream: `finish` reports the truncation).
        """
        if self.header is not None or self.from_data_port:
            raise WeightUpdateError("the data port bytes must come before the header, once")
        # Any float tensor may arrive in another precision (up to 8 bytes an element): no update is larger.
        most = sum(nbytes("F64", shape) for _, shape in self.specs.values())
        if not 0 < size <= most:
            raise WeightUpdateError(f"the data port announced {size} bytes; this model's weights are 1 to {most}")
        self.from_data_port = True
        self.buffer = self._allocate(size)
        self.hash = PipelinedSha256()
        self._progressed()
        view = memoryview(self.buffer)
        hashed = self.offset
        while self.offset < len(self.buffer):
            got = read_into(view[self.offset :])
            if not got:
                break
            self.offset += got
            self._progressed()
            if self.offset - hashed >= HASH_BYTES:
                self.hash.update(view[hashed : self.offset])
                hashed = self.offset
        if hashed < self.offset:
            self.hash.update(view[hashed : self.offset])

    def _progressed(self) -> None:
        if self._on_progress is not None:
            self._on_progress(self)

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
        check_finite(tensors)
        return self.header.version, digest, tensors

    def close(self) -> None:
        """Release the hashing thread of a stream that will not be finished (rejected, cancelled)."""
        if self.hash is not None:
            self.hash.close()


def check_finite(tensors: dict[str, torch.Tensor]) -> None:
    """WeightUpdateError naming the first floating tensor with a NaN or an infinity.

    The sha256 only proves the bytes are the ones sent: a trainer that diverged sends NaNs faithfully, and a
    replica that loaded them would stay ready while every sample came out as EOS with a NaN log-prob. Every
    transport (stream, data port, broadcast, relay) ends in `finish`, so this one check covers them all."""
    import torch

    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise WeightUpdateError(f"tensor {name} has {bad} non-finite value(s) (NaN or infinity)")


def assemble(chunks: Iterable[StreamMessage], specs: Specs, loaded_version: int) -> tuple[int, str, dict]:
    assembler = WeightAssembler(specs, loaded_version)
    try:
        for chunk in chunks:
            assembler.feed(chunk)
        return assembler.finish()
    finally:
        assembler.close()
