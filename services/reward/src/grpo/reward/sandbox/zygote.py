"""The sandbox launcher ("zygote"): a single-threaded, stdlib-only root process starting one isolated run a request.

It is started by `zygote_client.py` as `python3 -I -S zygote.py CONFIG_JSON` with an empty environment and never
imports anything from the service, only its siblings, stdlib only like it: confine.py (the kernel calls), protocol.py
(the messages and fd passing), rlimits.py, run_files.py and run_output.py (a run's limits, files and output), and
batch.py (batches). All are imported at start: once the zygote has pivoted into its root, this folder is out of reach.
It is root (root mode), or, in rootless mode, a process with no privilege that first makes a user namespace in
which it is root and becomes PID 1 of a PID namespace that namespace owns (`go_rootless`). At start it enters its own mount, network, IPC and UTS namespaces (no interface is up, not even loopback; SysV
IPC is disabled), builds a minimal read-only root (the read-only binds listed in the config, a few device nodes,
a synthetic /etc) and pivots into it, so nothing of the host (/work, /root, /home, /tmp, /proc, /sys, ...) is
reachable from it any more. Built programs the service asks it to keep go into /held, a tmpfs the runs see
read-only and cannot list; a run's program is a link into it (`stock`). Then it prepares each single run before
its request arrives (after the last reply is written, while the service reads it), and on the request
(length-prefixed JSON on stdin/stdout) hands it what to run:

    zygote ── tmpfs /scratch (size-capped), unshare(NEWPID) + posix_spawn ──▶ init.c = pid 1 of a fresh PID
                                           namespace: unshare(NEWNS); fresh /proc; oom_score_adj 1000; empty
                                           bounding set; no_new_privs; unprivileged uid (unique per zygote);
                                           not dumpable; seccomp filter; sends its mount namespace back; waits
    zygote ── the run's files into /scratch (as the run's uid), its stdin into a memfd the init holds,
              then argv, env and limits ─────────────────────────▶ rlimits; spawns the program as pid 2:
                                           fds 0-4, execve(argv) with a minimal environment; waits for it
                                           and reports its wait status on the status pipe

init.c is built by the service (init_program.py); where it cannot be, the init is a fork of this process that
sets up in Python (`_child`), the same steps. The program is the init's child, not the init: an init drops the
signals it sends itself, and a program must see what a normal process sees (its raise(SIGTERM), its abort()'s
SIGABRT), as a batch's runs always did. The init exits with the program: the kernel then kills everything left in
the PID namespace (daemons, setsid children, fork-bomb remnants), and no privileged process exists inside it. The
init shares the program's uid but is out of its reach: every signal at its default (the kernel drops what the
program sends it), not dumpable, and seccomp refuses ptrace and prlimit64 on another process. At the run's time
limit (CPU time, which the zygote reads while it waits: run_output.py), its wall-clock limit or the output limit
the zygote SIGKILLs the init, with the same effect; if the zygote dies, the parent-death signal does it. The
zygote reads stdout/stderr itself and enforces these limits, and holds the run's mount namespace until its reply
is written (`release`), so that tearing it down is not on the run's path.

A batch (many runs of one program, a submission's tests) shares one PID namespace between its runs: batch.py.

Proof of completion: the program gets fd 4 (a pipe holding a random per-run nonce) and fd 3 (an empty pipe);
a language driver copies fd 4 to fd 3 only after the user program has run to its end. The zygote compares what
arrives on fd 3 with the nonce and reports `proof`. See `languages.py` for what this does and does not prove.
"""

# Syscall-level code on purpose: plain os calls map one-to-one to what the kernel does.
# ruff: noqa: PTH100, PTH110, PTH120

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import cast

if __name__ == "__main__":
    # Run as a script with -I -S: the service's packages are neither importable nor wanted here. Empty stand-ins
    # for grpo and grpo.reward, and grpo.reward.sandbox pointing at this folder, let the siblings be imported
    # by their usual names without running any of the service's __init__ files.
    for _name, _path in (
        ("grpo", []),
        ("grpo.reward", []),
        ("grpo.reward.sandbox", [os.path.dirname(os.path.abspath(__file__))]),
    ):
        sys.modules[_name] = types.ModuleType(_name)
        sys.modules[_name].__path__ = _path  # type: ignore[attr-defined]

