"""The replica's receive path for weight updates: staging, checking, version order, then the swap.

Whatever transport carries the bytes (grpo.common.weight_transport), an update is received into a
staging buffer without any lock, checked whole (specs, size, sha256) by a WeightAssembler, and only
then applied, under the update lock (one at a time, newer versions only) through the `load` callback,
which holds the generation lock for the copy: no sample mixes two versions, and a bad update leaves
the old weights serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from grpo.common.weight_broadcast import BroadcastMember, BroadcastSource, Invitation
from grpo.common.weight_data_port import DataPortSource, WeightDataPort
from grpo.common.weight_receiver import StagingBuffers, StreamMessage, WeightAssembler
from grpo.common.weight_relay import ReplicaRelay
from grpo.common.weight_transport import StreamSource, WeightSource
from grpo.common.weights import Specs, WeightUpdateError
from grpo.rollout.stats import Metrics

log = logging.getLogger(__name__)

# Weight streams received at once: a stalled one must not block the next push, and memory stays bounded.
MAX_WEIGHT_STREAMS = 2


class UpdateBusy(RuntimeError):
    """The update could not start or apply now (another one holds the slot or the lock); retrying may work."""


@dataclass(frozen=True)
class UpdateResult:
    version: int
    checksum: str
    receive_s: float
    apply_s: float


class Received(NamedTuple):
    """A checked weight update, not yet applied."""

    version: int
    checksum: str
    tensors: dict[str, Any]  # views into the staging buffer
    size: int


class WeightUpdates:
    """Receives, checks and applies weight updates for one engine.

    `loaded()` is the version being served; `load(version, checksum, tensors)` swaps new weights in
    between generation calls. The replica's data port, when it has one, is `data_port`.
    """

    def __init__(
        self,
        specs: Specs,
        loaded: Callable[[], int],
        load: Callable[[int, str, dict[str, Any]], None],
        metrics: Metrics,
    ) -> None:
        self.specs = specs
        self._loaded = loaded
        self._load = load
        self.metrics = metrics
        self.data_port: WeightDataPort | None = None  # set by __main__ unless turned off
        self._update_lock = threading.Lock()  # version check + apply, one update at a time
        # Each update being received holds a model-sized buffer: a few at once, never unbounded.
        self._receive_slots = threading.BoundedSemaphore(MAX_WEIGHT_STREAMS)
        self._staging = StagingBuffers(keep=MAX_WEIGHT_STREAMS)
        self.broadcast = BroadcastMember()  # the trainer's broadcast group, once an update invites us

    def source(self, data_token: str | None, broadcast: str | None = None) -> WeightSource:
        """Where an UpdateWeights call's bytes come from: the broadcast its invitation names, the data port
        connection its token names, or its stream. WeightUpdateError when the invitation is malformed."""
        if broadcast:
            return BroadcastSource(self.broadcast, Invitation.parse(broadcast))
        return DataPortSource(self.data_port, data_token) if data_token else StreamSource()

    def update(
        self,
        messages: Iterable[StreamMessage],
        source: WeightSource,
        lock_timeout_s: float = 60.0,
        data_timeout_s: float = 300.0,
        relay: ReplicaRelay | None = None,
    ) -> UpdateResult:
        """Receive a whole update from `source` (the call's `messages` hold the header, and the bytes when they
        come in the stream), check it, then swap it in between generation calls.

        The bytes are received without the update lock, so a stalled pusher cannot block the next one (the
        caller bounds the stream; `data_timeout_s` bounds a side channel); only the version check and the
        apply are serialised. Raises WeightUpdateError (the old weights keep serving) when the update is bad,
        UpdateBusy when another update keeps the lock past `lock_timeout_s` or too many are being received.

        With a `relay` the buffer is forwarded to the relay's hops as it fills, whatever becomes of this
        replica's own apply, and kept until they have all answered.
        """
        start = time.monotonic()
        if not self._receive_slots.acquire(blocking=False):
            self.metrics.updates.labels("busy").inc()
            source.abandon()
            if relay is not None:
                relay.join()  # nothing to forward: the sender sees no subtree results and re-routes
            raise UpdateBusy(f"{MAX_WEIGHT_STREAMS} weight streams are already being received; retry later")
        with self._staging.borrow() as allocate:  # the received tensors are views into its buffer until applied
            try:
                try:
                    got = self._receive(messages, source, allocate, start + data_timeout_s, relay)
                finally:
                    self._receive_slots.release()
                received = time.monotonic()
                version, checksum, size = got.version, got.checksum, got.size
                self._apply(version, checksum, got.tensors, lock_timeout_s)
                del got  # its tensors are views into the buffer: dropped before it goes back for the next update
            finally:
                if relay is not None:
                    relay.join()
        applied = time.monotonic()
        self.metrics.updates.labels("ok").inc()
        self.metrics.update_bytes.labels(source.via).inc(size)
        self.metrics.version.set(version)
        self.metrics.update_seconds.observe(applied - start)
        log.info(
            "weights v%d loaded (%s) via %s: receive %.3fs, apply %.3fs",
            version,
            checksum[:12],
            source.via,
            received - start,
            applied - received,
        )
        return UpdateResult(version, checksum, received - start, applied - received)

    def _receive(
        self,
        messages: Iterable[StreamMessage],
        source: WeightSource,
        allocate: Callable[[int], bytearray],
        deadline: float,
        relay: ReplicaRelay | None = None,
    ) -> Received:
        if relay is None:
            assembler = WeightAssembler(self.specs, self._loaded(), allocate)  # an older version fails at the header
        else:
            # A relaying replica takes in the whole update even when it holds a newer version (its children may
            # not): the version is checked at the apply instead, under the update lock, as always.
            assembler = WeightAssembler(self.specs, -1, allocate, on_progress=relay.payload.progress)
            messages = relay.payload.watch(messages)
        try:
            source.fill(assembler, messages, deadline)
            version, checksum, tensors = assembler.finish()
            return Received(version, checksum, tensors, len(assembler.buffer))
        except WeightUpdateError as exc:
            self.metrics.updates.labels("rejected").inc()
            log.warning("weight update rejected: %s", exc)
            raise
        finally:
            assembler.close()
            if relay is not None:
                relay.payload.end()

    def _apply(self, version: int, checksum: str, tensors: dict[str, Any], lock_timeout_s: float) -> None:
        if not self._update_lock.acquire(timeout=lock_timeout_s):
            self.metrics.updates.labels("busy").inc()
            raise UpdateBusy(f"another weight update is in progress (waited {lock_timeout_s:.0f}s); retry later")
        try:
            # Checked again under the lock: a concurrent update may have applied this version or a newer one.
            loaded = self._loaded()
            if version <= loaded:
                self.metrics.updates.labels("rejected").inc()
                raise WeightUpdateError(
                    f"version {version} is not newer than the loaded version {loaded}", precondition=True
                )
            self._load(version, checksum, tensors)
        finally:
            self._update_lock.release()

    def close(self) -> None:
        if self.data_port is not None:
            self.data_port.close()
