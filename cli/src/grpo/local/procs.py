"""The one launcher: start a child process with a log file, wait until it is ready, stop it.

Used by `grpo demo`, `grpo up`, the benchmarks and the tests. Each child gets its own session
(process group), so a Ctrl-C in the terminal reaches only us, and stopping a child stops everything
it started: SIGTERM to the group, then SIGKILL after a grace period. Children of an attached
Supervisor also get PR_SET_PDEATHSIG, so even a SIGKILLed launcher leaves none behind.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

log = logging.getLogger(__name__)


class ChildFailed(RuntimeError):
    """A child exited or never became healthy; the message names it and quotes its log. `exit_code` is what
    `grpo up` exits with: 2 when the child refused its settings or data (its own exit 2), else 1."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# How a child says a port was taken: our services' own line, or a bind error from deeper down (errno 98). A
# launcher picks a free port before the child binds it, so another process may take it in between; the launchers
# then start the child again on fresh ports, this many times in all.
PORT_CLASH = ("is in use by another process", "Address already in use")
PORT_ATTEMPTS = 3


def port_clash(exc: ChildFailed) -> bool:
    return any(clash in str(exc) for clash in PORT_CLASH)


# PR_SET_PDEATHSIG is set by this trampoline, which then execs the command, not by a preexec_fn: subprocess
# runs a preexec_fn in a fork() of the launcher, and grpcio (1.80 and later) restarts its poller in every
# fork child, where it aborts on the epoll fd that close_fds has closed (grpc/grpc#43055: 17 of 500 such
# spawns here while a channel was busy, SIGABRT before exec). Without one, subprocess uses vfork and no fork
# handler runs. argv: the launcher's pid, then the command.
DIE_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the launcher died before prctl: nobody will stop us
    sys.exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def with_death_signal(cmd: Sequence[str]) -> list[str]:
    """`cmd` run so that it gets SIGTERM when the calling thread ends (Linux; elsewhere `cmd` as it is)."""
    if not sys.platform.startswith("linux"):  # stop_all still covers every normal exit
        return list(cmd)
    return [sys.executable, "-I", "-S", "-c", DIE_WITH_PARENT, str(os.getpid()), *cmd]


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Child:
    """One started process."""

    name: str
    cmd: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes]
    ports: dict[str, int] = field(default_factory=dict)
    create_time: float = 0.0  # the kernel's start time: with the PID it identifies the process (no recycling)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def failure(self, why: str) -> ChildFailed:
        return ChildFailed(
            f"{self.name} (pid {self.pid}) {why}; last log lines of {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float) -> None:
        """Poll `ready` until it is true; ChildFailed if the child exits or the deadline passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                failed = self.failure(f"exited with code {self.proc.returncode} while starting")
                failed.exit_code = 2 if self.proc.returncode == 2 else 1  # a refusal at start-up, as the child said
                raise failed
            if ready():
                return
            time.sleep(0.1)
        raise self.failure(f"was not ready after {timeout_s:.0f}s")

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM its process group, SIGKILL after `grace_s`; returns the exit code (None if it survived)."""
        stop_pids([self.pid], grace_s, [self.proc])
        try:
            return self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            log.error("%s (pid %d) survived SIGKILL", self.name, self.pid)
            return None


def spawn(
    name: str,
    cmd: Sequence[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    die_with_parent: bool = False,
    **ports: int,
) -> Child:
    """Start `cmd` in its own session, stdout and stderr appended to `log_path`.

    `die_with_parent` (PR_SET_PDEATHSIG) fires when the starting *thread* ends, so leave it off for
    children started from a short-lived thread."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            with_death_signal(cmd) if die_with_parent else list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    log.info("started %s (pid %d), log %s", name, proc.pid, log_path)
    return Child(name, list(cmd), log_path, proc, dict(ports), started_at(proc.pid))


def launch(
    name: str,
    cmd: Sequence[str],
    log_path: Path,
    ready: Callable[[], bool],
    *,
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
) -> Child:
    """spawn, then wait until `ready()` (e.g. `functools.partial(http_ok, url)`); stopped again on failure."""
    child = spawn(name, cmd, log_path, env=env)
    try:
        child.wait_ready(ready, timeout_s)
    except BaseException:
        child.stop(grace_s=5.0)
        raise
    return child


def started_at(pid: int) -> float:
    """The process's start time (psutil), 0.0 when it is already gone."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0


def same_process(pid: int, create_time: float) -> bool:
    """The PID still belongs to the process we started (redis-server rewrites its command line, so not cmdline)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and abs(proc.create_time() - create_time) < 0.01
    except psutil.Error:
        return False


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


def stop_pid(pid: int, grace_s: float = 15.0) -> bool:
    """SIGTERM the process group led by `pid`, SIGKILL it after `grace_s`; True when it is gone."""
    return stop_pids([pid], grace_s)[0]


def stop_pids(
    pids: Sequence[int], grace_s: float = 15.0, procs: Sequence[subprocess.Popen[bytes]] | None = None
) -> list[bool]:
    """stop_pid for several groups at once: one shared grace period, not one each. Pass our own children's
    `procs` (same order) so they are reaped through Popen and keep their exit codes."""
    reap = dict(zip(pids, procs or [], strict=False))
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(pid, reap.get(pid)) for pid in pids):
        time.sleep(0.05)
    survivors = [pid for pid in pids if _group_alive(pid, reap.get(pid))]
    for pid in survivors:
        log.warning("pid %d did not stop within %.0fs: SIGKILL", pid, grace_s)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if survivors:
        time.sleep(0.2)
    return [not _group_alive(pid, reap.get(pid)) for pid in pids]


def _group_alive(pgid: int, proc: subprocess.Popen[bytes] | None = None) -> bool:
    """True while any process of the group exists (a zombie leader that is our child is reaped first)."""
    if proc is not None:
        proc.poll()  # reaps through Popen, which keeps the exit code
    else:
        try:
            os.waitpid(pgid, os.WNOHANG)
        except ChildProcessError:  # not our child (e.g. `grpo down`): init reaps it
            pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Supervisor:
    """Starts children and stops every one of them on exit (context manager)."""

    def __init__(self, log_dir: Path, *, detach: bool = False) -> None:
        self.log_dir = log_dir
        self.detach = detach
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, cmd: Sequence[str], env: dict[str, str] | None = None, **ports: int) -> Child:
        child = spawn(name, cmd, self.log_dir / f"{name}.log", env=env, die_with_parent=not self.detach, **ports)
        self.children.append(child)
        return child

    def wait_ready(self, child: Child, ready: Callable[[], bool], timeout_s: float) -> None:
        child.wait_ready(ready, timeout_s)

    def check(self, names: Sequence[str] | None = None) -> None:
        """ChildFailed for the first (named) child that is no longer running."""
        for child in self.children:
            if (names is None or child.name in names) and not child.alive():
                raise child.failure(f"exited with code {child.proc.returncode}")

    def stop_all(self, grace_s: float = 15.0) -> None:
        """The last started (the trainer: it checkpoints while Redis and the replicas are still up), then the rest
        at once, so Ctrl-C takes at most two grace periods whatever the number of replicas."""
        self.stop_since(0, grace_s)

    def stop_since(self, first: int, grace_s: float = 15.0) -> None:
        """Stop the children started from index `first` on (stop_all's order) and forget them."""
        newest_first = list(reversed(self.children[first:]))
        for batch in (newest_first[:1], newest_first[1:]):
            gone_list = stop_pids([c.pid for c in batch], grace_s, [c.proc for c in batch])
            for child, gone in zip(batch, gone_list, strict=True):
                if gone:
                    log.info("stopped %s (pid %d)", child.name, child.pid)
                else:
                    log.error("%s (pid %d) survived SIGKILL", child.name, child.pid)
                try:
                    child.proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
        del self.children[first:]

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.detach:
            self.stop_all()
