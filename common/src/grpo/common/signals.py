"""Shutdown on SIGTERM / SIGINT for the services' main threads."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import NoReturn

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
    ignored until the orchestrator's kill.
    """

    def on_signal(signum: int, frame: FrameType | None) -> None:
        exit_at_once(signum, phase)

    previous = {sig: signal.signal(sig, on_signal) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_at_once(signum: int, phase: str) -> NoReturn:
    """From a signal handler: SIGTERM our child processes, then end this process with code 128 + signum.

    Not by raising SystemExit: the handler runs wherever the main thread happens to be, often deep in a
    library's import or model load, and the exception did not always get out. transformers' lazy
    imports turned it into a ModuleNotFoundError (exit 1), and in CI one went missing altogether and
    start-up went on to serve. Nothing is kept during start-up, so there is nothing to unwind; child
    processes (vLLM's engine core, compile workers) stop on their own SIGTERM.
    """
    try:
        log.info("signal %s during %s: exiting", signal.Signals(signum).name, phase)
        for pid in descendants(os.getpid(), process_parents()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:  # the main thread may hold a stream's lock (a reentrant flush raises): exit regardless
        os._exit(128 + signum)


def descendants(pid: int, parent_of: Mapping[int, int]) -> list[int]:
    """Every process below `pid` in the tree that `parent_of` (pid -> parent pid) describes, nearest first."""
    children: dict[int, list[int]] = {}
    for child, parent in parent_of.items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = [pid]
    while todo:
        below = children.get(todo.pop(0), [])
        found += below
        todo += below
    return found


def process_parents(proc: Path = Path("/proc")) -> dict[int, int]:
    """pid -> parent pid for every process visible in `proc`."""
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")".
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents
