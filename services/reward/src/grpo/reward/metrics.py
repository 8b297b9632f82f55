"""Prometheus metrics of the reward service (one process, the default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

REQUESTS = Counter("grpo_reward_requests_total", "Requests by endpoint and outcome code.", ["endpoint", "code"])
REQUEST_SECONDS = Histogram(
    "grpo_reward_request_seconds", "Request latency by endpoint.", ["endpoint"], buckets=LATENCY_BUCKETS
)
VERIFIER_SECONDS = Histogram(
    "grpo_reward_verifier_seconds", "Latency of one verification by verifier.", ["verifier"], buckets=LATENCY_BUCKETS
)
VERDICTS = Counter("grpo_reward_verdicts_total", "Verdicts by verifier and status.", ["verifier", "status"])
ITEMS = Counter("grpo_reward_items_total", "Scored items by item status.", ["status"])
SANDBOX_KILLS = Counter(
    "grpo_reward_sandbox_kills_total", "Processes killed at their deadline (math workers, sandboxed runs).", ["kind"]
)
REJECTED = Counter("grpo_reward_rejected_total", "Requests refused by admission control or limits.", ["reason"])
QUEUE_DEPTH = Gauge("grpo_reward_queue_depth", "Math tasks waiting for a worker.")
INFLIGHT = Gauge("grpo_reward_inflight_items", "Items admitted and not finished.")
BUILD_CACHE = Counter(
    "grpo_reward_build_cache_total",
    "Build lookups by kind (checker, program) and outcome: hit (kept), miss (built), shared (waited for the same "
    "build already under way).",
    ["kind", "outcome"],
)
BUILD_CACHE_EVICTIONS = Counter("grpo_reward_build_cache_evictions_total", "Kept builds evicted by kind.", ["kind"])
BUILD_CACHE_BYTES = Gauge("grpo_reward_build_cache_bytes", "Bytes of kept builds by kind.", ["kind"])
# Overload (admission.py, cancellation.py).
ADMISSION_UNIT_SECONDS = Gauge(
    "grpo_reward_admission_unit_seconds", "Measured seconds one unit keeps a worker busy, by lane (math, code).",
    ["lane"],
)  # fmt: skip
ADMISSION_WAIT_SECONDS = Gauge(
    "grpo_reward_admission_wait_seconds", "Estimated seconds until the work admitted in a lane is done.", ["lane"]
)
ABANDONED = Counter(
    "grpo_reward_abandoned_total", "Requests whose client went away before the answer (their work is cancelled).",
    ["edge"],
)  # fmt: skip
CANCELLED = Counter(
    "grpo_reward_cancelled_total",
    "Math items not run and code tests not judged because their request had ended (a batch's queued run may still "
    "have run).",
    ["kind"],
)
SANDBOX_RUNS = Counter(
    "grpo_reward_sandbox_runs_total", "Sandboxed runs whose result came back (builds, tests, checkers, executes)."
)
ADMISSION_CORRECTION = Gauge(
    "grpo_reward_admission_correction",
    "How long requests took against the plain estimate of their finish, by lane (admission multiplies by it).",
    ["lane"],
)
