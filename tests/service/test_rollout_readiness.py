"""A replica in worker mode is live but not ready while Redis or the reward service is away (/healthz vs /readyz)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from grpo.local.redis_server import RedisServer
from tests.support.polling import wait_until
from tests.support.rollout_proc import start_rollout_service

pytestmark = pytest.mark.slow


def probe(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def eventually(url: str, code: int, timeout_s: float = 30.0) -> dict[str, Any]:
    """The body of `url`'s first answer with status `code` (the last answer is in the failure)."""
    last: list[tuple[int, dict[str, Any]]] = []

    def answered() -> list[tuple[int, dict[str, Any]]]:
        last[:] = [probe(url)]
        return last if last[0][0] == code else []

    wait_until(answered, timeout_s, f"{url} to answer {code}", every=0.2, context=lambda: f"; last answer {last}")
    return last[0][1]


def test_readiness_follows_redis_while_liveness_stays(live_reward: Any, tmp_path: Path) -> None:
    redis = RedisServer().start()
    replica = start_rollout_service(
        "--redis-url", redis.url, "--reward-addr", live_reward.grpc_addr, "--run", "ready", log_dir=tmp_path
    )
    try:
        ready, live = f"{replica.http_url}/readyz", f"{replica.http_url}/healthz"
        assert eventually(ready, 200)["missing"] == []
        redis.stop()
        body = eventually(ready, 503)
        assert [m.split(" (")[0] for m in body["missing"]] == [f"redis: cannot reach {redis.url}"]
        assert probe(live)[0] == 200  # a Redis outage is no reason to restart the replica
    finally:
        replica.stop()
        redis.stop()


def test_an_unreachable_reward_service_is_named(redis_url: str, tmp_path: Path) -> None:
    replica = start_rollout_service(
        "--redis-url", redis_url, "--reward-addr", "127.0.0.1:1", "--run", "ready2", log_dir=tmp_path
    )
    try:
        body = eventually(f"{replica.http_url}/readyz", 503)
        assert body["missing"] == ["reward: cannot reach 127.0.0.1:1 (UNAVAILABLE)"]
    finally:
        replica.stop()
