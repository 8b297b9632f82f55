"""Batches, for the zygote: one program run on many inputs (a submission's tests) in one PID namespace.

Stdlib only and run in the zygote's process, like zygote.py and the siblings it imports (confine.py, protocol.py, ...).

The namespace's pid 1 is a small supervisor that has already done what every run needs (mounts, uid, limits,
seccomp), so each run costs one posix_spawn (vfork + exec) instead of a fork of this process plus that set-up:
the per-run cost of a native program drops to about that of running it bare. Unless the service may stop the
batch after any run (a stream), the zygote keeps the next run queued with the supervisor (its stdin and pipes
already sent), which starts it the moment the last one is cleaned up: no round trip between runs.

What the runs share, and why that is safe (rootless mode: the runs' uid owns /scratch; `_scratch_state`): the supervisor runs as the runs' uid but is init with every signal
at its default (the kernel then drops signals sent from inside its namespace), not dumpable (no ptrace,
/proc/1/mem or /proc/1/fd for the same uid), and seccomp keeps prlimit64 to the caller itself. After each run
it kills every other process of the namespace (kill(-1) from init) and reaps them, so nothing a run started
survives into the next. /scratch is root-owned and sticky, the program's files root's: a run can add files but
not change the program. The next run gets a fresh namespace, exactly as a single run would have, when a run
leaves anything in /scratch, changes the supervisor's scheduling (nice, policy, CPUs, I/O priority: the same
uid may), times out without the supervisor ending it, or the supervisor is past half its CPU limit. No batches
where SysV IPC could not be switched off (PER_RUN_IPC): its objects would outlive a run unseen.

As in a single run (init.c), the program is not pid 1: signals it sends itself act, as they do outside the sandbox.
"""

# Syscall-level code on purpose: plain os calls map one-to-one to what the kernel does.
# ruff: noqa: PTH116, PTH208

from __future__ import annotations

import collections
import fcntl
import json
import os
import resource as r
import select
import signal
import socket
import struct
import time

from grpo.reward.sandbox import confine, protocol, rlimits, run_files, run_output

HELD_REPLY_BYTES = 4 << 20  # replies held back before they are written anyway
HELD_REPLY_S = 0.5  # ... or for this long
BATCH_SLACK_S = 2.0  # past a run's wall_s, how long the supervisor has to end it before the whole box is killed
BATCH_START_S = 5.0  # how long a supervisor may take to get ready
SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}


