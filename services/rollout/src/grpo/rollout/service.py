"""The rollout service's core: one engine, a lock that keeps weight updates between generation calls, stats.

The gRPC servicer and the Redis worker (grpo.rollout.worker) both call this object in-process.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from grpo.common.weight_data_port import WeightDataPort, expect_end, reader
from grpo.common.weight_receiver import StagingBuffers, StreamMessage, WeightAssembler
from grpo.common.weights import WeightUpdateError
from grpo.rollout.engines.base import Engine, PromptOutput, SamplingParams

log = logging.getLogger(__name__)

# Throughput is reported over the generation calls of the last minute.
RATE_WINDOW_S = 60.0
# Weight streams received at once: a stalled one must not block the next push, and memory stays bounded.
MAX_WEIGHT_STREAMS = 2


class UpdateBusy(RuntimeError):
    """The update could not start or apply now (another one holds the slot or the lock); retrying may work."""


@dataclass(frozen=True)
class Limits:
    max_prompts: int = 256
    max_n: int = 64
    max_new_tokens_cap: int = 4096


@dataclass(frozen=True)
class UpdateResult:
    version: int
    checksum: str
    receive_s: float
    apply_s: float


class Received(NamedTuple):
    """A checked weight stream, not yet applied."""

    version: int
    checksum: str
    tensors: dict[str, Any]  # views into the staging buffer
    via: str  # "data_port" or "stream"
    size: int


@dataclass(frozen=True)
class Status:
    replica_id: str
    model: str
    engine: str
    weight_version: int
    weight_checksum: str
    tasks_done: int
    tasks_failed: int
    tokens_generated: int
    tokens_per_s: float
    busy: int
    weights_data_port: int


class Metrics:
    """Prometheus metrics in a registry of their own (several services can share a process in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.tokens = Counter("grpo_rollout_generated_tokens", "Completion tokens generated", registry=r)
        self.requests = Counter("grpo_rollout_generate_requests", "Generate calls", ["source"], registry=r)
        self.latency = Histogram(
            "grpo_rollout_generate_seconds",
            "Wall time of a generation call, lock wait included",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.updates = Counter("grpo_rollout_weight_updates", "Weight updates", ["result"], registry=r)
        self.update_bytes = Counter(
            "grpo_rollout_weight_update_bytes", "Bytes of applied weight updates, by the path they came", ["via"],
            registry=r,
        )  # fmt: skip
        self.update_seconds = Histogram("grpo_rollout_weight_update_seconds", "Receive + apply time", registry=r)
        self.version = Gauge("grpo_rollout_weight_version", "Loaded weight version", registry=r)
        self.tasks = Counter("grpo_rollout_tasks", "Worker tasks", ["result"], registry=r)


class RolloutService:
    """Owns the engine; `generate` and `update_weights` never overlap, so no sample mixes two versions."""

    def __init__(self, engine: Engine, model: str, replica_id: str = "local", limits: Limits | None = None) -> None:
        self.engine = engine
        self.model = model
        self.replica_id = replica_id
        self.limits = limits or Limits()
        self.specs = engine.weight_specs()
        self.version = 0
        self.checksum = engine.weights_checksum()
        self.metrics = Metrics()
        self.grpc_port = 0  # set by __main__ once bound: the worker registers it
        self.data_port: WeightDataPort | None = None  # set by __main__ unless turned off
        self._gen_lock = threading.Lock()  # engine calls: generate / load_weights
        self._update_lock = threading.Lock()  # version check + apply, one update at a time
        # Each stream being received holds a model-sized buffer: a few at once, never unbounded.
        self._receive_slots = threading.BoundedSemaphore(MAX_WEIGHT_STREAMS)
        self._staging = StagingBuffers(keep=MAX_WEIGHT_STREAMS)
        self._stats_lock = threading.Lock()
        self._recent: collections.deque[tuple[float, int, float]] = collections.deque()
        self.tokens_generated = 0
        self.tasks_done = 0
        self.tasks_failed = 0
        self.busy = 0
        log.info("rollout service: model %s, engine %s, checksum %s", model, engine.name, self.checksum[:12])

    @property
    def tokenizer(self) -> Any:  # a transformers tokenizer
        return self.engine.tokenizer

    def encode(self, prompt: str | list[dict[str, str]], chat: bool = False) -> list[int]:
        """Token ids of a text prompt or a message list; messages always go through the chat template."""
        if isinstance(prompt, str) and not chat:
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, source: str = "grpc"
    ) -> tuple[list[PromptOutput], int, str]:
        """(outputs, weight version, checksum): every sample comes from that one version."""
        start = time.monotonic()
        with self._stats_lock:
            self.busy += 1
        try:
            with self._gen_lock:
                outputs = self.engine.generate(prompts, params)
                version, checksum = self.version, self.checksum
        finally:
            with self._stats_lock:
                self.busy -= 1
        wall = time.monotonic() - start
        tokens = sum(len(s.token_ids) for o in outputs for s in o.samples)
        self._record(tokens, wall, source)
        return outputs, version, checksum

    def _record(self, tokens: int, wall: float, source: str) -> None:
        now = time.monotonic()
        with self._stats_lock:
            self.tokens_generated += tokens
            self._recent.append((now, tokens, wall))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
        self.metrics.tokens.inc(tokens)
        self.metrics.requests.labels(source).inc()
        self.metrics.latency.observe(wall)

    def tokens_per_s(self) -> float:
        with self._stats_lock:
            tokens = sum(t for _, t, _ in self._recent)
            wall = sum(w for _, _, w in self._recent)
        return tokens / wall if wall > 0 else 0.0

    def record_task(self, ok: bool) -> None:
        """Called by the worker loop after each task."""
        with self._stats_lock:
            if ok:
                self.tasks_done += 1
            else:
                self.tasks_failed += 1
        self.metrics.tasks.labels("done" if ok else "failed").inc()

    def update_weights(
        self,
        chunks: Iterable[StreamMessage],
        lock_timeout_s: float = 60.0,
        data_timeout_s: float = 300.0,
        data_token: str | None = None,
    ) -> UpdateResult:
        """Receive a whole stream, check it, then swap it in between generation calls.

        With `data_token` the bytes come first, over the data port connection that opened with that token
        (within `data_timeout_s`), and `chunks` holds only the header. The stream is received without the
        update lock, so a stalled pusher cannot block the next one (the caller bounds the stream); only the
        version check and the apply are serialised. Raises WeightUpdateError (the old weights keep serving)
        when the stream is bad, UpdateBusy when another update keeps the lock past `lock_timeout_s` or too
        many streams are being received.
        """
        start = time.monotonic()
        if not self._receive_slots.acquire(blocking=False):
            self.metrics.updates.labels("busy").inc()
            if data_token and self.data_port is not None:
                self.data_port.discard(data_token)
            raise UpdateBusy(f"{MAX_WEIGHT_STREAMS} weight streams are already being received; retry later")
        with self._staging.borrow() as allocate:  # the received tensors are views into its buffer until applied
            try:
                got = self._receive(chunks, allocate, data_token, start + data_timeout_s)
            finally:
                self._receive_slots.release()
            received = time.monotonic()
            version, checksum, via, size = got.version, got.checksum, got.via, got.size
            self._apply(version, checksum, got.tensors, lock_timeout_s)
            del got  # its tensors are views into the buffer: dropped before it goes back for the next update
        applied = time.monotonic()
        self.metrics.updates.labels("ok").inc()
        self.metrics.update_bytes.labels(via).inc(size)
        self.metrics.version.set(version)
        self.metrics.update_seconds.observe(applied - start)
        log.info(
            "weights v%d loaded (%s) via %s: receive %.3fs, apply %.3fs",
            version,
            checksum[:12],
            via,
            received - start,
            applied - received,
        )
        return UpdateResult(version, checksum, received - start, applied - received)

    def _apply(self, version: int, checksum: str, tensors: dict[str, Any], lock_timeout_s: float) -> None:
        if not self._update_lock.acquire(timeout=lock_timeout_s):
            self.metrics.updates.labels("busy").inc()
            raise UpdateBusy(f"another weight update is in progress (waited {lock_timeout_s:.0f}s); retry later")
        try:
            # Checked again under the lock: a concurrent stream may have applied this version or a newer one.
            if version <= self.version:
                self.metrics.updates.labels("rejected").inc()
                raise WeightUpdateError(
                    f"version {version} is not newer than the loaded version {self.version}", precondition=True
                )
            with self._gen_lock:
                self.engine.load_weights(tensors)
                self.version, self.checksum = version, checksum
        finally:
            self._update_lock.release()

    def _receive(
        self,
        chunks: Iterable[StreamMessage],
        allocate: Callable[[int], bytearray],
        data_token: str | None,
        deadline: float,
    ) -> Received:
        assembler = WeightAssembler(self.specs, self.version, allocate)  # an older version fails at the header
        try:
            if data_token:
                self._receive_from_data_port(assembler, data_token, deadline)
            for chunk in chunks:
                assembler.feed(chunk)
            version, checksum, tensors = assembler.finish()
            via = "data_port" if data_token else "stream"
            return Received(version, checksum, tensors, via, len(assembler.buffer))
        except WeightUpdateError as exc:
            self.metrics.updates.labels("rejected").inc()
            log.warning("weight update rejected: %s", exc)
            raise
        finally:
            assembler.close()

    def _receive_from_data_port(self, assembler: WeightAssembler, token: str, deadline: float) -> None:
        if self.data_port is None:
            raise WeightUpdateError("this replica has no weights data port: send the bytes in the stream")
        # The pusher connects before it starts the call, so its connection is here or about to be.
        wait = min(deadline - time.monotonic(), self.data_port.hello_timeout_s)
        try:
            conn, size = self.data_port.claim(token, max(wait, 0.0))
        except WeightUpdateError:
            self.data_port.discard(token)  # should it come after all
            raise
        with conn:
            assembler.receive(size, reader(conn, deadline))
            if assembler.offset == len(assembler.buffer):
                expect_end(conn)

    def status(self) -> Status:
        with self._stats_lock:
            done, failed, tokens, busy = self.tasks_done, self.tasks_failed, self.tokens_generated, self.busy
        return Status(
            replica_id=self.replica_id,
            model=self.model,
            engine=self.engine.name,
            weight_version=self.version,
            weight_checksum=self.checksum,
            tasks_done=done,
            tasks_failed=failed,
            tokens_generated=tokens,
            tokens_per_s=self.tokens_per_s(),
            busy=busy,
            weights_data_port=self.data_port.port if self.data_port is not None else 0,
        )

    def close(self) -> None:
        if self.data_port is not None:
            self.data_port.close()
        self.engine.close()


__all__ = ["Limits", "RolloutService", "Status", "UpdateBusy", "UpdateResult", "WeightUpdateError"]