from grpo.reward.sandbox import batch, confine, protocol, rlimits, run_files, run_output  # after the stand-ins


def _child(uid: int, request: int, fds: list[int], status_w: int, mounted_w: int) -> None:
    """Pid 1 of a fresh PID namespace, forked before its request arrives (`prepare`) where init.c could not be
    built, doing what init.c does: mounts, unprivileged uid and seccomp first; once the request has come, the
    program forked as our child (its stdin, limits and exec), waited for, and its wait status reported on the
    status pipe (protocol.exit_record). Never returns.

    The program is not the init (an init drops the signals it sends itself: see init.c); when it exits we do,
    and the kernel kills every process it left behind. No privileged process exists inside the namespace.
    """
    try:
        # An init drops what it has no handler for, and so must we: Python's own SIGINT handler would let the
        # program interrupt our wait (a KeyboardInterrupt, and its run a sandbox error instead of a verdict).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()  # out of the zygote's process group, which reaches past PID namespaces (init.c's main says why)
        confine.setup_mounts()
        confine.first_to_die()  # as root: once the uid changes, /proc/self is no longer ours to write
        confine.become(uid)
        # The program shares our uid: neither /proc/1/mem nor /proc/1/fd may be its way into us.
        confine.check(confine.libc.prctl(confine.PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
        confine.install_seccomp(confine.SECCOMP)  # nothing below needs a call the filter denies
        protocol.send_namespace(request)
        # Set up: our mount namespace is our own (the zygote may mount again) and the CPU we used so far is not
        # the program's (`settle`).
        os.close(mounted_w)
        data, passed = protocol.receive_request(request)
        if not data:
            os._exit(0)  # discarded, or the zygote is gone
        kind, limits, argv, env = protocol.decode_request(data)  # the zygote wrote the files and stdin itself
        if kind == protocol.STDIN_PASSED:
            if passed is None:
                raise OSError("stdin: the request came without its fd")
            stdin = passed
        else:
            stdin = fds[0] if kind == protocol.STDIN_OWN else os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        program = os.fork()
        if program == 0:
            _exec_program([stdin, *fds[1:]], limits, argv, env)
        for fd in {stdin, *fds}:  # the program's fds are its own: its outputs end with it
            os.close(fd)
        status = confine.wait_for(program)
        os.write(status_w, protocol.exit_record(status))
        os._exit(0)
    except BaseException as exc:  # report through the close-on-exec status pipe; never return to the loop
        try:
            os.write(status_w, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(127)


def _exec_program(fds: list[int], limits: list[tuple[int, int]], argv: list[str], env: dict[str, str]) -> None:
    """The program, in the child `_child` forked: `fds` as its 0-4, in /scratch, under its rlimits. Never returns
    (a failure raises into `_child`'s report, made from this process before the exec)."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in fds]  # above every target
    for target, fd in enumerate(high):
        os.dup2(fd, target)  # inheritable: exactly fds 0-4 survive the exec
    os.chdir("/scratch")
    rlimits.set_limits(limits)
    for sig in confine.DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    os.execve(argv[0], argv, env)


def _spawn_init(uid: int, fds: list[int]) -> int:
    """init.c as the PID 1 of the PID namespace just unshared, `fds` its fds 0-7. A vfork and an exec: no copy of
    this interpreter is made, and none is torn down when the program is exec'd."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in fds]  # above every target
    try:
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(high)]
        flags = int(confine.PER_RUN_IPC) | int(confine.ROOTLESS) << 1  # init.c's FLAGS
        argv = [confine.INIT, str(uid), str(flags), confine.SECCOMP.hex()]
        return os.posix_spawn(confine.INIT, argv, {}, file_actions=actions, setsigdef=confine.DEFAULT_SIGNALS)
    finally:
        for fd in high:
            os.close(fd)


def prepare(uid: int, pidns_fd: int, scratch_mb: int, spawn: bool) -> dict:
    """The next single run, set up before its request arrives (after the last reply is written, while the
    service reads it): its scratch, stdin, pipes and nonce, and its init started in a fresh PID namespace,
    mounted, unprivileged and filtered, waiting for what to run. `run_one` hands it the request.

    The init is init.c, spawned (`spawn`, when the service could build it), or else a fork of this process that
    sets up in Python (`_child`)."""
    pipes = {name: os.pipe() for name in ("out", "err", "proof", "nonce", "status", "mounted")}
    # The request goes over a socket (the init's end first, like a pipe's): a stdin the service passed as a
    # memfd rides along with it, so the init reads it as it is, uncopied.
    init_end, our_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pipes["request"] = (init_end.detach(), our_end.detach())
    stdin = os.memfd_create("stdin")  # written on the request; shares its offset with the init's copy
    nonce = os.urandom(16).hex().encode()
    os.write(pipes["nonce"][1], nonce)
    theirs = [stdin, pipes["out"][1], pipes["err"][1], pipes["proof"][1], pipes["nonce"][0]]
    mounted, pid = False, 0
    confine.forget_peak()
    try:
        confine.mount_scratch(scratch_mb, uid)
        mounted = True
        confine.unshare(confine.CLONE_NEWPID)
        try:
            if spawn:
                pid = _spawn_init(uid, [*theirs, pipes["request"][0], pipes["status"][1], pipes["mounted"][1]])
            else:
                pid = os.fork()
            if pid == 0:
                try:  # the request ends (EOF) when the zygote closes its end: the init holds no write end
                    for fd in (pipes["request"][1], pipes["nonce"][1]):
                        os.close(fd)
                    _child(uid, pipes["request"][0], theirs, pipes["status"][1], pipes["mounted"][1])
                finally:
                    os._exit(127)
        finally:
            confine.check(confine.libc.setns(pidns_fd, confine.CLONE_NEWPID), "setns back to own pid namespace")
    except BaseException:
        for fd in (stdin, *(fd for pair in pipes.values() for fd in pair)):  # an init sees EOF and exits
            os.close(fd)
        if pid:
            os.waitpid(pid, 0)
        if mounted:
            confine.check(confine.libc.umount2(b"/scratch", confine.MNT_DETACH), "umount scratch")
        raise
    for fd in (*theirs[1:], pipes["status"][1], pipes["request"][0], pipes["nonce"][1], pipes["mounted"][1]):
        os.close(fd)
    return {
        "pid": pid,
        "readers": {name: pipes[name][0] for name in ("out", "err", "proof", "status")},
        "stdin": stdin,
        "request": pipes["request"][1],
        "mounted": pipes["mounted"][0],
        "nonce": nonce,
        "scratch_mb": scratch_mb,
    }


def settle(warm: dict) -> None:
    """Wait until the prepared init is set up and waits for its request: until it has its own mount namespace it
    shares ours, and a mount we made (a batch's scratch) would be copied into it; and its set-up's CPU time is
    not the program's. Take the mount namespace it sends (`release`) and the CPU time its set-up took."""
    if warm["mounted"] >= 0:
        os.read(warm["mounted"], 1)  # EOF: it closed the pipe, or died
        os.close(warm["mounted"])
        warm["mounted"] = -1
        warm["namespace"] = protocol.receive_namespace(warm["request"])
        warm["setup_cpu_s"] = confine.cpu_time(warm["pid"])


def release(run: dict) -> None:
    """After a run's reply: its scratch unmounted, its mount namespace let go. The kernel tears that down when
    its last holder goes (its /proc, its copy of the root's mounts), which but for us would be the exiting
    program, on the run's path."""
    if run.get("namespace", -1) >= 0:
        os.close(run["namespace"])
        run["namespace"] = -1
    confine.check(confine.libc.umount2(b"/scratch", confine.MNT_DETACH), "umount scratch")


def waiting(warm: dict) -> bool:
    """The prepared init is still there (not killed while it waited); it stays reapable either way."""
    return os.waitid(os.P_PID, warm["pid"], os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


def discard(warm: dict) -> None:
    """Undo `prepare`: the init killed and reaped, its fds closed, its scratch unmounted."""
    settle(warm)
    for fd in (warm["stdin"], warm["request"], *warm["readers"].values()):
        os.close(fd)
    os.kill(warm["pid"], signal.SIGKILL)
    os.waitpid(warm["pid"], 0)
    release(warm)


def run_one(req: dict, warm: dict, uid: int) -> dict:
    """Run one request in the namespace `prepare` set up and return the raw run_output.outcome."""
    started = time.monotonic()
    passed = req["stdin"] if isinstance(req["stdin"], int) else None
    kind = protocol.STDIN_PASSED if passed is not None else protocol.STDIN_OWN if req["stdin"] else protocol.STDIN_NULL
    limits = rlimits.rlimits(rlimits.beside_init(req["limits"]))
    go = protocol.encode_request(kind, limits, req["argv"], req["env"])
    settle(warm)
    if req["limits"]["scratch_mb"] != warm["scratch_mb"]:
        confine.resize_scratch(req["limits"]["scratch_mb"])
    # The run's files (a link to its program too) are its own, as if it had written them; and its scratch is
    # writable by it alone, which root without CAP_DAC_OVERRIDE (the deployments) must respect.
    confine.as_file_owner(uid)
    try:
        run_files.write_files(req, 0o755)
    finally:
        confine.as_file_owner(0)
    if kind == protocol.STDIN_OWN:
        protocol.write_all(warm["stdin"], req["stdin"])
        os.lseek(warm["stdin"], 0, os.SEEK_SET)
    os.close(warm["stdin"])
    try:
        protocol.send_request(warm["request"], go, passed)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the init failed before its request: its set-up error is waiting on the status pipe
    finally:
        os.close(warm["request"])
    pid, readers = warm["pid"], warm["readers"]
    # The pidfd turns readable when the init exits (right after the program), which the kernel reports only after
    # every other process of its PID namespace is gone; a program that closes its pipes is still waited for.
    exited = os.pidfd_open(pid)
    try:
        cpu = _run_cpu(pid, warm["setup_cpu_s"])
        verdict, got = run_output.read_outputs(exited, readers, req["limits"], started + req["limits"]["wall_s"], cpu)
    finally:
        for fd in (*readers.values(), exited):
            os.close(fd)
    wall = time.monotonic() - started
    # A run we kill is never reaped by its init, whose rusage then lacks it: its CPU time is what we read last.
    killed_cpu_s = cpu() if verdict is not None and cpu is not None else 0.0
    if verdict is not None:
        os.kill(pid, signal.SIGKILL)  # init dies -> the kernel kills the whole PID namespace
    # The init's rusage counts the program's (and the orphans' it reaped): it waited for them.
    _, init_status, usage = os.wait4(pid, 0)
    # Every process of the run is gone: what it left in /scratch can be read (the tmpfs goes in `release`).
    collected, collect_error = run_files.collect_files(
        req.get("collect", []), req["limits"].get("collect_max_bytes", 0)
    )
    # The init's own set-up (mounts, uid, seccomp; a millisecond or two where it is a forked interpreter) is not
    # the program's CPU time; what it spends from its request on (the fork and exec included) is.
    cpu_s = max(0.0, killed_cpu_s, usage.ru_utime + usage.ru_stime - warm["setup_cpu_s"])
    if verdict is None and run_output.over_cpu(cpu_s, req["limits"]):
        verdict = "timeout"
    setup_error, wait_status = _program_status(got["status"], init_status, verdict)
    return {
        "files": collected,
        "collect_error": collect_error,
        "verdict": verdict,
        "setup_error": setup_error,
        "wall_s": wall,
        **run_output.outcome(
            got,
            req["limits"],
            warm["nonce"],
            wait_status,
            cpu_s,
            usage.ru_maxrss / 1024,
        ),
    }


def _run_cpu(init: int, setup_cpu_s: float) -> Callable[[], float] | None:
    """How read_outputs reads a single run's CPU time while it runs: its init's (less the set-up, as the reply
    counts it; the program's too once reaped) and its program's, with what the program reaped. None without a
    /proc to read it in (confine.PROC): the run then ends at RLIMIT_CPU or its wall_s, and is judged by
    run_output.over_cpu. Children the program has not reaped are not counted; their own RLIMIT_CPU holds them."""
    if confine.PROC < 0:
        return None
    program = 0

    def used() -> float:
        nonlocal program
        program = program or _first_child(init)
        # The init first: a program reaped between the two reads is then counted once (at the next read), not twice.
        total = (run_output.stat_cpu_s(init, confine.PROC) or 0.0) - setup_cpu_s
        return total + ((run_output.stat_cpu_s(program, confine.PROC) or 0.0) if program else 0.0)

    return used


def _first_child(pid: int) -> int:
    """The first child of `pid` (a run's init: its program), 0 while it has none."""
    try:
        fd = os.open(f"{pid}/task/{pid}/children", os.O_RDONLY, dir_fd=confine.PROC)
    except OSError:
        return 0
    try:
        children = os.read(fd, 4096).split()
    except OSError:
        return 0
    finally:
        os.close(fd)
    return int(children[0]) if children else 0


def _program_status(said: bytes, init_status: int, verdict: str | None) -> tuple[str, int]:
    """(The set-up error, the wait status to judge) from what the init wrote on its status pipe and how it
    ended. Without its report, the init's own end stands for the program's: killed (by us at the deadline, or
    with the whole run by the OOM killer), which is how the program ended too. An init that exited on its own
    without one failed itself."""
    setup_error, wait_status = protocol.read_status(said)
    if wait_status is not None:
        return setup_error, wait_status
    if not setup_error and verdict is None and os.WIFEXITED(init_status):
        setup_error = f"the run's init exited with {os.WEXITSTATUS(init_status)} without its program's status"
    return setup_error, init_status


def read_raw(sizes: list[int | None], channel: socket.socket) -> list[bytes | int] | None:
    """What follows a request's JSON, in order: bytes from the pipe, or for a size of None the memfd the service
    passed on the fd channel in its turn. None at EOF (the service is gone)."""
    raw: list[bytes | int] = []
    for n in sizes:
        data = protocol.read_exact(0, n) if n else b"" if n == 0 else protocol.receive_fd(channel)
        if data is None:
            return None
        raw.append(data)
    return raw


def stock(
    held: dict[str, str], store: int, listed: list, sent: Iterator[bytes], forget: list[str]
) -> dict[str, bytes | str]:
    """A request's binary files by name: the bytes sent with it, or the path in /held of one kept under the
    service's key (zygote_client.Held), written there once through `store` (confine.mount_held) under a random name.
    An unknown key raises: the service replaces a zygote whose reply is an error."""
    for key in forget:
        os.unlink(held.pop(key).removeprefix(confine.HELD + "/"), dir_fd=store)
    files: dict[str, bytes | str] = {}
    for name, key, size in listed:
        if size is None:
            files[name] = held[key]
        elif key is None:
            files[name] = next(sent)
        else:
            random_name = os.urandom(16).hex()
            fd = os.open(random_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o555, dir_fd=store)
            try:
                protocol.write_all(fd, next(sent))
            finally:
                os.close(fd)
            held[key] = files[name] = f"{confine.HELD}/{random_name}"
    return files


def _capabilities() -> str:
    """Our effective capability set as /proc/self/status shows it (hex), for the hello: what we started with."""
    with open("/proc/self/status") as f:
        return next((line.split()[1] for line in f if line.startswith("CapEff:")), "?")


def go_rootless(cfg: dict) -> None:
    """Rootless mode: root in a user namespace of our own (our uid mapped to 0), and PID 1 of a PID namespace it owns.

    PID 1 because `prepare` returns to its own PID namespace after each spawn (setns), which takes CAP_SYS_ADMIN
    over the namespace's owner: the PID namespace we started in belongs to the host's (or the container's) user
    namespace, where we have none. So we fork once: the child goes on as the zygote in the new PID namespace;
    this process only waits for it and exits with its status (the service sees one process, as in root mode).
    The child's parent-death signal takes it, and with it every run, when this process is killed."""
    confine.enter_user_namespace(os.geteuid(), os.getegid())
    confine.unshare(confine.CLONE_NEWPID)
    child = os.fork()
    if child:
        for fd in (0, 1, cfg["fd_channel"], *([] if cfg.get("init") is None else [cfg["init"]])):
            os.close(fd)  # the service talks to the child alone: its EOF is the child's
        _, status = os.waitpid(child, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    confine.libc.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # a fork does not inherit it
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as PID 1 nothing from inside reaches us: not even this
    confine.ROOTLESS = True


def main() -> int:
    cfg = json.loads(sys.argv[1])
    confine.libc.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the service died -> so do we
    confine.keep_heap_small()  # before anything large is allocated: our size is every run's floor of peak memory
    started = {"uid": os.getuid(), "euid": os.geteuid(), "cap_eff": _capabilities()}  # the hello says how we began
    # Root mode: unique among live zygotes, so RLIMIT_NPROC is per worker. Rootless: 0, the one uid mapped (each
    # run's user namespace keeps its RLIMIT_NPROC count its own: confine.become).
    uid = 0 if cfg.get("rootless") else cfg["uid_base"] + os.getpid()
    os.set_inheritable(cfg["fd_channel"], False)  # passed to us inheritable; no run may have it
    channel = socket.socket(fileno=cfg["fd_channel"])
    try:
        if cfg.get("rootless"):
            go_rootless(cfg)
        with open("/proc/sys/kernel/cap_last_cap") as f:
            confine.CAP_LAST_CAP = int(f.read())
        pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY)
        try:  # kept for `prepare`: /proc is out of reach once we are in our own root
            confine.CLEAR_REFS = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            confine.CLEAR_REFS = -1  # the peaks then carry our own high-water mark, as they did before
        confine.SECCOMP = confine.seccomp_filter(os.uname().machine)
        confine.build_root(cfg, uid)
        store = confine.mount_held(cfg["held_bytes"], cfg["held_files"])
        for argv0 in cfg.get("check_exists", []):
            if not os.path.exists(argv0):
                raise FileNotFoundError(f"{argv0} is not visible inside the sandbox root")
    except Exception as exc:
        protocol.write_msg(1, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    hello = {"ready": True, "uid": uid, "pid": os.getpid(), "batches": not confine.PER_RUN_IPC}
    protocol.write_msg(1, {**hello, "rootless": confine.ROOTLESS, "started": started})
    spawn = cfg.get("init") is not None  # init.c is bound into our root (build_root)
    held: dict[str, str] = {}  # built programs kept for later requests: the service's key -> its path in /held
    warm, scratch_mb = None, 64  # the next run is prepared on the last one's scratch size (at first Limits')
    while True:
        if warm is None:
            try:
                warm = prepare(uid, pidns_fd, scratch_mb, spawn)
            except Exception:
                warm = None  # tried again when a run needs it, and then its error is that run's reply
            else:
                settle(warm)  # while no request waits: off the next run's path
        req, done = protocol.read_msg(0), cast("dict | None", None)
        if req is None:
            return 0
        # Raw after the JSON: stdin, a batch's stdins, then each binary file sent (not held), in the listed order.
        runs, listed = req.pop("batch_stdin_sizes", []), req.pop("blobs", [])
        sizes = [req.pop("stdin_bytes", 0), *runs, *(size for _, _, size in listed if size is not None)]
        raw = read_raw(sizes, channel)
        if raw is None:
            return 0
        req["stdin"], stdins = raw[0], raw[1 : 1 + len(runs)]
        sent = iter(cast("list[bytes]", raw[1 + len(runs) :]))  # binary files always come through the pipe
        try:
            req["blobs"] = stock(held, store, listed, sent, req.pop("forget", []))
            if req.get("batch") and stdins:
                if warm is not None:
                    settle(warm)
                # Its own uid: the prepared init waiting meanwhile does not count against the batch's processes.
                batch_uid = uid if confine.ROOTLESS else uid + confine.BATCH_UID_OFFSET  # rootless: own userns
                batch.run_batch(req, batch_uid, pidns_fd, stdins)
                continue
            scratch_mb = req["limits"]["scratch_mb"]
            if warm is not None and not waiting(warm):  # killed while it waited (the OOM killer, say): not ours
                discard(warm)
                warm = None
            run, warm = warm or prepare(uid, pidns_fd, scratch_mb, spawn), None
            reply = run_one(req, run, uid)
            done = run
        except Exception as exc:  # the service replaces a zygote that answers an error: no clean-up here
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for data in (req["stdin"], *stdins):
                if isinstance(data, int):
                    os.close(data)
        protocol.write_msg(1, reply)
        del req, reply, stdins, raw, sent  # before the next run is prepared: what it read back must not be our peak
        if done is not None:
            # The kernel tends to wake the service on this CPU, where it would wait behind what follows (the
            # tear-down, the next run's set-up: a millisecond): it reads its reply first. ~0.1 ms a run here.
            os.sched_yield()
            release(done)


if __name__ == "__main__":
    sys.exit(main())
