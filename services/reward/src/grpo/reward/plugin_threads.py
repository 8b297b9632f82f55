"""Threads of one plug-in: its calls are timed from when they start, and calls stuck past their limit are counted.

A Python thread cannot be killed, so a hung plug-in keeps its thread. Each plug-in gets its own few daemon
threads: a hung one then stalls only itself (not the other plug-ins, the reward model or the PRM), cannot keep
the process from exiting at shutdown, and once all its threads are stuck /readyz says so by name.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
THREADS_PER_PLUGIN = 4


class PluginTimeout(Exception):
    """The call ran past its own limit, or the request's deadline passed first (the message says which)."""


class Contained(Exception):
    """A BaseException the call raised (SystemExit from sys.exit or argparse, a KeyboardInterrupt it raised
    itself), carried as an ordinary exception: re-raised out of a future inside an asyncio task, SystemExit or
    KeyboardInterrupt would stop the event loop and with it the whole service."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.original = exc


def contained(fn: Callable[[], T]) -> Callable[[], T]:
    """`fn` with any BaseException it raises turned into `Contained` (run in a thread, never on the loop)."""

    def run() -> T:
        try:
            return fn()
        except Exception:
            raise
        except BaseException as exc:  # a thread has no cancellation of ours to let through
            raise Contained(exc) from exc

    return run


class PluginThreads:
    """A few daemon threads for one plug-in's calls."""

    def __init__(self, name: str, timeout_s: float, threads: int = THREADS_PER_PLUGIN) -> None:
        self.name, self.timeout_s, self.threads = name, timeout_s, threads
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started_at: dict[int, float] = {}  # thread ident -> when its current call started
        for i in range(threads):
            threading.Thread(target=self._work, name=f"plugin-{name}-{i}", daemon=True).start()

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            future, fn = job
            if not future.set_running_or_notify_cancel():  # its caller gave up while it queued
                continue
            with self._lock:
                self._started_at[threading.get_ident()] = time.monotonic()
            try:
                future.set_result(contained(fn)())
            except Exception as exc:
                future.set_exception(exc)
            finally:
                with self._lock:
                    del self._started_at[threading.get_ident()]

    def stuck(self) -> list[float]:
        """How long each call running past its limit has run (seconds): their threads are lost until they end."""
        now = time.monotonic()
        with self._lock:
            return sorted(now - t for t in self._started_at.values() if now - t > self.timeout_s)

    def problem(self) -> str | None:
        """Why this plug-in cannot take calls (every thread stuck past its limit), else None."""
        stuck = self.stuck()
        if len(stuck) < self.threads:
            return None
        return (
            f"plug-in {self.name!r}: all {self.threads} of its threads are stuck in calls running past "
            f"plugin_timeout_s ({self.timeout_s:g}s), the oldest for {stuck[-1]:.0f}s; restart the service"
        )

    async def call(self, fn: Callable[[], T], deadline: float) -> T:
        """`fn()` on one of the threads, given `timeout_s` from when it starts, all within `deadline` (monotonic).

        Raises PluginTimeout when no thread was free before the deadline, or the call ran past its limit or the
        deadline; the exception `fn` raised otherwise (a BaseException as `Contained`).
        """
        loop = asyncio.get_running_loop()
        future: Future[T] = Future()
        began = loop.create_future()  # set to the start time when a thread takes the call
        queued = time.monotonic()

        def job() -> T:
            started = time.monotonic()
            loop.call_soon_threadsafe(_set_once, began, started)
            return fn()

        self._queue.put((future, job))
        waited = asyncio.wrap_future(future)
        try:
            started = await asyncio.wait_for(asyncio.shield(began), max(0.0, deadline - queued))
        except TimeoutError:
            if future.cancel():  # still queued: it will never run
                stuck = len(self.stuck())
                raise PluginTimeout(
                    f"no free thread for plug-in {self.name!r} before the request's deadline "
                    f"({time.monotonic() - queued:.1f}s queued; {stuck} of its {self.threads} threads stuck "
                    "in calls past plugin_timeout_s)"
                ) from None
            started = await began  # a thread took it just now
        except asyncio.CancelledError:
            future.cancel()
            raise
        end = min(started + self.timeout_s, deadline)
        try:
            return await asyncio.wait_for(waited, max(0.0, end - time.monotonic()))
        except TimeoutError:
            if end < started + self.timeout_s:
                raise PluginTimeout(
                    f"the request's deadline passed {end - started:.1f}s into plug-in {self.name!r} "
                    f"(its own limit: {self.timeout_s:g}s)"
                ) from None
            raise PluginTimeout(
                f"plug-in {self.name!r} gave no answer within {self.timeout_s:g}s of starting "
                "(its thread stays busy until the call returns)"
            ) from None

    def close(self) -> None:
        """Let idle threads end; a stuck one is a daemon and ends with the process."""
        for _ in range(self.threads):
            self._queue.put(None)


def _set_once(future: asyncio.Future[float], value: float) -> None:
    if not future.done():
        future.set_result(value)
