"""The replica's receive path for weight updates: staging, checking, version order, then the swap.

Whatever transport carries the bytes (grpo.common.weights), an update is received into a
staging buffer without any lock, checked whole (specs, size, sha256) by a WeightAssembler, and only
then applied, under the update lock (one at a time, newer versions only) through the `load` callback,
which holds the generation lock for the copy: no sample mixes two versions, and a bad update leaves
the old weights serving. An update holds its buffer until it is applied or given up, so at most
MAX_WEIGHT_STREAMS buffers exist at once; one waiting for the engine gives up as soon as its caller has.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from grpo.common.weights.base import WeightSource
from grpo.common.weights.broadcast import BroadcastMember, BroadcastSource, Invitation
from grpo.common.weights.codec import Specs, WeightUpdateError
from grpo.common.weights.data_port import DataPortSource, WeightDataPort
from grpo.common.weights.receiver import StagingBuffers, StreamMessage, WeightAssembler
from grpo.common.weights.relay import ReplicaRelay
from grpo.common.weights.stream import StreamSource
from grpo.rollout.stats import Metrics

log = logging.getLogger(__name__)

# Updates in hand at once (being received, or received and waiting to apply): a stalled one must not block the
# next push, and each holds a model-sized buffer, so memory stays bounded.
MAX_WEIGHT_STREAMS = 2
# How often an update waiting for a lock checks that its caller still wants it.
WAIT_POLL_S = 0.1


class UpdateBusy(RuntimeError):
    """The update could not start or apply now (another one holds the slot or the lock); retrying may work."""


class UpdateAbandoned(UpdateBusy):
    """The caller went away (cancelled, or past its deadline) before the update could be applied."""


def _always() -> bool:
    return True


def acquire(lock: Any, timeout_s: float, wanted: Callable[[], bool]) -> bool:
    """`lock.acquire(timeout=timeout_s)`, given up early (False) once `wanted()` is false."""
    deadline = time.monotonic() + timeout_s
    while not lock.acquire(timeout=max(0.0, min(WAIT_POLL_S, deadline - time.monotonic()))):
        if not wanted() or time.monotonic() >= deadline:
            return False
    return True


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
        engine_lock: Any = None,
    ) -> None:
        self.specs = specs
        self._loaded = loaded
        self._load = load
        self.metrics = metrics
        # The (reentrant) lock `load` takes for the copy, when it has one: waited for here, where the wait can
        # be given up when the caller goes away, so that `load` then takes it at once.
        self._engine_lock = engine_lock
        self.data_port: WeightDataPort | None = None  # set by __main__ unless turned off
        self._update_lock = threading.Lock()  # version check + apply, one update at a time
        # Each update in hand holds a model-sized buffer from its first byte until it is applied or given up.
        self._slots = threading.BoundedSemaphore(MAX_WEIGHT_STREAMS)
        # One buffer is kept between updates (the README's "one copy of the weights as sent"); a second update
        # in hand at the same time gets a fresh one, freed when it is done.
        self._staging = StagingBuffers(keep=1)
        self._pending: list[int] = []  # versions received and waiting to apply
        self._pending_lock = threading.Lock()
        self.broadcast = BroadcastMember()  # the trainer's broadcast group, once an update invites us
        self.refusal: str | None = None  # why this replica takes no update at all (a colocated one: its trainer's)

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
        wanted: Callable[[], bool] = _always,
    ) -> UpdateResult:
        """Receive a whole update from `source` (the call's `messages` hold the header, and the bytes when they
        come in the stream), check it, then swap it in between generation calls.

        The bytes are received without the update lock, so a stalled pusher cannot block the next one (the
        caller bounds the stream; `data_timeout_s` bounds a side channel); only the version check and the
        apply are serialised. Raises WeightUpdateError (the old weights keep serving) when the update is bad,
        UpdateBusy when another update keeps the lock past `lock_timeout_s` or too many are in hand, and
        UpdateAbandoned when `wanted()` turns false (the caller went away) before the apply began.

        With a `relay` the buffer is forwarded to the relay's hops as it fills, whatever becomes of this
        replica's own apply, and kept until they have all answered.
        """
        start = time.monotonic()
        if self.refusal is not None:
            source.abandon()
            if relay is not None:
                relay.join()
            self.metrics.updates.labels("rejected").inc()
            raise WeightUpdateError(self.refusal, precondition=True)
        if not self._slots.acquire(blocking=False):
            self.metrics.updates.labels("busy").inc()
            source.abandon()
            if relay is not None:
                relay.join()  # nothing to forward: the sender sees no subtree results and re-routes
            raise UpdateBusy(
                f"{MAX_WEIGHT_STREAMS} weight updates are already being received or waiting to apply; retry later"
            )
        self.metrics.updates_in_hand.inc()
        try:
            # The slot is held until the buffer is given back: an update waiting for the engine holds one too.
            with self._staging.borrow() as allocate:  # the received tensors are views into its buffer until applied
                try:
                    got = self._receive(messages, source, allocate, start + data_timeout_s, relay)
                    received = time.monotonic()
                    version, checksum, size = got.version, got.checksum, got.size
                    self._apply(version, checksum, got.tensors, lock_timeout_s, wanted)
                    del got  # its tensors are views into the buffer: dropped before it goes back for the next update
                finally:
                    if relay is not None:
                        relay.join()
        finally:
            self.metrics.updates_in_hand.dec()
            self._slots.release()
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

    def _apply(
        self, version: int, checksum: str, tensors: dict[str, Any], lock_timeout_s: float, wanted: Callable[[], bool]
    ) -> None:
        self._check_newer(version)  # before any wait: an update that cannot apply gives its buffer back at once
        with self._pending_lock:
            self._pending.append(version)
        try:
            with self._locked(self._update_lock, lock_timeout_s, wanted, "another weight update is in progress"):
                # Checked again under the lock: a concurrent update may have applied this version or a newer one.
                self._check_newer(version)
                with self._locked(self._engine_lock, lock_timeout_s, wanted, "a generation call holds the engine"):
                    try:
                        self._load(version, checksum, tensors)
                    except Exception:
                        self.metrics.updates.labels("failed").inc()
                        raise
        finally:
            with self._pending_lock:
                self._pending.remove(version)

    def _check_newer(self, version: int) -> None:
        """WeightUpdateError (FAILED_PRECONDITION) unless `version` is newer than the loaded one and than any
        update waiting to apply (which would make this one stale the moment it landed)."""
        loaded = self._loaded()
        with self._pending_lock:
            waiting = max(self._pending, default=-1)
        if version <= loaded or version < waiting:
            self.metrics.updates.labels("rejected").inc()
            newer = f"the loaded version {loaded}" if version <= loaded else f"version {waiting}, waiting to apply"
            raise WeightUpdateError(f"version {version} is not newer than {newer}", precondition=True)

    @contextmanager
    def _locked(self, lock: Any, timeout_s: float, wanted: Callable[[], bool], holder: str) -> Iterator[None]:
        """Hold `lock` (nothing when None), waiting at most `timeout_s` and only while `wanted()`."""
        if lock is None:
            yield
            return
        if not acquire(lock, timeout_s, wanted):
            if not wanted():
                self.metrics.updates.labels("abandoned").inc()
                raise UpdateAbandoned(f"the caller went away while {holder}; the update is dropped")
            self.metrics.updates.labels("busy").inc()
            raise UpdateBusy(f"{holder} (waited {timeout_s:.0f}s); retry later")
        try:
            yield
        finally:
            lock.release()

    def close(self) -> None:
        if self.data_port is not None:
            self.data_port.close()
