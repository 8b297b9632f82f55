"""Fixtures of the reward unit tests that run real sandboxes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from grpo.reward.sandbox import Sandbox, make_sandbox, namespace
from tests.support import sandbox_mode


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    """A real namespace sandbox with two workers, one per test module (GRPO_TEST_SANDBOX_MODE: its mode)."""
    box = make_sandbox(workers=2, **sandbox_mode.options())
    yield box
    box.close()


@contextmanager
def sandbox_with(init: str, workers: int = 2, mode: str | None = None) -> Iterator[Sandbox]:
    """A real namespace sandbox whose single runs start from `init`: "c" (init.c, the default wherever it can be
    built) or "python" (the forked init that sets up in Python, for hosts without a C compiler); in `mode` (root
    or rootless: tests/support/sandbox_mode.py), by default GRPO_TEST_SANDBOX_MODE's."""
    with pytest.MonkeyPatch.context() as patch:
        if init == "python":
            patch.setattr(namespace, "init_program", lambda: None)
        box = make_sandbox(workers=workers, **sandbox_mode.options(mode))
    try:
        yield box
    finally:
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
