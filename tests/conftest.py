"""Fixtures shared by every test tier: a private Redis, free ports, the tiny model."""

from __future__ import annotations

import logging
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


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A test that runs a CLI's main() in-process installs a handler on that test's captured stderr, which
    pytest closes after it: every later log line in that worker was a "--- Logging error ---" traceback."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
