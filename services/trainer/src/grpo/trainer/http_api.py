"""The trainer's HTTP side: /healthz (liveness), /readyz (readiness), /metrics (Prometheus), /v1/status (run JSON)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from grpo.common.http_server import Response, Routes, json_response, metrics_response
from grpo.trainer.control import RunControl

WORKING_PHASES = ("sft", "grpo", "rejection_sampling", "eval", "done")


def http_routes(control: RunControl, registry: CollectorRegistry) -> Routes:
    registry.register(RunStatusCollector(control))

    def healthz() -> Response:
        status = control.status()
        healthy = status.phase != "failed"
        body = {"status": "ok" if healthy else "failed", "phase": status.phase, "step": status.step}
        if status.error:
            body["error"] = status.error
        return json_response(body, 200 if healthy else 503)

    def readyz() -> Response:
        status = control.status()
        missing = [] if status.phase in WORKING_PHASES else [f"the run is {status.phase}"]
        missing += control.readiness.problems()
        body = {"ready": not missing, "phase": status.phase, "step": status.step, "missing": missing}
        return json_response(body, 503 if missing else 200)

    return {
        "/healthz": healthz,
        "/readyz": readyz,
        "/metrics": lambda: metrics_response(registry),
        "/v1/status": lambda: json_response(control.status().to_json()),
    }


class RunStatusCollector(Collector):
    """The run's books as gauges from the first scrape on (per-step metrics appear once a step is done)."""

    def __init__(self, control: RunControl) -> None:
        self.control = control

    def collect(self) -> Iterator[GaugeMetricFamily]:
        status = self.control.status()
        for name, value, doc in (
            ("step", status.step, "the last finished step"),
            ("total_steps", status.total_steps, "steps this run will take"),
            ("policy_version", status.policy_version, "the policy's weight version"),
            ("tasks_published", status.tasks_published, "rollout tasks published to Redis"),
            ("groups_trained", status.groups_trained, "groups the policy was updated on"),
            ("in_flight", status.in_flight, "tasks published and not yet resolved"),
            ("duplicate_groups", status.duplicates, "groups whose task was already settled (not in dropped)"),
            ("superseded_groups", status.superseded, "groups made by discarded weights (not in dropped)"),
            ("replicas", len(status.replicas), "rollout replicas seen in the registry"),
        ):
            yield GaugeMetricFamily(f"grpo_trainer_run_{name}", doc, value=value)
        dropped = GaugeMetricFamily(
            "grpo_trainer_run_dropped",
            "tasks dropped, by reason (tasks_published = groups_trained + dropped + in_flight)",
            labels=["reason"],
        )
        for reason, count in sorted(status.dropped.items()):
            dropped.add_metric([reason], count)
        yield dropped
        phase = GaugeMetricFamily("grpo_trainer_run_phase", "1 for the run's current phase", labels=["phase"])
        phase.add_metric([status.phase], 1)
        yield phase
