"""Fuzz the reward service's HTTP API from its own OpenAPI schema (schemathesis): no 5xx, no crash."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

pytestmark = pytest.mark.slow

EXAMPLES = 40  # per operation and mode: ~5 operations × 2 modes × 40 ≈ 400 calls, well under a minute


def _fuzz_operation(operation: Any, base_url: str, mode: GenerationMode, seen: dict[int, int]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def check(case: Any) -> None:
        response = case.call(base_url=base_url, timeout=30)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text}"

    check()


def test_fuzzed_requests_never_get_a_5xx(tight_reward: Any) -> None:
    schema = schemathesis.openapi.from_url(f"{tight_reward.http_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/verify/math", "/v1/execute", "/v1/verify/code", "/v1/score"} <= paths
    seen: dict[int, int] = {}
    for operation in operations:
        # Invalid input cannot be generated for an operation that takes none (GET /healthz).
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if operation.method.upper() == "POST" else [])
        for mode in modes:
            _fuzz_operation(operation, tight_reward.http_url, mode, seen)
            tight_reward.assert_alive()
    assert seen.get(200, 0) > 0 and seen.get(422, 0) > 0, seen  # both valid and invalid input were exercised
    after = httpx.post(
        f"{tight_reward.http_url}/v1/verify/math", json={"answer": "\\boxed{2}", "gold": "2"}, timeout=30
    )
    assert after.status_code == 200 and after.json()["status"] == "correct"


def test_malformed_bodies_are_4xx(tight_reward: Any) -> None:
    url = f"{tight_reward.http_url}/v1/score"
    bodies: list[bytes] = [
        b"",
        b"{",
        b"\xff\xfe\x00garbage",
        b"null",
        b"[]",
        b'{"items": "x"}',
        b'"' * 10000,
    ]
    for body in bodies:
        r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
        assert 400 <= r.status_code < 500, (body[:40], r.status_code, r.text)
    deep = b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # recursion bomb for naive JSON parsers
    r = httpx.post(url, content=deep, headers={"content-type": "application/json"}, timeout=30)
    assert 400 <= r.status_code < 500, r.status_code
    r = httpx.post(url, content=b"x" * (40 << 20), timeout=60)  # over the 32 MiB body limit
    assert r.status_code == 413
    tight_reward.assert_alive()
    assert httpx.get(f"{tight_reward.http_url}/healthz", timeout=5).status_code == 200


def test_non_finite_json_numbers_are_4xx(tight_reward: Any) -> None:
    """Python's JSON parser accepts NaN / Infinity / 1e999: the 422 that echoes them back must still render."""
    bodies = {
        "/v1/verify/math": [
            b"1e999999",
            b'{"answer": NaN, "gold": "1"}',
            b'{"answer": "1", "gold": "1", "timeout_s": Infinity}',
        ],
        "/v1/score": [b'{"items": [{"id": "a", "completion": "x", "checks": {}, "weights": {"math": NaN}}]}'],
    }
    for path, cases in bodies.items():
        for body in cases:
            r = httpx.post(
                f"{tight_reward.http_url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30
            )
            assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)
    tight_reward.assert_alive()
