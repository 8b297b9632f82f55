"""Fixtures of the reward unit tests that run real sandboxes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from grpo.reward.sandbox import Sandbox, make_sandbox


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    """A real namespace sandbox with two workers, one per test module."""
    box = make_sandbox(workers=2)
    yield box
    box.close()


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server of the test process on loopback; no sandboxed program may reach it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()
    assert not accepted, "a sandboxed program reached the test's loopback server"
