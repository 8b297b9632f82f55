"""The rollout service's counters: Prometheus metrics, the numbers GetStatus reports (tokens/s, tasks, busy) and
the worker loop's events."""

from __future__ import annotations

import collections
import threading
import time
import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Throughput is reported over the generation calls of the last minute.
RATE_WINDOW_S = 60.0
WORKER_OUTCOMES = ("done", "failed", "reclaimed", "dropped", "invalid", "redis_errors")


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
        self.relayed_bytes = Counter(
            "grpo_rollout_weight_relay_bytes", "Bytes of weight updates this replica passed on (relay fan-out)",
            registry=r,
        )  # fmt: skip
        self.updates_in_hand = Gauge(
            "grpo_rollout_weight_updates_in_hand",
            "Weight updates being received or waiting to apply, each holding a model-sized buffer",
            registry=r,
        )
        self.weights_broken = Gauge(
            "grpo_rollout_weights_broken", "1 while a weight copy that failed part-way leaves mixed weights", registry=r
        )
        self.update_seconds = Histogram("grpo_rollout_weight_update_seconds", "Receive + apply time", registry=r)
        self.version = Gauge("grpo_rollout_weight_version", "Loaded weight version", registry=r)
        self.tasks = Counter("grpo_rollout_tasks", "Worker tasks", ["result"], registry=r)


class GenerationStats:
    """Tokens, tasks and calls in progress, for GetStatus; every change also goes to `metrics`."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._lock = threading.Lock()
        self._recent: collections.deque[tuple[float, int, float]] = collections.deque()
        self.tokens_generated = 0
        self.tasks_done = 0
        self.tasks_failed = 0
        self.busy = 0

    def started(self) -> None:
        with self._lock:
            self.busy += 1

    def ended(self) -> None:
        with self._lock:
            self.busy -= 1

    def record(self, tokens: int, wall: float, source: str) -> None:
        """One generation call: `tokens` completion tokens in `wall` seconds."""
        now = time.monotonic()
        with self._lock:
            self.tokens_generated += tokens
            self._recent.append((now, tokens, wall))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
        self.metrics.tokens.inc(tokens)
        self.metrics.requests.labels(source).inc()
        self.metrics.latency.observe(wall)

    def tokens_per_s(self) -> float:
        with self._lock:
            tokens = sum(t for _, t, _ in self._recent)
            wall = sum(w for _, _, w in self._recent)
        return tokens / wall if wall > 0 else 0.0

    def record_task(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.tasks_done += 1
            else:
                self.tasks_failed += 1
        self.metrics.tasks.labels("done" if ok else "failed").inc()

    def snapshot(self) -> tuple[int, int, int, int]:
        """(tasks done, tasks failed, tokens generated, calls in progress), read together."""
        with self._lock:
            return self.tasks_done, self.tasks_failed, self.tokens_generated, self.busy


_WORKER_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def _worker_events_counter(registry: CollectorRegistry) -> Counter:
    """One counter per metrics registry, however many workers a service starts over its life."""
    if registry not in _WORKER_COUNTERS:
        _WORKER_COUNTERS[registry] = Counter(
            "grpo_rollout_worker_events", "Worker loop events", ["kind"], registry=registry
        )
    return _WORKER_COUNTERS[registry]


class WorkerStats:
    """Worker counters: done/failed groups, reclaimed tasks, dropped results, invalid entries, Redis errors."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.counts = dict.fromkeys(WORKER_OUTCOMES, 0)
        self._counter = _worker_events_counter(registry or CollectorRegistry())

    def add(self, outcome: str, n: int = 1) -> None:
        if n:
            self.counts[outcome] += n
            self._counter.labels(outcome).inc(n)
