"""A small threaded HTTP server for the GET-only side of a service: /healthz, /metrics and JSON status routes."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from grpo.common.auth import token_matches
from grpo.common.ports import PortSetting, bind_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Response:
    code: int
    content_type: str
    body: bytes


def json_response(payload: Any, code: int = 200) -> Response:
    """`default=str` because status payloads carry timestamps and paths."""
    return Response(code, "application/json", json.dumps(payload, default=str).encode())


def metrics_response(registry: CollectorRegistry) -> Response:
    return Response(200, CONTENT_TYPE_LATEST, generate_latest(registry))


Routes = Mapping[str, Callable[[], Response]]
# Probes and scrapers cannot send a token: these stay open when auth is on.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def _handler(routes: Routes, token: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            route = routes.get(path)
            if route is None:
                response = json_response({"detail": f"no route {path}; try {sorted(routes)}"}, 404)
            elif token and path not in OPEN_PATHS and not token_matches(self.headers.get("Authorization"), token):
                response = json_response({"detail": f"{path} needs 'Authorization: Bearer <token>'"}, 401)
            else:
                response = route()
            self.send_response(response.code)
            if response.code == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)

        def log_message(self, format: str, *args: object) -> None:
            # Probes hit /healthz every few seconds; access lines would drown the service's own log.
            log.debug("http: " + format, *args)

    return Handler


class HttpServer:
    """Serves `routes` (path → response builder) in a daemon thread; `port` is the bound one (useful with port 0).

    With a `token`, every route but the probes and /metrics needs `Authorization: Bearer <token>` (401 without).
    A port that cannot be bound ends the process with one line naming `setting` (PortInUse).
    """

    def __init__(
        self,
        routes: Routes,
        host: str,
        port: int,
        name: str = "http",
        token: str | None = None,
        setting: PortSetting | None = None,
    ) -> None:
        self.routes = routes
        self.server = ThreadingHTTPServer((host, port), _handler(routes, token), bind_and_activate=False)
        try:
            self.server.server_bind()
            self.server.server_activate()
        except OSError as exc:
            self.server.server_close()
            raise bind_error(host, port, setting, exc) from None
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()
        log.info("HTTP listening on port %d (%s)", self.port, ", ".join(self.routes))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
