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