def _supervise(req: dict, uid: int, control: socket.socket) -> None:
    """Pid 1 of a batch's PID namespace: set up once, then spawn, wait for and clean up after each run."""
    try:
        # Python's own SIGINT handler would let a run interrupt us: init drops only signals left at default.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()  # a process group reaches past PID namespaces: not the zygote's (init.c's main says why)
        confine.setup_mounts()
        confine.first_to_die()
        for fd in map(int, os.listdir("/proc/self/fd")):  # whatever else the zygote had open (a prepared run's)
            if fd >= 5 and fd != control.fileno():
                try:
                    os.close(fd)
                except OSError:
                    pass  # the listing's own fd, already closed
        # Our two fds above the runs' 0-4 and, now that nothing else is open, low: posix_spawn refuses an fd at
        # or past RLIMIT_NOFILE (256 for the runs, ours too), and the zygote may have had hundreds open.
        low = control.detach()
        control = socket.socket(fileno=fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 64))
        os.close(low)
        low = os.open("/dev/null", os.O_RDWR)
        null = fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 64)  # never one of a run's target fds
        os.close(low)
        for fd in range(5):  # the service's pipes go; received fds land above the runs' targets 0-4
            os.dup2(null, fd, inheritable=False)
        confine.become(uid)
        confine.check(confine.libc.prctl(confine.PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
        os.chdir("/scratch")
        rlimits.set_limits(rlimits.rlimits(rlimits.beside_init(req["limits"])))  # + the supervisor
        confine.install_seccomp(confine.SECCOMP)
        ioprio_get = SYS_IOPRIO_GET[os.uname().machine]
        scheduling = _scheduling(ioprio_get)
        control.send(b'{"ready": true}')
    except BaseException as exc:
        control.send(json.dumps({"setup_error": f"{type(exc).__name__}: {exc}"}).encode())
        os._exit(127)
    cpu_limit, program = int(req["limits"]["cpu_s"]), _scratch_state()
    try:
        running = _spawn(req, _next_run(control), null)
        while True:
            reply, pending = _wait(running, control) if "pid" in running else (running, None)
            used = r.getrusage(r.RUSAGE_SELF)
            reply["retire"] = (
                "status" not in reply  # the spawn failed: the zygote closes this box
                or used.ru_utime + used.ru_stime >= cpu_limit / 2
                or _scheduling(ioprio_get) != scheduling
                or _scratch_state() != program  # a run left or changed a file: the next must not see it
            )
            if reply["retire"]:
                control.send(json.dumps(reply).encode())
                os._exit(0)  # not the queued run: the zygote starts it in a fresh namespace
            # The queued run starts before this reply goes: the zygote, woken by it, takes the CPU from us for as
            # long as it handles it, and that now overlaps the next run instead of delaying it.
            if pending is not None:
                running = _spawn(req, pending, null)
            control.send(json.dumps(reply).encode())
            if pending is None:
                running = _spawn(req, _next_run(control), null)
    except BaseException as exc:  # our own failure, never the program's: the run is a sandbox error
        control.send(json.dumps({"setup_error": f"batch supervisor: {type(exc).__name__}: {exc}"}).encode())
    finally:
        os._exit(127)


def _scratch_state() -> tuple:
    """What a run may have changed in /scratch: its names, and each entry's inode, mode and change time (a write,
    chmod or rename sets the ctime; no call sets it back), and the folder's own mode. In rootless mode a run's uid
    owns /scratch and the program's files (there is one uid), so it could rewrite the program for the next run,
    not only add files: either way the next run gets a fresh namespace."""
    entries = []
    for name in sorted(os.listdir("/scratch")):
        st = os.stat("/scratch/" + name, follow_symlinks=False)
        entries.append((name, st.st_ino, st.st_mode, st.st_ctime_ns))
    return os.stat("/scratch").st_mode, tuple(entries)


def _receive(control: socket.socket) -> dict:
    """The zygote's next message, a run ({"run": index, "timeout_s": ..., "wall_s": ...} with fds 0-2) or
    {"kill": index}; at EOF our exit."""
    message, fds = protocol.receive_fds(control, 4096, 3)
    if not message:
        os._exit(0)  # the zygote closed the batch: our exit takes the namespace with it
    return {**json.loads(message), "fds": fds}


def _scheduling(ioprio_get: int) -> tuple:
    """What a run of the same uid could change about the supervisor, and so about every later run it spawns."""
    ioprio = confine.libc.syscall(ioprio_get, 1, 0)  # IOPRIO_WHO_PROCESS, this process
    return os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getaffinity(0), ioprio


def _next_run(control: socket.socket) -> dict:
    """The zygote's next run, past any kill for a run that had already ended."""
    while "run" not in (message := _receive(control)):
        pass
    return message


def _spawn(req: dict, run: dict, null: int) -> dict:
    """Start one run: the program exec'd on fds 0-2 (/dev/null on 3 and 4). What `_wait` needs, or, where the
    spawn failed, its reply."""
    fds, started = run["fds"], time.monotonic()
    try:
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate([*fds, null, null])]
        pid = os.posix_spawn(
            req["argv"][0], req["argv"], req["env"], file_actions=actions, setsigdef=confine.DEFAULT_SIGNALS
        )
    except OSError as exc:
        return {"setup_error": f"{type(exc).__name__}: {exc}"}
    finally:
        for fd in fds:
            os.close(fd)
    return {"pid": pid, "run": run["run"], "timeout_s": run["timeout_s"], "wall_s": run["wall_s"], "started": started}


def _wait(run: dict, control: socket.socket) -> tuple[dict, dict | None]:
    """Wait for a run `_spawn` started (kill it at its CPU-time or wall-clock limit, reading its CPU time every
    CPU_POLL_S: run_output.py; or when the zygote asks), then kill and reap whatever else it left in the
    namespace. The zygote may queue the next run meanwhile: (this run's reply, the queued run or None)."""
    pid, started, queued = run["pid"], run["started"], None
    exited = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(exited, select.POLLIN)
    poller.register(control, select.POLLIN)
    deadline, why = started + run["wall_s"], None
    while why is None:
        left = deadline - time.monotonic()
        wait = min(left, run_output.CPU_POLL_S)
        events = dict(poller.poll(max(1, int(wait * 1000) + 1))) if left > 0 else {}
        if exited in events:
            break
        if left <= 0 or run_output.over_cpu(run_output.stat_cpu_s(pid) or 0.0, run):
            why = "timeout"
        elif control.fileno() in events:
            said = _receive(control)
            if "run" in said:
                if queued is not None:
                    raise OSError("the zygote queued a second run")
                queued = said
            elif said["kill"] == run["run"]:
                why = "killed"  # the zygote saw the output limit
    os.close(exited)
    if why is not None:
        os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    try:
        os.kill(-1, signal.SIGKILL)  # from init: every other process of this namespace
    except ProcessLookupError:
        pass
    try:
        while True:  # orphans are re-parented to us; once none is left, the namespace holds only us
            os.waitpid(-1, 0)
    except ChildProcessError:
        pass
    cpu_s, wall_s = usage.ru_utime + usage.ru_stime, time.monotonic() - started
    if why is None and run_output.over_cpu(cpu_s, run):
        why = "timeout"
    return {"status": status, "why": why, "cpu_s": cpu_s, "peak_mb": usage.ru_maxrss / 1024, "wall_s": wall_s}, queued


class Box:
    """The zygote's side of a batch: the shared scratch, the supervisor, and runs queued with it, run one at a time."""

    def __init__(self, req: dict, uid: int, pidns_fd: int) -> None:
        confine.mount_scratch(req["limits"]["scratch_mb"], uid, shared=True)
        try:
            run_files.write_files(req, 0o555)
            self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            confine.unshare(confine.CLONE_NEWPID)
            try:
                self.pid = os.fork()
                if self.pid == 0:
                    try:
                        self.control.close()
                        os.close(pidns_fd)
                        _supervise(req, uid, theirs)
                    finally:  # never back into the zygote's loop
                        os._exit(127)
            finally:
                confine.check(confine.libc.setns(pidns_fd, confine.CLONE_NEWPID), "setns back to own pid namespace")
            theirs.close()
        except BaseException:
            confine.check(confine.libc.umount2(b"/scratch", confine.MNT_DETACH), "umount scratch")
            raise
        self.sent = 0
        ready = select.select([self.control], [], [], BATCH_START_S)[0] and self._said()
        self.answered = time.monotonic()
        if not ready or not ready.get("ready"):
            self.close()
            raise OSError(f"the batch supervisor did not start: {ready and ready.get('setup_error')}")

    def start(self, stdin: bytes | int, limits: dict) -> dict:
        """Queue one run with the supervisor: its index, stdin, fresh pipes for its output, and its limits. It
        starts once the run before it has ended. (Batches are for stdin/stdout tests, so no proof of
        completion: fds 3 and 4 are /dev/null.)"""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        theirs = [run_files.stdin_fd(stdin), out_w, err_w]
        index, self.sent = self.sent, self.sent + 1
        try:
            message = json.dumps({"run": index, "timeout_s": limits["timeout_s"], "wall_s": limits["wall_s"]}).encode()
            socket.send_fds(self.control, [message], theirs)
        except OSError:
            pass  # the supervisor is gone; its setup error, if any, is waiting to be read
        finally:
            for fd in theirs:
                os.close(fd)
        return {"readers": {"out": out_r, "err": err_r}, "index": index, "queued": time.monotonic()}

    def finish(self, run: dict, limits: dict) -> tuple[dict, bool]:
        """Wait for the oldest queued run: (its reply, whether this box can take the next run)."""
        readers = run["readers"]
        started = max(run["queued"], self.answered)  # it started when the run before it was answered
        deadline = started + limits["wall_s"] + BATCH_SLACK_S  # the supervisor ends a run by its wall_s
        try:
            verdict, got = run_output.read_outputs(self.control.fileno(), readers, limits, deadline)
        finally:
            self.discard(run)
        answered = verdict is None
        if verdict == "output_limit":  # the supervisor kills the run and answers
            try:
                self.control.send(json.dumps({"kill": run["index"]}).encode())
            except OSError:
                pass
            answered = run_output.read_outputs(self.control.fileno(), {}, limits, deadline)[0] is None
        said = self._said() if answered else {}
        self.answered = time.monotonic()
        if "status" not in said:  # no answer in time, or a dead supervisor: this box is done
            reply = {"verdict": verdict, "setup_error": said.get("setup_error", ""), "wall_s": self.answered - started}
            if not reply["setup_error"] and verdict is None:
                reply["setup_error"] = "the batch supervisor exited"
            return {**reply, **run_output.outcome(got, limits, None, None, 0.0, 0.0)}, False
        verdict = verdict or {"timeout": "timeout", "killed": "output_limit"}.get(said["why"])
        reply = {"verdict": verdict, "setup_error": "", "wall_s": said["wall_s"]}
        outcome = run_output.outcome(got, limits, None, said["status"], said["cpu_s"], said["peak_mb"])
        return {**reply, **outcome}, not said["retire"]

    @staticmethod
    def discard(run: dict) -> None:
        """Close a run's output pipes: read, or never to be (its box is closing)."""
        for fd in run["readers"].values():
            os.close(fd)
        run["readers"] = {}

    def _said(self) -> dict:
        try:
            return json.loads(self.control.recv(65536) or b"{}")
        except OSError:
            return {}

    def close(self) -> None:
        """Kill the supervisor (its namespace dies with it), reap it, and unmount the scratch (once)."""
        if self.control.fileno() < 0:
            return
        self.control.close()
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        confine.check(confine.libc.umount2(b"/scratch", confine.MNT_DETACH), "umount scratch")


def _next_refused() -> bool:
    """A stream's answer after a reply: anything but "next" (a stop, or the service gone) ends the batch."""
    return (protocol.read_msg(0) or {}).get("control") != "next"


def _stop_requested() -> bool:
    """The service sent its closing control message before the end (a stop), or is gone."""
    if not select.select([0], [], [], 0)[0]:
        return False
    protocol.read_msg(0)
    return True


def _write_held(held: list[bytes]) -> None:
    protocol.write_all(1, b"".join(struct.pack(">I", len(body)) + body for body in held))
    held.clear()


def run_batch(req: dict, uid: int, pidns_fd: int, stdins: list[bytes | int]) -> None:
    """Run req's program once per stdin, one reply each, then {"end": true}; then take the service's closing
    control message ("close", or "stop" when it wanted no more runs) unless a stop already came.

    A stream (the service may stop early) waits after each reply for "next" or "stop". Otherwise the supervisor
    always has the next run queued, so it starts it the moment the last one is cleaned up, and replies are held
    and written together (at most HELD_REPLY_S apart): the zygote's own work overlaps the program's, and a
    service woken for every reply would take CPU from the runs.
    """
    if confine.PER_RUN_IPC:
        raise OSError("no batches where SysV IPC is not disabled")
    limits, stream, held, stopped = req["limits"], bool(req.get("stream")), [], False
    depth = 1 if stream else 2  # runs queued with the supervisor, the running one included
    written = time.monotonic()
    box, queued = Box(req, uid, pidns_fd), collections.deque[dict]()
    try:
        for i in range(len(stdins)):
            while len(queued) < depth and i + len(queued) < len(stdins):
                queued.append(box.start(stdins[i + len(queued)], limits))
            reply, keep = box.finish(queued.popleft(), limits)
            held.append(json.dumps({"files": {}, "collect_error": "", **reply}).encode())
            more = i + 1 < len(stdins)
            if stream or sum(map(len, held)) > HELD_REPLY_BYTES or time.monotonic() - written > HELD_REPLY_S:
                _write_held(held)
                written = time.monotonic()
            stopped = more and (_next_refused() if stream else _stop_requested())
            if stopped:
                break
            if more and not keep:  # what was queued here runs again in a fresh box
                while queued:
                    box.discard(queued.popleft())
                box.close()
                box = Box(req, uid, pidns_fd)
    except BaseException:
        while queued:
            box.discard(queued.popleft())
        box.close()
        raise
    _write_held([*held, b'{"end": true}'])  # before the clean-up: the caller need not wait for the namespace to go
    while queued:
        box.discard(queued.popleft())
    try:
        box.close()
    except BaseException:  # the end is written: an error reply now would answer the service's next request.
        os._exit(1)  # The service finds the zygote gone at its next request (that one fails) and replaces it.
    if not stopped:
        protocol.read_msg(0)
