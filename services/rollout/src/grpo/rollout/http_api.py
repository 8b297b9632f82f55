"""The HTTP side of the rollout service: the routes behind /healthz and /metrics (Prometheus)."""

from __future__ import annotations

from grpo.common.http_server import Response, Routes, json_response, metrics_response
from grpo.rollout.service import RolloutService


def http_routes(service: RolloutService) -> Routes:
    def healthz() -> Response:
        return json_response(
            {
                "status": "ok",
                "engine": service.engine.name,
                "model": service.model,
                # `weight_*`: the reward service's `version` is its package version; these are the loaded weights.
                "weight_version": service.version,
                "weight_checksum": service.checksum,
            }
        )

    return {"/healthz": healthz, "/metrics": lambda: metrics_response(service.metrics.registry)}
