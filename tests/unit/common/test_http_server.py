"""The shared GET-only HTTP server: routes answer, unknown paths get a 404 naming the routes, metrics render."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from grpo.common.http_server import HttpServer, json_response, metrics_response


@pytest.fixture
def server() -> Iterator[HttpServer]:
    registry = CollectorRegistry()
    Counter("grpo_test_hits", "hits", registry=registry).inc(3)
    routes = {
        "/healthz": lambda: json_response({"status": "ok"}),
        "/down": lambda: json_response({"status": "failed"}, 503),
        "/metrics": lambda: metrics_response(registry),
    }
    http = HttpServer(routes, "127.0.0.1", 0, name="test-http")
    http.start()
    yield http
    http.stop()


def get(http: HttpServer, path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http.port}{path}", timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_routes_answer_with_their_code_and_json(server: HttpServer) -> None:
    assert server.port > 0
    assert get(server, "/healthz?probe=1") == (200, "application/json", b'{"status": "ok"}')
    code, _, body = get(server, "/down")
    assert (code, json.loads(body)) == (503, {"status": "failed"})


def test_unknown_path_is_404_naming_the_routes(server: HttpServer) -> None:
    code, content_type, body = get(server, "/nope")
    assert (code, content_type) == (404, "application/json")
    assert json.loads(body)["detail"] == "no route /nope; try ['/down', '/healthz', '/metrics']"


def test_metrics_render_the_given_registry(server: HttpServer) -> None:
    code, content_type, body = get(server, "/metrics")
    assert code == 200 and content_type.startswith("text/plain")
    assert b"grpo_test_hits_total 3.0" in body


def test_token_guards_status_routes_but_not_probes() -> None:
    routes = {
        "/healthz": lambda: json_response({"status": "ok"}),
        "/metrics": lambda: metrics_response(CollectorRegistry()),
        "/v1/status": lambda: json_response({"step": 3}),
    }
    http = HttpServer(routes, "127.0.0.1", 0, name="auth-http", token="s3cret")
    http.start()
    try:
        assert get(http, "/healthz")[0] == 200
        assert get(http, "/metrics")[0] == 200
        code, _, body = get(http, "/v1/status")
        assert code == 401 and "Bearer" in json.loads(body)["detail"]
        for wrong in ("Bearer nope", "s3cret", "Basic s3cret"):
            request = urllib.request.Request(
                f"http://127.0.0.1:{http.port}/v1/status", headers={"Authorization": wrong}
            )
            with pytest.raises(urllib.error.HTTPError) as denied:
                urllib.request.urlopen(request, timeout=5)
            assert denied.value.code == 401
        request = urllib.request.Request(
            f"http://127.0.0.1:{http.port}/v1/status", headers={"Authorization": "Bearer s3cret"}
        )
        with urllib.request.urlopen(request, timeout=5) as r:
            assert json.loads(r.read()) == {"step": 3}
    finally:
        http.stop()
