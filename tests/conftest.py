"""Fixtures shared by every test tier: a private Redis, free ports, the tiny model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grpo.local.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server on a free port for the whole session (never the system one)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on the session's private Redis."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    yield redis_server.url
    client.flushdb()
    client.close()
