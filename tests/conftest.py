"""Fixtures shared by every test tier: a private Redis, free ports, the tiny model, a rollout replica."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from grpo.local.redis_server import RedisServer

if TYPE_CHECKING:
    from tests.support.rollout_proc import RolloutProc


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


@pytest.fixture(scope="module")
def rollout_starter() -> Callable[[Path], RolloutProc]:
    """How `rollout` starts its replica, given a log folder: the hf engine; a module overrides it for another."""
    from tests.support.rollout_proc import start_rollout_service

    return lambda log_dir: start_rollout_service(log_dir=log_dir)


@pytest.fixture(scope="module")
def rollout(
    tmp_path_factory: pytest.TempPathFactory, rollout_starter: Callable[[Path], RolloutProc]
) -> Iterator[RolloutProc]:
    """A rollout replica as a real process (no worker loop) for the test module; it must stop cleanly."""
    proc = rollout_starter(tmp_path_factory.mktemp("rollout"))
    yield proc
    assert proc.stop() == 0, proc.log_text()[-2000:]
