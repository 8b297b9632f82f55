"""A testlib checker is built once per reward-service process, not once per request (issue 33, item 4): through
the real HTTP API, read off /metrics (`grpo_reward_build_cache_total`: every miss is one build)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.reward_proc import RewardService, start_reward_service, stop_reward_service

# a + b = n, the Codeforces way: the answer file is not what the output must equal.
CHECKER = """#include "testlib.h"
int main(int argc, char* argv[]) {
    registerTestlibCmd(argc, argv);
    long long n = inf.readLong();
    long long a = ouf.readLong(0, n, "a"), b = ouf.readLong(0, n, "b");
    if (a + b != n) quitf(_wa, "%lld + %lld != %lld", a, b, n);
    quitf(_ok, "n = %lld", n);
}
"""
TESTS = [{"stdin": "7\n", "expected_stdout": "0 7"}, {"stdin": "10\n", "expected_stdout": "10 0"}]
HALVES = "n = int(input())\nprint(n // 2, n - n // 2)"


@pytest.fixture(scope="module")
def service() -> Iterator[RewardService]:
    # A deadline of 300 s, not 60: two concurrent builds of a testlib checker take ~13 s each on a loaded 2-core
    # machine, and admission would refuse the second request (429) as unable to finish in time. What is tested is
    # the cache, not admission (tests/service/test_reward_overload.py tests that).
    started = start_reward_service("--default-timeout-s", "300", workers=1)
    yield started
    stop_reward_service(started)


def verify(service: RewardService, code: str, checker: str = CHECKER) -> dict[str, Any]:
    body = {"code": code, "tests": TESTS, "checker": {"language": "cpp", "code": checker}}
    reply = httpx.post(f"{service.http_url}/v1/verify/code", json=body, timeout=180)
    assert reply.status_code == 200, reply.text
    return reply.json()


def lookups(service: RewardService, kind: str = "checker") -> dict[str, float]:
    """grpo_reward_build_cache_total{kind=...} by outcome (hit, miss, shared)."""
    text = httpx.get(f"{service.http_url}/metrics", timeout=10).text
    line = re.compile(rf'^grpo_reward_build_cache_total\{{kind="{kind}",outcome="(\w+)"\}} (\S+)$', re.MULTILINE)
    return {outcome: float(value) for outcome, value in line.findall(text)}


def test_a_second_request_with_the_same_checker_builds_no_checker(service: RewardService) -> None:
    first = verify(service, HALVES)
    assert [t["verdict"] for t in first["tests"]] == ["pass", "pass"], first
    assert lookups(service) == {"miss": 1.0}
    # Another submission with the same checker: judged by it (a rejection with its message), not rebuilt.
    second = verify(service, "n = int(input())\nprint(1, n)")
    assert [t["verdict"] for t in second["tests"]] == ["fail", "fail"], second
    assert "1 + 7 != 7" in second["tests"][0]["detail"]
    assert lookups(service) == {"miss": 1.0, "hit": 1.0}
    service.assert_alive()


def test_concurrent_requests_with_a_new_checker_build_it_once(service: RewardService) -> None:
    before = lookups(service)
    other = CHECKER + "// another checker: another source\n"
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda _: verify(service, HALVES, other), range(2)))
    assert all(r["passed"] == 2 for r in replies), replies
    after = lookups(service)
    assert after["miss"] - before["miss"] == 1  # one build for both
    shared = after.get("shared", 0) + after.get("hit", 0) - before.get("shared", 0) - before.get("hit", 0)
    assert shared == 1, (before, after)
