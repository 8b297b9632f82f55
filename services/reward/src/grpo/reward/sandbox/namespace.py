"""The default sandbox: a pool of zygote processes (zygote.py) that each fork one namespaced run at a time.

One zygote's pipes and protocol are zygote_client.py's; how a reply becomes a status is verdicts.py's.
"""

from __future__ import annotations

import base64
import logging
import os
import queue
import threading
import time
from collections.abc import Collection, Generator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from grpo.reward.sandbox.base import (
    DEFAULT_IDLE_FACTOR,
    DEFAULT_MAX_OUTPUT_BYTES,
    ExecResult,
    Limits,
    RunCancelled,
    Sandbox,
    SandboxUnavailable,
    check_text,
)
from grpo.reward.sandbox.init_program import init_program
from grpo.reward.sandbox.languages import Launch, available
from grpo.reward.sandbox.verdicts import classify, image_mb
from grpo.reward.sandbox.zygote_client import REMEDY, Zygote, ZygoteError

log = logging.getLogger(__name__)

RUN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/scratch", "LANG": "C.UTF-8", "TMPDIR": "/scratch"}
REPLY_SLACK_S = 5.0  # the zygote enforces a run's limits itself; this only catches a wedged zygote
MODES = ("auto", "root", "rootless")
NEVER_UNCONFINED = "the sandbox never falls back to running code unconfined"
ISOLATION = (
    "linux namespaces (pid, mount, net, ipc, uts) from a zygote pool: minimal read-only root (/usr, /bin, /lib*), "
    "private size-capped tmpfs scratch, own /proc, no network interface up, SysV IPC disabled, unprivileged "
    "per-worker uid, no capabilities, no_new_privs, seccomp (no new namespaces, ptrace, bpf, io_uring, perf, "
    "keyrings, mounts), rlimits (address space, cpu, nproc, fsize, nofile), whole PID namespace killed at the time "
    "limit (CPU time, read while it runs) or the wall-clock limit; "
    "a program's stdin/stdout tests batched in one namespace under an unprivileged pid-1 supervisor that spawns each "
    "run and kills all it left"
)
ROOTLESS_ISOLATION = (
    "rootless mode (no root, no capability outside the sandbox's own user namespace): as root mode but every run "
    "under the one uid mapped (0 of that namespace, the service's uid outside), each run in a user namespace of its "
    "own (its process count), /proc hidepid=2 with /proc/sys read-only"
)


def root_capable() -> bool:
    """Root with the capabilities root mode uses (CAP_KILL 5, SETGID 6, SETUID 7, SYS_ADMIN 21) in effect."""
    if os.geteuid() != 0:
        return False
    try:
        with Path("/proc/self/status").open() as f:
            effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    needed = (1 << 5) | (1 << 6) | (1 << 7) | (1 << 21)
    return effective & needed == needed


def _default_interpreter() -> str:
    """A python3 that lives under the read-only binds (the service's own venv is hidden from runs)."""
    for path in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(path).exists():
            return path
    raise SandboxUnavailable("no /usr/bin/python3 or /usr/local/bin/python3 to run sandboxed programs with")


def request_for(launch: Launch, limits: Limits) -> dict[str, Any]:
    """The zygote's request: what to write, what to exec, with which limits (stdin follows it raw). `limits` has
    its output cap and wall-clock limit resolved (NamespaceSandbox._limits)."""
    resident_extra = launch.extra_memory_mb if launch.resident_extra_mb is None else launch.resident_extra_mb
    return {
        "argv": launch.argv,
        "files": launch.files,
        "collect": list(launch.collect),
        "env": {**RUN_ENV, **launch.env},
        "limits": {
            "timeout_s": limits.timeout_s,
            "wall_s": limits.wall_s,
            "memory_mb": limits.memory_mb + launch.extra_memory_mb,
            "resident_mb": limits.memory_mb + resident_extra,
            "memory_kind": launch.memory_kind,
            "stack_mb": launch.stack_mb,
            "collect_max_bytes": launch.collect_max_bytes or limits.scratch_mb << 20,
            "max_output_bytes": limits.max_output_bytes,
            "max_processes": limits.max_processes,
            "max_file_bytes": limits.max_file_bytes,
            "scratch_mb": limits.scratch_mb,
            "cpu_s": limits.effective_cpu_s(),
        },
    }


BATCH_MIN_MEMORY_MB = 64  # a batch's supervisor lives under the runs' memory limit; below this it would not fit
BATCH_RUN_SLACK_S = 8.0  # past a run's wall_s: batch.py's BATCH_SLACK_S, BATCH_START_S and HELD_REPLY_S


