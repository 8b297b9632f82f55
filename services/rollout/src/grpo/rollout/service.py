"""The rollout service's core: one engine and the lock that keeps weight swaps between generation calls.

The gRPC servicer and the Redis worker (grpo.rollout.worker, wired to it in grpo.rollout.worker_wiring) both call
this object in-process. Weight updates are received and checked by `updates` (grpo.rollout.weight_updates), which
swaps them in through `load_weights`; counters live in `stats` and `metrics` (grpo.rollout.stats). An engine copy
that fails part-way leaves the replica `broken` (mixed weights): it refuses to generate until a complete update, and
says so through `on_whole` (__main__ sets the gRPC health status with it).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from grpo.common.prompts import encode_prompt
from grpo.common.weights.codec import WeightUpdateError
from grpo.common.weights.data_port import WeightDataPort
from grpo.rollout.engines.base import Engine, GenerationCancelled, PromptOutput, SamplingParams, always
from grpo.rollout.stats import GenerationStats, Metrics
from grpo.rollout.weight_updates import UpdateBusy, UpdateResult, WeightUpdates, acquire

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    max_prompts: int = 256
    max_n: int = 64
    max_new_tokens_cap: int = 4096


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


class WeightsBroken(RuntimeError):
    """The live weights are a mix of two versions (a copy failed part-way): nothing is generated from them."""


class RolloutService:
    """Owns the engine; `generate` and `load_weights` never overlap, so no sample mixes two versions."""

    def __init__(self, engine: Engine, model: str, replica_id: str = "local", limits: Limits | None = None) -> None:
        self.engine = engine
        self.model = model
        self.replica_id = replica_id
        self.limits = limits or Limits()
        self.version = 0
        self.checksum = engine.weights_checksum()
        self.broken: str | None = None  # why the live weights are mixed, after a copy failed part-way
        self.on_whole: Callable[[bool], None] | None = None  # told when `broken` is set (False) or cleared (True)
        self.metrics = Metrics()
        self.stats = GenerationStats(self.metrics)
        # Engine calls: generate / load_weights. Reentrant: an update waits for it (giving up when its caller
        # does) before calling load_weights, which takes it again.
        self._gen_lock = threading.RLock()
        self.updates = WeightUpdates(
            engine.weight_specs(), lambda: self.version, self.load_weights, self.metrics, engine_lock=self._gen_lock
        )
        self.grpc_port = 0  # set by __main__ once bound: the worker registers it
        log.info("rollout service: model %s, engine %s, checksum %s", model, engine.name, self.checksum[:12])

    @property
    def data_port(self) -> WeightDataPort | None:
        """The weights data port (set by __main__ unless turned off); updates read from it."""
        return self.updates.data_port

    @data_port.setter
    def data_port(self, port: WeightDataPort | None) -> None:
        self.updates.data_port = port

    @property
    def tokenizer(self) -> Any:  # a transformers tokenizer
        return self.engine.tokenizer

    def encode(self, prompt: str | list[dict[str, str]], chat: bool = False) -> list[int]:
        """Token ids of a text prompt or a message list (grpo.common.prompts.encode_prompt)."""
        return encode_prompt(self.tokenizer, prompt, chat)

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        source: str = "grpc",
        wanted: Callable[[], bool] = always,
    ) -> tuple[list[PromptOutput], int, str]:
        """(outputs, weight version, checksum): every sample comes from that one version.

        Raises GenerationCancelled once `wanted()` is false (the caller went away): while waiting for the engine,
        or during the engine's call, so that abandoned calls do not queue up holding it."""
        start = time.monotonic()
        self.stats.started()
        try:
            if not wanted() or not acquire(self._gen_lock, float("inf"), wanted):
                raise GenerationCancelled("the caller went away while waiting for the engine")
            try:
                if self.broken is not None:
                    raise WeightsBroken(f"replica {self.replica_id} is not serving: {self.broken}")
                outputs = self.engine.generate(prompts, params, wanted)
                version, checksum = self.version, self.checksum
            finally:
                self._gen_lock.release()
        finally:
            self.stats.ended()
        tokens = sum(len(s.token_ids) for o in outputs for s in o.samples)
        self.stats.record(tokens, time.monotonic() - start, source)
        return outputs, version, checksum

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No generation while inside (a call in progress is waited for): a colocated trainer updates the weights
        this engine reads in place (grpo.trainer.colocated), and tells the new version before leaving."""
        with self._gen_lock:
            yield

    def load_weights(self, version: int, checksum: str, tensors: dict[str, Any]) -> None:
        """Swap checked weights in between generation calls (WeightUpdates calls this, in version order).

        Raises WeightsBroken when the engine's copy fails: it copies tensor by tensor, so some may already hold
        the new version. The replica then refuses to generate until a complete update succeeds."""
        with self._gen_lock:
            try:
                self.engine.load_weights(tensors)
            except Exception as exc:
                self.broken = (
                    f"the copy of weight version {version} failed part-way ({type(exc).__name__}: {exc}); the "
                    f"weights may mix it with version {self.version} until a complete update is applied"
                )
                self.metrics.weights_broken.set(1)
                log.error("weights broken: %s", self.broken)
                self._tell_whole(False)
                raise WeightsBroken(self.broken) from exc
            self.version, self.checksum = version, checksum
            was_broken, self.broken = self.broken is not None, None
            self.metrics.weights_broken.set(0)
            if was_broken:
                log.info("weights whole again at version %d", version)
                self._tell_whole(True)

    def _tell_whole(self, whole: bool) -> None:
        if self.on_whole is not None:
            try:
                self.on_whole(whole)
            except Exception:  # a listener's failure must not turn an applied update into a failed one
                log.exception("telling that the weights are %s failed", "whole" if whole else "broken")

    def record_task(self, ok: bool) -> None:
        """Called by the worker loop after each task."""
        self.stats.record_task(ok)

    def status(self) -> Status:
        done, failed, tokens, busy = self.stats.snapshot()
        return Status(
            replica_id=self.replica_id,
            model=self.model,
            engine=self.engine.name,
            weight_version=self.version,
            weight_checksum=self.checksum,
            tasks_done=done,
            tasks_failed=failed,
            tokens_generated=tokens,
            tokens_per_s=self.stats.tokens_per_s(),
            busy=busy,
            weights_data_port=self.data_port.port if self.data_port is not None else 0,
        )

    def close(self) -> None:
        self.updates.close()
        self.engine.close()


__all__ = [
    "GenerationCancelled",
    "Limits",
    "RolloutService",
    "Status",
    "UpdateBusy",
    "UpdateResult",
    "WeightUpdateError",
    "WeightsBroken",
]
