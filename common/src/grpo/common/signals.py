"""Shutdown on SIGTERM / SIGINT for the services' main threads."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (call from the main thread); the service drains and exits when it is."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
