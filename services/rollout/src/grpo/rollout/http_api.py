"""The HTTP side of the rollout service: /healthz and /metrics (Prometheus), on a plain threaded server."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from grpo.rollout.service import RolloutService

log = logging.getLogger(__name__)


def _handler(service: RolloutService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                body = json.dumps(
                    {
                        "status": "ok",
                        "engine": service.engine.name,
                        "model": service.model,
                        "version": service.version,
                        "checksum": service.checksum,
                    }
                ).encode()
                self._send(200, "application/json", body)
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(service.metrics.registry))
            else:
                self._send(404, "application/json", json.dumps({"detail": f"no route {path}"}).encode())

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http: " + format, *args)

    return Handler


class HttpServer:
    """Serves in a daemon thread; `port` is the bound one (useful with port 0)."""

    def __init__(self, service: RolloutService, host: str, port: int) -> None:
        self.server = ThreadingHTTPServer((host, port), _handler(service))
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="rollout-http", daemon=True)

    def start(self) -> None:
        self.thread.start()
        log.info("HTTP listening on port %d (/healthz, /metrics)", self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
