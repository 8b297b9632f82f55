"""The HTTP side of the rollout service: /healthz (liveness), /readyz (readiness) and /metrics (Prometheus)."""

from __future__ import annotations

from grpo.common.http_server import Response, Routes, json_response, metrics_response
from grpo.common.readiness import Readiness
from grpo.rollout.service import RolloutService


def http_routes(service: RolloutService, readiness: Readiness | None = None) -> Routes:
    """`readiness`: what the replica needs besides its engine (Redis and the reward service in worker mode)."""
    readiness = readiness or Readiness()

    def healthz() -> Response:
        return json_response(
            {
                "status": "ok",
                "engine": service.engine.name,
                "model": service.model,
                # `weight_*`: the reward service's `version` is its package version; these are the loaded weights.
                "weight_version": service.version,
                "weight_checksum": service.checksum,
                "weights_broken": service.broken,  # null unless a copy failed part-way (then /readyz is 503)
            }
        )

    def readyz() -> Response:
        missing = readiness.problems()
        if service.broken is not None:  # mixed weights: no generation until a complete update
            missing.insert(0, f"weights: {service.broken}")
        body = {"ready": not missing, "missing": missing, "weight_version": service.version}
        return json_response(body, 503 if missing else 200)

    return {"/healthz": healthz, "/readyz": readyz, "/metrics": lambda: metrics_response(service.metrics.registry)}
