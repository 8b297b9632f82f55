"""The trainer's HTTP side: the routes behind /healthz, /metrics (Prometheus) and /v1/status (run status JSON)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from grpo.common.http_server import Response, Routes, json_response, metrics_response
from grpo.trainer.control import RunControl


def http_routes(control: RunControl, registry: CollectorRegistry) -> Routes:
    def healthz() -> Response:
        status = control.status()
        healthy = status.phase != "failed"
        body = {"status": "ok" if healthy else "failed", "phase": status.phase, "step": status.step}
        if status.error:
            body["error"] = status.error
        return json_response(body, 200 if healthy else 503)

    return {
        "/healthz": healthz,
        "/metrics": lambda: metrics_response(registry),
        "/v1/status": lambda: json_response(control.status().to_json()),
    }