class NamespaceSandbox(Sandbox):
    """A pool of `workers` zygotes; each run takes a free one, so runs proceed in parallel on all cores.

    Zygotes are started only by one long-lived spawner thread: their parent-death signal fires when the
    *thread* that started them ends, so a zygote started from a short-lived request thread would die with it.
    """

    isolation = ISOLATION

    def __init__(
        self,
        workers: int = 2,
        interpreter: str | None = None,
        uid_base: int = 200_000,
        acquire_timeout_s: float = 600.0,
        languages: Collection[str] | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        mode: str = "auto",
        user: int | None = None,
        idle_factor: float = DEFAULT_IDLE_FACTOR,
    ) -> None:
        """`idle_factor`: a run's wall-clock limit as a multiple of its timeout_s where its limits set none.
        `mode`: root (today's: root with four capabilities, a uid per worker), rootless (a user namespace, no
        privilege: docs/reward.md#sandbox-modes), or auto (root where root mode's capabilities are in effect, else
        rootless). `user`: a root service starts its zygotes as this uid and gid, rootless (tests run that way)."""
        self.mode = self._resolve_mode(mode, user)
        self._user = user
        self.workers = workers
        self.max_output_bytes = max_output_bytes  # the stdout cap of runs whose limits set none
        self.idle_factor = idle_factor
        self.acquire_timeout_s = acquire_timeout_s
        self.interpreter = interpreter or _default_interpreter()
        self.languages = available(self.interpreter)
        if languages is not None:  # the operator's subset (settings.languages)
            missing = sorted(set(languages) - set(self.languages))
            if missing:
                raise SandboxUnavailable(f"languages {missing} are not installed here (installed: "
                                         f"{sorted(self.languages)})")  # fmt: skip
            self.languages = {name: tools for name, tools in self.languages.items() if name in languages}
        self.init = init_program()  # held open while the sandbox lives: every zygote binds this very file
        how = (
            "set up by a forked Python init (no init.c)" if self.init is None else "spawned by a static C init (init.c)"
        )
        isolation = ISOLATION if self.mode == "root" else f"{ISOLATION}; {ROOTLESS_ISOLATION}"
        self.isolation = f"{isolation}; single runs {how}"
        self._uid_base = uid_base
        self._idle: queue.Queue[Zygote] = queue.Queue()
        self._lock = threading.Lock()
        self._all: list[Zygote] = []
        self._closed = False
        self._spawns: queue.Queue[Future[Zygote] | None] = queue.Queue()
        self._spawner = threading.Thread(target=self._spawn_loop, name="sandbox-spawner", daemon=True)
        self._spawner.start()
        try:
            for future in [self._request_spawn() for _ in range(workers)]:
                self._idle.put(future.result())
        except SandboxUnavailable as exc:
            self.close()
            if mode == "auto" and self.mode == "rootless" and user is None:  # and why root mode was not tried
                raise SandboxUnavailable(
                    f"no sandbox: not root with root mode's capabilities (uid {os.geteuid()}; {REMEDY}), and rootless "
                    f"mode failed: {exc}; {NEVER_UNCONFINED}"
                ) from exc
            raise SandboxUnavailable(f"{exc}; {NEVER_UNCONFINED}") from exc
        except BaseException:
            self.close()
            raise
        log.info("sandbox mode: %s (%d zygotes)", self.mode, workers)

    @staticmethod
    def _resolve_mode(mode: str, user: int | None) -> str:
        """The mode to run: `mode` checked against what this process is, auto decided."""
        if mode not in MODES:
            raise ValueError(f"unknown sandbox mode {mode!r}; choose one of {', '.join(MODES)}")
        if user is not None:
            if mode == "root":
                raise ValueError("a sandbox started as another user runs rootless, not in root mode")
            if os.geteuid() != 0:
                raise SandboxUnavailable(f"starting the sandbox as uid {user} takes root; running as {os.geteuid()}")
            return "rootless"
        if mode == "root" and os.geteuid() != 0:
            raise SandboxUnavailable(f"sandbox mode root: running as uid {os.geteuid()}, not root: {REMEDY}")
        if mode == "auto":
            return "root" if root_capable() else "rootless"
        return mode

    def _request_spawn(self) -> Future[Zygote]:
        future: Future[Zygote] = Future()
        self._spawns.put(future)
        return future

    def _spawn_loop(self) -> None:
        while (future := self._spawns.get()) is not None:
            try:
                zygote = Zygote(self.interpreter, self._uid_base, self.init, self.mode == "rootless", self._user)
            except Exception as exc:
                future.set_exception(exc)
                continue
            with self._lock:
                if self._closed:
                    zygote.kill()
                    future.set_exception(SandboxUnavailable("sandbox is closed"))
                    continue
                self._all.append(zygote)
            future.set_result(zygote)

    def _retire(self, zygote: Zygote) -> None:
        zygote.kill()
        with self._lock:
            if zygote in self._all:
                self._all.remove(zygote)

    def _limits(self, limits: Limits | None) -> Limits:
        """`limits` (or the defaults) checked, with this sandbox's stdout cap and wall-clock limit where they set
        none."""
        limits = limits or Limits()
        if limits.max_output_bytes is None:
            limits = replace(limits, max_output_bytes=self.max_output_bytes)
        limits = replace(limits, wall_s=limits.wall_limit_s(self.idle_factor))
        limits.validate()
        return limits

    def execute(
        self, launch: Launch, stdin: str = "", limits: Limits | None = None, cancel: threading.Event | None = None
    ) -> ExecResult:
        limits = self._limits(limits)
        check_text(launch, [stdin])
        req = request_for(launch, limits)
        image = image_mb(launch)
        zygote = self._take()
        if zygote is None:
            why = "sandbox is closed" if self._closed else f"no sandbox worker free within {self.acquire_timeout_s}s"
            return ExecResult("sandbox_error", None, "", why, 0.0)
        started = time.monotonic()
        try:
            deadline = started + limits.wall_limit_s(self.idle_factor) + REPLY_SLACK_S
            reply = zygote.request(req, deadline, stdin.encode(), launch.binary_files, launch.held, cancel)
        except RunCancelled:
            self._replace(zygote)  # killing the zygote kills the run's whole PID namespace
            raise
        except (ZygoteError, OSError, ValueError) as exc:
            log.error("sandbox zygote failed, restarting it: %s", exc)
            self._replace(zygote)
            return ExecResult("sandbox_error", None, "", f"sandbox failure: {exc}", time.monotonic() - started)
        if "error" in reply:  # the zygote itself raised: do not trust its state any more
            self._replace(zygote)
        else:
            self._idle.put(zygote)
        return self._result(reply, {**req, "image_mb": image}, limits, started)

    def execute_many(
        self,
        launch: Launch,
        stdins: list[str],
        limits: Limits | None = None,
        stream: bool = False,
        cancel: threading.Event | None = None,
    ) -> Generator[ExecResult, None, None]:
        """Runs of one launch, one per stdin, in one namespace on one zygote (batch.py), results in
        order. Closing the iterator early stops the batch; runs not started are not run. Once `cancel` is set, the
        zygote is killed instead (with the run under way and the one its supervisor started ahead)."""
        limits = self._limits(limits)
        check_text(launch, stdins)
        req = {**request_for(launch, limits), "batch": True, "stream": stream}
        judged = {**req, "image_mb": image_mb(launch)}  # what _result reads; not sent to the zygote
        # One run costs less as a prepared single run than a batch's set-up and tear-down.
        if req["limits"]["memory_mb"] < BATCH_MIN_MEMORY_MB or launch.collect or len(stdins) <= 1:
            yield from super().execute_many(launch, stdins, limits, cancel=cancel)
            return
        zygote = self._take()
        if zygote is None:
            why = "sandbox is closed" if self._closed else f"no sandbox worker free within {self.acquire_timeout_s}s"
            for _ in stdins:
                yield ExecResult("sandbox_error", None, "", why, 0.0)
            return
        if not zygote.batches:
            self._idle.put(zygote)
            yield from super().execute_many(launch, stdins, limits, cancel=cancel)
            return
        done, healthy, failure = 0, False, ""
        try:
            zygote.send(req, blobs=launch.binary_files, stdins=[s.encode() for s in stdins], holdable=launch.held)
            while "end" not in (reply := zygote.receive(self._batch_deadline(limits), cancel)):
                if "error" in reply:
                    raise ZygoteError(reply["error"])
                done += 1
                yield self._result(reply, judged, limits, time.monotonic() - reply.get("wall_s", 0.0))
                if stream and done < len(stdins):
                    zygote.control("next")
            zygote.control("close")
            if done < len(stdins):
                raise ZygoteError(f"the batch ended after {done} of {len(stdins)} runs")
            healthy = True
        except GeneratorExit:  # the caller wants no more runs: stop the batch, keep the zygote (unless cancelled)
            healthy = not (cancel is not None and cancel.is_set()) and self._stop(zygote, limits)
            raise
        # RunCancelled passes through: not healthy, so `finally` kills the zygote with its runs.
        except (ZygoteError, OSError, ValueError) as exc:
            log.error("sandbox zygote failed in a batch, restarting it: %s", exc)
            failure = f"sandbox failure: {exc}"
        finally:
            if healthy:
                self._idle.put(zygote)
            else:
                self._replace(zygote)
        for _ in range(len(stdins) - done if failure else 0):
            yield ExecResult("sandbox_error", None, "", failure, 0.0)

    def _batch_deadline(self, limits: Limits) -> float:
        """When the next reply of a batch is overdue: held replies are written at least once a run (or every
        HELD_REPLY_S), a run ends by its wall_s plus the zygote's slack, and a fresh namespace may start first."""
        return time.monotonic() + limits.wall_limit_s(self.idle_factor) + BATCH_RUN_SLACK_S + REPLY_SLACK_S

    def _stop(self, zygote: Zygote, limits: Limits) -> bool:
        """Send a batch's "stop" and read replies up to its end; False when the zygote did not play along."""
        try:
            zygote.control("stop")
            while "end" not in zygote.receive(self._batch_deadline(limits)):
                pass
        except (ZygoteError, OSError, ValueError) as exc:
            log.error("sandbox zygote failed stopping a batch, restarting it: %s", exc)
            return False
        return True

    def _result(self, reply: dict[str, Any], req: dict[str, Any], limits: Limits, started: float) -> ExecResult:
        """The ExecResult of one zygote reply."""
        reply["cpu_limit_s"] = limits.effective_cpu_s()
        reply["memory_limit_mb"] = req["limits"]["resident_mb"]
        reply["rlimit_mb"] = req["limits"]["memory_mb"]
        reply["image_mb"] = req.get("image_mb", 0.0)
        status, exit_code = classify(reply)
        if status == "sandbox_error":
            detail = reply.get("error") or reply.get("setup_error")
            log.error("sandbox set-up failed: %s", detail)
            return ExecResult(status, None, "", f"sandbox failure: {detail}", time.monotonic() - started)
        if reply.get("collect_error"):
            return ExecResult("output_limit", exit_code, reply["stdout"], reply["collect_error"], reply["wall_s"])
        files = {name: base64.b64decode(data) for name, data in reply.get("files", {}).items()}
        return ExecResult(
            status, exit_code, reply["stdout"], reply["stderr"], reply["wall_s"], reply["proof"], files,
            reply.get("cpu_s", 0.0), reply.get("peak_mb", 0.0),
        )  # fmt: skip

    def _take(self) -> Zygote | None:
        """A free zygote, or None when the sandbox is closed or none became free within acquire_timeout_s."""
        deadline = time.monotonic() + self.acquire_timeout_s
        while not self._closed and time.monotonic() < deadline:
            try:
                return self._idle.get(timeout=min(0.5, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                continue
        return None

    def problem(self) -> str | None:
        """None while at least one zygote runs. Dead idle zygotes are replaced here: a server taken out of
        rotation for being unready gets no requests, so it must not wait for one to fail on them."""
        if self._closed:
            return "the sandbox is closed"
        if not self._spawner.is_alive():
            return "the sandbox's zygote spawner thread stopped"
        self._replace_dead_idle()
        with self._lock:
            running = sum(z.proc.poll() is None for z in self._all)
        if running == 0:
            return f"none of the {self.workers} sandbox zygotes is running (restarting them)"
        return None

    def _replace_dead_idle(self) -> None:
        alive: list[Zygote] = []
        while True:
            try:
                zygote = self._idle.get_nowait()
            except queue.Empty:
                break
            if zygote.proc.poll() is None:
                alive.append(zygote)
            else:
                log.error(
                    "sandbox zygote %d exited (code %s) while idle; restarting it", zygote.proc.pid, zygote.proc.poll()
                )
                self._replace(zygote)
        for zygote in alive:
            self._idle.put(zygote)

    def _replace(self, zygote: Zygote) -> None:
        """Retire `zygote` and have the spawner start a successor; retry with backoff while that fails."""
        try:
            self._retire(zygote)
        finally:  # whatever happened, the pool must not shrink
            self._respawn(0.0)

    def _respawn(self, delay_s: float) -> None:
        def done(future: Future[Zygote]) -> None:
            if future.exception() is None:
                self._idle.put(future.result())
            elif not self._closed:
                log.error("could not restart a sandbox zygote, retrying: %s", future.exception())
                threading.Timer(min(max(1.0, delay_s * 2), 30.0), self._respawn, (min(delay_s * 2 + 1, 30.0),)).start()

        if not self._closed:
            self._request_spawn().add_done_callback(done)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            zygotes = list(self._all)
        self._spawns.put(None)
        for zygote in zygotes:
            self._retire(zygote)
        self._spawner.join(timeout=30)  # a zygote it is starting may still be passed the init's fd
        if self.init is not None and not self._spawner.is_alive():
            os.close(self.init)
            self.init = None
