"""The trainer's HTTP side: /healthz, /metrics (Prometheus) and /v1/status (run status JSON)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from grpo.trainer.control import RunControl

log = logging.getLogger(__name__)


def _handler(control: RunControl, registry: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            status = control.status()
            if path == "/healthz":
                healthy = status.phase != "failed"
                body = {"status": "ok" if healthy else "failed", "phase": status.phase, "step": status.step}
                if status.error:
                    body["error"] = status.error
                self._send(200 if healthy else 503, "application/json", json.dumps(body).encode())
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/v1/status":
                self._send(200, "application/json", json.dumps(status.to_json(), default=str).encode())
            else:
                routes = ["/healthz", "/metrics", "/v1/status"]
                self._send(404, "application/json", json.dumps({"detail": f"no route {path}; try {routes}"}).encode())

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

    def __init__(self, control: RunControl, registry: Any, host: str, port: int) -> None:
        self.server = ThreadingHTTPServer((host, port), _handler(control, registry))
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="trainer-http", daemon=True)

    def start(self) -> None:
        self.thread.start()
        log.info("HTTP listening on port %d (/healthz, /metrics, /v1/status)", self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
