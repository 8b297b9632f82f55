"""Shutdown on SIGTERM / SIGINT for the services' main threads."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(stop: threading.Event | None = None) -> threading.Event:
    """An event set by SIGTERM or SIGINT (call from the main thread); the service drains and exits when it is."""
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: shutting down", signal.Signals(signum).name)
        stop.set()

    for sig in _SIGNALS:
        signal.signal(sig, on_signal)
    return stop


@contextlib.contextmanager
def exit_on_signals(phase: str) -> Iterator[None]:
    """While `phase` runs (loading a model can take minutes), SIGTERM/SIGINT exit at once.

    Nothing polls a stop event before the servers are up, so a signal that only set one would be
    ignored until the orchestrator's kill; here it raises SystemExit in the main thread instead.
    """

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s during %s: exiting", signal.Signals(signum).name, phase)
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
