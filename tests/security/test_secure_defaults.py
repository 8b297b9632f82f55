"""Secure defaults of the services themselves (issue 35): what a deployment gets without asking for it.

* A reward service that would run code for anyone who reaches it (bound beyond loopback, sandbox on, no token)
  refuses to start with one line naming the ways out; loopback, a token or an explicit opt-in start.
* Requests that fail (404, 401) cannot grow /metrics: requests are labelled by route template.
* The bearer scheme is case-insensitive (RFC 7235), over HTTP and gRPC.
* With a token set, the API's schema (/docs, /redoc, /openapi.json) stays readable and everything under /v1 does not.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator

import grpc
import httpx
import pytest
from pydantic import ValidationError

from grpo.common.auth import token_matches
from grpo.common.http_server import HttpServer, json_response
from grpo.common.net import beyond_loopback, exposure_warning
from grpo.reward.settings import parse_settings as reward_settings
from grpo.v1 import reward_pb2 as rpb
from grpo.v1 import reward_pb2_grpc
from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service

TOKEN = "defaults-s3cret"
# The reward app's routes: /v1/{verify/math,execute,verify/code,score}, /healthz, /readyz, /metrics and
# FastAPI's /docs, /docs/oauth2-redirect, /redoc, /openapi.json.
REWARD_ROUTES = 11


@pytest.fixture(scope="module")
def reward_with_token() -> Iterator[RewardService]:
    service = start_reward_service(workers=1, env={"GRPO_REWARD_TOKEN": TOKEN})
    try:
        yield service
        service.assert_alive()
    finally:
        stop_reward_service(service)


def start_line(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m grpo.reward argv` with no GRPO_* variable of the runner's; it is expected to stop at its settings."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    cmd = [sys.executable, "-m", "grpo.reward", "--grpc-port", "0", "--http-port", "0", "--workers", "1", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**base, **(env or {})})


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_code_execution_open_to_the_network_refuses_to_start(host: str) -> None:
    done = start_line(["--host", host])
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = lines[0]
    assert line.startswith("grpo-reward: invalid settings: ") and host in line
    # The ways out, each with the setting that takes it.
    for way in ("GRPO_REWARD_TOKEN", "--host 127.0.0.1", "GRPO_REWARD_ALLOW_UNAUTHENTICATED=1"):
        assert way in line, line


def test_the_ways_out_start(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("GRPO_REWARD_"):
            monkeypatch.delenv(name)
    with pytest.raises(ValidationError):
        reward_settings(["--host", "0.0.0.0"])
    assert reward_settings([]).host == "127.0.0.1"  # the default binds loopback only
    assert reward_settings(["--host", "127.0.0.1"]).token is None
    assert reward_settings(["--host", "localhost"]).token is None
    assert reward_settings(["--host", "0.0.0.0", "--token", "t"]).token == "t"
    assert reward_settings(["--host", "0.0.0.0", "--sandbox", "off"]).sandbox == "off"  # math only: no code runs
    monkeypatch.setenv("GRPO_REWARD_ALLOW_UNAUTHENTICATED", "1")
    assert reward_settings(["--host", "0.0.0.0"]).allow_unauthenticated is True


def test_an_explicitly_open_service_starts_and_serves() -> None:
    """The opt-in is a real way out: the process comes up on all interfaces and answers without a token."""
    service = start_reward_service("--host", "0.0.0.0", workers=1, env={"GRPO_REWARD_ALLOW_UNAUTHENTICATED": "1"})
    try:
        reply = httpx.post(f"{service.http_url}/v1/verify/math", json={"answer": "2", "gold": "2"}, timeout=30)
        assert reply.status_code == 200 and reply.json()["correct"] is True
    finally:
        stop_reward_service(service)


def test_rollout_and_trainer_say_when_their_control_api_is_open() -> None:
    """They run no code for callers, so they start; but an open UpdateWeights or Stop is said at start-up."""
    assert beyond_loopback("0.0.0.0") and beyond_loopback("::") and not beyond_loopback("127.0.0.1")
    assert not beyond_loopback("localhost") and not beyond_loopback("::1") and not beyond_loopback("127.0.1.1")
    line = exposure_warning("0.0.0.0", None, "GRPO_TRAINER_")
    assert line is not None and "GRPO_TRAINER_TOKEN" in line and "--host 127.0.0.1" in line
    assert exposure_warning("0.0.0.0", "t", "GRPO_TRAINER_") is None
    assert exposure_warning("127.0.0.1", None, "GRPO_TRAINER_") is None


def metric_endpoints(text: str) -> set[str]:
    return set(re.findall(r'^grpo_reward_requests_total\{[^}]*endpoint="([^"]*)"', text, re.MULTILINE))


def test_failed_requests_do_not_grow_the_metrics(reward_with_token: RewardService) -> None:
    """3,000 random `GET /v1/<x>` once grew /metrics from 40 KB to 17 MB: every path was a label value."""
    url = reward_with_token.http_url
    with httpx.Client(base_url=url, timeout=10) as client:
        client.post("/v1/verify/math", json={"answer": "1", "gold": "1"}, headers={"authorization": f"Bearer {TOKEN}"})
        before = len(client.get("/metrics").content)
        for i in range(300):
            path = f"/v1/{secrets.token_hex(8)}" if i % 3 else f"/{secrets.token_hex(8)}/x"
            assert client.get(path).status_code in (401, 404)  # refused, or no such route
            if i % 50 == 0:
                assert client.post("/v1/score", json={"items": []}).status_code == 401  # a real route, no token
        text = client.get("/metrics").text
    endpoints = metric_endpoints(text)
    assert "/v1/verify/math" in endpoints and "unknown" in endpoints, endpoints
    assert len(endpoints) <= REWARD_ROUTES + 1, sorted(endpoints)
    assert len(text) < before + 16_000, (before, len(text))


def test_the_bearer_scheme_is_case_insensitive(reward_with_token: RewardService) -> None:
    assert all(token_matches(f"{scheme} xyz", "xyz") for scheme in ("bearer", "BEARER", "Bearer", "bEaReR"))
    assert not token_matches("bearer xyZ", "xyz") and not token_matches("Basic xyz", "xyz")
    assert not token_matches("bearerxyz", "xyz") and not token_matches("xyz", "xyz") and not token_matches("", "xyz")
    body = {"answer": "\\boxed{2}", "gold": "2"}
    for scheme in ("bearer", "BEARER", "Bearer"):
        reply = httpx.post(f"{reward_with_token.http_url}/v1/verify/math", json=body, timeout=30,
                           headers={"authorization": f"{scheme} {TOKEN}"})  # fmt: skip
        assert reply.status_code == 200, (scheme, reply.text)
    with grpc.insecure_channel(reward_with_token.grpc_addr) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        reply = stub.VerifyMath(rpb.VerifyMathRequest(answer="2", gold="2"), timeout=30,
                                metadata=(("authorization", f"bearer {TOKEN}"),))  # fmt: skip
        assert reply.status == "correct"


def test_the_shared_http_server_takes_any_case_of_the_scheme() -> None:
    """The rollout's and trainer's HTTP side (/v1/status) share the rule."""
    http = HttpServer({"/v1/status": lambda: json_response({"ok": True})}, "127.0.0.1", 0, token=TOKEN)
    http.start()
    try:
        url = f"http://127.0.0.1:{http.port}/v1/status"
        assert httpx.get(url, headers={"authorization": f"bearer {TOKEN}"}, timeout=5).status_code == 200
        assert httpx.get(url, headers={"authorization": f"bearer x{TOKEN}"}, timeout=5).status_code == 401
    finally:
        http.stop()


def test_with_a_token_the_schema_stays_readable_and_the_api_does_not(reward_with_token: RewardService) -> None:
    """The documented choice (README "Security"): the schema is what the repository publishes anyway."""
    url = reward_with_token.http_url
    for path in ("/docs", "/redoc", "/openapi.json", "/healthz", "/readyz", "/metrics"):
        assert httpx.get(f"{url}{path}", timeout=10).status_code in (200, 503), path
    for path in ("/v1/verify/math", "/v1/execute", "/v1/verify/code", "/v1/score"):
        assert httpx.post(f"{url}{path}", json={}, timeout=10).status_code == 401, path
