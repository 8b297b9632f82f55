"""The sandbox launcher ("zygote"): a single-threaded, stdlib-only root process that forks one isolated run per request.

It is started by `namespace.py` as `python3 -I -S zygote.py CONFIG_JSON` with an empty environment and never
imports anything from the service. At start it enters its own mount, network, IPC and UTS namespaces (no
interface is up, not even loopback; SysV IPC is disabled), builds a minimal read-only root (the read-only binds listed in the config, a few device
nodes, a synthetic /etc) and pivots into it, so nothing of the host (/work, /root, /home, /tmp, /proc, /sys, ...)
is reachable from it any more. Then, per request (length-prefixed JSON on stdin/stdout):

    zygote ── unshare(NEWPID) + fork ──▶ child = pid 1 of a fresh PID namespace
                                           unshare(NEWNS); tmpfs /scratch (size-capped); fresh /proc;
                                           oom_score_adj 1000; rlimits; no_new_privs; empty capability
                                           bounding set; unprivileged uid (unique per zygote); seccomp
                                           filter; execve(argv) with a minimal environment

The program is the namespace's init: when it exits, the kernel kills everything left in the PID namespace
(daemons, setsid children, fork-bomb remnants), and no privileged process exists inside it. On the wall-clock
deadline or the output limit the zygote SIGKILLs it, with the same effect; if the zygote dies, the parent-death
signal does it. (As an init, the program ignores signals it sends itself without installing a handler.)
The zygote reads stdout/stderr itself and enforces both limits.

A batch (many runs of one program, a submission's tests) shares one PID namespace between its runs; see
"A batch" below.

Proof of completion: the program gets fd 4 (a pipe holding a random per-run nonce) and fd 3 (an empty pipe);
a language driver copies fd 4 to fd 3 only after the user program has run to its end. The zygote compares what
arrives on fd 3 with the nonce and reports `proof`. See `languages.py` for what this does and does not prove.
"""

# Syscall-level code on purpose: plain os calls map one-to-one to what the kernel does.
# ruff: noqa: PTH103, PTH106, PTH110, PTH112, PTH113, PTH114, PTH115, PTH120, PTH208, PTH211

from __future__ import annotations

import base64
import ctypes
import fcntl
import fnmatch
import json
import os
import resource as r
import select
import signal
import socket
import struct
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")
PROOF_FD, NONCE_FD = 3, 4
MAX_MESSAGE_BYTES = 1 << 30  # a length header past this means a broken stream, not a request

SECCOMP = b""  # built once at start-up
PER_RUN_IPC = False  # set at start-up when SysV IPC cannot be disabled for the zygote's IPC namespace
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(libc.mount(_b(src), _b(dst), _b(fstype), flags, _b(data)), f"mount {src} on {dst}")


def unshare(flags: int) -> None:
    _check(libc.unshare(flags), f"unshare({flags:#x})")


def bind_ro(src: str, dst: str, devices: bool = False) -> None:
    """Bind `src` read-only at `dst`; device nodes keep working only where asked."""
    mount(src, dst, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if devices else MS_NODEV)
    mount(None, dst, None, flags)


def disable_sysv_ipc() -> None:
    """SysV IPC objects outlive processes; with none allowed in this IPC namespace nothing passes between runs.

    (POSIX message queues are off through RLIMIT_MSGQUEUE=0; POSIX shm lives in each run's scratch.) A fresh
    /proc, private to our mount namespace, because container runtimes mount /proc/sys read-only.
    """
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name, value in (("shmmni", "0"), ("msgmni", "0"), ("sem", "0 0 0 0")):
        with open(f"/proc/sys/kernel/{name}", "w") as f:
            f.write(value)


def build_root(cfg: dict, uid: int) -> None:
    """Enter private mount/net/uts namespaces and pivot into a minimal read-only root."""
    global PER_RUN_IPC
    unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWIPC)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    try:
        disable_sysv_ipc()
    except OSError:  # e.g. a /proc that will not mount here: a fresh IPC namespace per run instead
        PER_RUN_IPC = True
    new = "/tmp"  # any existing directory will do: the tmpfs over it exists only in our namespace
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=512,mode=0755")
    for path in cfg["ro_binds"]:
        if os.path.islink(path):
            os.symlink(os.readlink(path), new + path)
        elif os.path.isdir(path):
            os.makedirs(new + path, exist_ok=True)
            bind_ro(path, new + path)
        elif os.path.isfile(path):
            os.makedirs(os.path.dirname(new + path), exist_ok=True)
            open(new + path, "w").close()
            bind_ro(path, new + path)
    for d in ("dev", "etc", "proc", "scratch", ".old"):
        os.makedirs(f"{new}/{d}", exist_ok=True)
    os.symlink("scratch", f"{new}/tmp")  # /tmp is the run's own scratch tmpfs
    for name in DEVICES:
        open(f"{new}/dev/{name}", "w").close()
        bind_ro(f"/dev/{name}", f"{new}/dev/{name}", devices=True)
    os.symlink("/scratch", f"{new}/dev/shm")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{new}/dev/{name}")
    os.symlink("/proc/self/fd", f"{new}/dev/fd")
    etc = {
        "passwd": f"root:x:0:0::/:/bin/false\nsandbox:x:{uid}:{uid}::/scratch:/bin/false\n",
        "group": f"root:x:0:\nsandbox:x:{uid}:\n",
        "hosts": "127.0.0.1 localhost\n",
        "hostname": "sandbox\n",
    }
    for name, text in etc.items():
        with open(f"{new}/etc/{name}", "w") as f:
            f.write(text)
    _check(libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], _b(new), _b(new + "/.old")), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    libc.sethostname(b"sandbox", 7)


# Syscalls an unprivileged program could use to widen the kernel surface it reaches (new user namespaces,
# eBPF, io_uring, perf, keyrings, ptrace) or that need privileges it no longer has; Docker's default profile
# blocks the same ones. clone3 answers ENOSYS so libc falls back to clone, whose flags can be checked.
# prlimit64 works on the caller only (pid 0, which is how libc's setrlimit calls it): in a batch the runs share
# their uid with the supervisor, whose limits they must not change.
DENY = {
    "x86_64": (0xC000003E, 56, (272, 308, 165, 166, 155, 101, 321, 298, 323, 250, 248, 249, 425, 310, 311, 246,
               175, 313, 176, 161, 304, 303, 428, 429, 430, 431, 432, 442, 163, 167, 168, 169, 103, 179)),
    "aarch64": (0xC00000B7, 220, (97, 268, 40, 39, 41, 117, 280, 241, 282, 219, 217, 218, 425, 270, 271, 104,
                105, 273, 106, 51, 265, 264, 428, 429, 430, 431, 432, 442, 89, 224, 225, 142, 116, 60)),
}  # fmt: skip
CLONE3 = 435
PRLIMIT64 = {"x86_64": 302, "aarch64": 261}
NS_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET


def seccomp_filter(machine: str) -> bytes:
    """A classic-BPF seccomp program: EPERM for DENY, clone with namespace flags, prlimit64 on another process and
    x32 calls; ENOSYS for clone3."""
    arch, clone, deny = DENY[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38, 0x80000000
    body: list[tuple[int, int | str, int | str, int]] = [(ld, 0, 0, 0)]  # nr
    if machine == "x86_64":
        body.append((jge, "EPERM", 0, 0x40000000))  # the x32 ABI aliases every syscall
    body += [(jeq, "EPERM", 0, nr) for nr in deny]
    body += [(jeq, "ENOSYS", 0, CLONE3), (jeq, 0, 2, PRLIMIT64[machine]), (ld, 0, 0, 16), (jeq, "ALLOW", "EPERM", 0)]
    body += [(jeq, 0, "ALLOW", clone), (ld, 0, 0, 16), (jset, "EPERM", 0, NS_FLAGS)]
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), *body]
    labels = {"ALLOW": len(prog), "EPERM": len(prog) + 1, "ENOSYS": len(prog) + 2}
    prog += [(ret, 0, 0, allow), (ret, 0, 0, eperm), (ret, 0, 0, enosys)]
    out = b""
    for i, (code, jt, jf, k) in enumerate(prog):
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        out += struct.pack("HBBI", code, jt, jf, k)
    return out


def install_seccomp(filt: bytes) -> None:
    """PR_SET_SECCOMP with the filter; needs no_new_privs (set before) since we hold no capabilities."""
    buf = ctypes.create_string_buffer(filt, len(filt))
    prog = struct.pack("HxxxxxxP", len(filt) // 8, ctypes.addressof(buf))
    _check(libc.prctl(22, 2, ctypes.c_char_p(prog), 0, 0), "seccomp")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _read_msg(fd: int) -> dict | None:
    head = _read_exact(fd, 4)
    if head is None:
        return None
    size = struct.unpack(">I", head)[0]
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"a request of {size} bytes: the stream is out of step")
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body)


def _read_exact(fd: int, n: int) -> bytes | None:
    """n bytes into one buffer (linear: a megabyte of stdin arrives in 64 KiB pipe reads), None at EOF."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if not k:
            return None
        got += k
    return bytes(buf)


def _write_msg(fd: int, obj: dict) -> None:
    body = json.dumps(obj).encode()
    data = struct.pack(">I", len(body)) + body
    while data:
        data = data[os.write(fd, data) :]


def mount_scratch(req: dict, uid: int, shared: bool = False) -> None:
    """A size-capped tmpfs on /scratch, mounted by the zygote (one run or batch at a time) so that the files a run
    leaves (a compiler's output) can be read back after its whole PID namespace is gone; owned by `uid`.

    `shared` (a batch): owned by root and sticky like /tmp, so the runs may add files but not change or remove
    the program's, which the zygote writes as root.
    """
    # Group root may read (mode 0750, gid 0): the zygote lists and reads build outputs without CAP_DAC_OVERRIDE.
    owner = "mode=1777,uid=0" if shared else f"mode=0750,uid={uid}"
    opts = f"size={req['limits']['scratch_mb']}m,nr_inodes=4096,{owner},gid=0"
    mount("tmpfs", "/scratch", "tmpfs", MS_NOSUID | MS_NODEV, opts)


def collect_files(patterns: list[str], max_bytes: int) -> tuple[dict[str, str], str]:
    """Regular files in /scratch (top level) matching `patterns`, base64; never follows a link the run planted."""
    out: dict[str, str] = {}
    total = 0
    if not patterns:
        return out, ""
    for name in sorted(os.listdir("/scratch")):
        if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            continue
        try:
            fd = os.open("/scratch/" + name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue  # a symlink or something else that is not the run's own file
        try:
            if os.fstat(fd).st_mode & 0o170000 != 0o100000:  # not S_IFREG
                continue
            data = b""
            while len(data) <= max_bytes - total and (chunk := os.read(fd, 1 << 20)):
                data += chunk
        finally:
            os.close(fd)
        total += len(data)
        if total > max_bytes:
            return out, f"output files exceed {max_bytes} bytes"
        out[name] = base64.b64encode(data).decode()
    return out, ""


def _setup_mounts() -> None:
    """Fresh mount namespace (it keeps the zygote's /scratch tmpfs) with this PID namespace's /proc."""
    unshare(CLONE_NEWNS | (CLONE_NEWIPC if PER_RUN_IPC else 0))
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)  # if memory runs out, the OOM killer takes runs first
    os.write(fd, b"1000")
    os.close(fd)


def _become(uid: int, cap_last_cap: int) -> None:
    """no_new_privs, an empty capability bounding set (when CAP_SETPCAP allows), then the unprivileged uid."""
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for cap in range(cap_last_cap + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # no CAP_SETPCAP: moot anyway for a non-root uid under no_new_privs and seccomp
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # A uid change clears the parent-death signal, so it is set after: zygote gone -> this init and its
    # whole PID namespace gone.
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")


def _write_files(req: dict, mode: int) -> None:
    """The program's files into /scratch (as whoever owns it, so no CAP_DAC_OVERRIDE is needed)."""
    for name, data in [*((n, t.encode()) for n, t in req["files"].items()), *req["blobs"].items()]:
        fd = os.open("/scratch/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        while data:
            data = data[os.write(fd, data) :]
        os.close(fd)


def _stdin_fd(data: bytes) -> int:
    """The run's stdin: a memfd holding `data` (a program may seek or mmap it), /dev/null when empty."""
    if not data:
        return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    stdin = os.memfd_create("stdin")
    while data:
        data = data[os.write(stdin, data) :]
    os.lseek(stdin, 0, os.SEEK_SET)
    return stdin


def _set_limits(limits: dict) -> None:
    cpu = int(limits["cpu_s"])
    # RLIMIT_AS counts address space a runtime only reserves (the JVM's class space, V8's code range, Go's
    # arenas), so those runtimes get RLIMIT_DATA: writable memory actually mapped.
    memory = r.RLIMIT_DATA if limits.get("memory_kind") == "data" else r.RLIMIT_AS
    if limits.get("stack_mb"):  # deep recursion in compiled contest code; glibc also sizes thread stacks by it
        r.setrlimit(r.RLIMIT_STACK, (limits["stack_mb"] << 20, limits["stack_mb"] << 20))
    for res, val in (
        (memory, limits["memory_mb"] << 20),
        (r.RLIMIT_CPU, cpu),  # an init ignores SIGXCPU, so the hard limit (SIGKILL) is the one that acts
        (r.RLIMIT_NPROC, limits["max_processes"]),
        (r.RLIMIT_FSIZE, limits["max_file_bytes"]),
        (r.RLIMIT_NOFILE, 256),
        (r.RLIMIT_CORE, 0),
        (r.RLIMIT_MSGQUEUE, 0),
    ):
        r.setrlimit(res, (val, val))


def _child(req: dict, uid: int, fds: list[int], status_w: int) -> None:
    """Pid 1 of a fresh PID namespace: mounts, unprivileged uid, inputs, limits, seccomp, exec; never returns.

    The program itself is the namespace's init, so when it exits (or is killed) the kernel kills every
    process it left behind, and no privileged process exists inside the namespace at all.
    """
    try:
        _setup_mounts()
        _become(uid, req["cap_last_cap"])
        _write_files(req, 0o755)
        stdin = _stdin_fd(req["stdin"])
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in (stdin, *fds)]  # above every target
        for target, fd in enumerate(high):
            os.dup2(fd, target)  # inheritable: exactly fds 0-4 survive the exec
        os.chdir("/scratch")
        _set_limits(req["limits"])
        install_seccomp(SECCOMP)
        os.execve(req["argv"][0], req["argv"], req["env"])
    except BaseException as exc:  # report through the close-on-exec status pipe; never return to the loop
        try:
            os.write(status_w, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(127)


def _collect(done: int, readers: dict[str, int], limits: dict, deadline: float) -> tuple[str | None, dict]:
    """Read outputs until every writer is gone and `done` is readable, the deadline passes, or the output limit
    is hit: (None, or the verdict "timeout" / "output_limit"; the bytes read per reader name)."""
    bufs = {fd: bytearray() for fd in readers.values()}
    poller = select.poll()
    for fd in (*bufs, done):
        poller.register(fd, select.POLLIN)
    open_fds, verdict, total = {*bufs, done}, None, 0
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            verdict = "timeout"
            break
        for fd, _ in poller.poll(max(1, int(left * 1000) + 1)):
            chunk = b"" if fd == done else os.read(fd, 65536)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            bufs[fd] += chunk
            if fd != readers.get("status"):  # the program can write to out, err and the proof fd
                total += len(chunk)
        if total > limits["max_output_bytes"]:
            verdict = "output_limit"
            break
    return verdict, {name: bytes(bufs[fd]) for name, fd in readers.items()}


def _outcome(
    got: dict, limits: dict, nonce: bytes | None, wait_status: int | None, cpu_s: float, peak_mb: float
) -> dict:
    """The reply's fields for one run from what `_collect` read and how the program ended."""
    cap = limits["max_output_bytes"]
    exit_code = None
    if wait_status is not None:
        exit_code = -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)
    return {
        "exit_code": exit_code,
        "stdout": got["out"][:cap].decode("utf-8", "replace"),
        "stderr": got["err"][:cap].decode("utf-8", "replace"),
        "proof": nonce is not None and got["proof"] == nonce,
        "cpu_s": cpu_s,
        "peak_mb": peak_mb,
    }


def run_one(req: dict, uid: int, pidns_fd: int) -> dict:
    """Run one request in a fresh PID namespace and return the raw outcome."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    proof_r, proof_w = os.pipe()
    nonce_r, nonce_w = os.pipe()
    status_r, status_w = os.pipe()
    nonce = os.urandom(16).hex().encode()
    os.write(nonce_w, nonce)
    os.close(nonce_w)
    started = time.monotonic()
    mount_scratch(req, uid)
    unshare(CLONE_NEWPID)
    try:
        pid = os.fork()
        if pid == 0:
            _child(req, uid, [out_w, err_w, proof_w, nonce_r], status_w)
    finally:
        _check(libc.setns(pidns_fd, CLONE_NEWPID), "setns back to own pid namespace")
    for fd in (out_w, err_w, proof_w, nonce_r, status_w):
        os.close(fd)
    readers = {"out": out_r, "err": err_r, "proof": proof_r, "status": status_r}
    # The pidfd turns readable when init (the program) exits, which the kernel reports only after every
    # other process of its PID namespace is gone; a program that closes its pipes is still waited for.
    exited = os.pidfd_open(pid)
    try:
        verdict, got = _collect(exited, readers, req["limits"], started + req["limits"]["timeout_s"])
    finally:
        for fd in (*readers.values(), exited):
            os.close(fd)
    wall = time.monotonic() - started
    if verdict is not None:
        os.kill(pid, signal.SIGKILL)  # init dies -> the kernel kills the whole PID namespace
    _, wait_status, usage = os.wait4(pid, 0)
    try:  # every process of the run is gone: what it left in /scratch can be read, then the tmpfs goes
        collected, collect_error = collect_files(req.get("collect", []), req["limits"].get("collect_max_bytes", 0))
    finally:
        _check(libc.umount2(b"/scratch", MNT_DETACH), "umount scratch")
    return {
        "files": collected,
        "collect_error": collect_error,
        "verdict": verdict,
        "setup_error": got["status"].decode("utf-8", "replace"),
        "wall_s": wall,
        **_outcome(got, req["limits"], nonce, wait_status, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024),
    }


# A batch: one program run on many inputs (a submission's tests) in one PID namespace. Its pid 1 is a small
# supervisor that has already done what every run needs (mounts, uid, limits, seccomp), so each run costs one
# posix_spawn (vfork + exec) instead of a fork of this process plus that set-up: the per-run cost of a native
# program drops to about that of running it bare.
#
# What the runs share, and why that is safe: the supervisor runs as the runs' uid but is init with every signal
# at its default (the kernel then drops signals sent from inside its namespace), not dumpable (no ptrace,
# /proc/1/mem or /proc/1/fd for the same uid), and seccomp keeps prlimit64 to the caller itself. After each run
# it kills every other process of the namespace (kill(-1) from init) and reaps them, so nothing a run started
# survives into the next. /scratch is root-owned and sticky, the program's files root's: a run can add files but
# not change the program. The next run gets a fresh namespace, exactly as a single run would have, when a run
# leaves anything in /scratch, changes the supervisor's scheduling (nice, policy, CPUs, I/O priority: the same
# uid may), times out without the supervisor ending it, or the supervisor is past half its CPU limit. No batches
# where SysV IPC could not be switched off (PER_RUN_IPC): its objects would outlive a run unseen.
#
# Unlike a single run, the program is not pid 1: signals it sends itself act, as they do outside the sandbox.
HELD_REPLY_BYTES = 4 << 20  # replies held back before they are written anyway
HELD_REPLY_S = 0.5  # ... or for this long
BATCH_SLACK_S = 2.0  # past a run's deadline, how long the supervisor has to end it before the whole box is killed
BATCH_START_S = 5.0  # how long a supervisor may take to get ready
SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}


def _supervise(req: dict, uid: int, control: socket.socket) -> None:
    """Pid 1 of a batch's PID namespace: set up once, then spawn, wait for and clean up after each run."""
    try:
        # Python's own SIGINT handler would let a run interrupt us: init drops only signals left at default.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        low = control.detach()
        control = socket.socket(fileno=fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 64))  # above the runs' fds 0-4
        os.close(low)
        _setup_mounts()
        _become(uid, req["cap_last_cap"])
        _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "not dumpable")
        low = os.open("/dev/null", os.O_RDWR)
        null = fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 64)  # never one of a run's target fds
        os.close(low)
        for fd in range(5):  # the service's pipes go; received fds land above the runs' targets 0-4
            os.dup2(null, fd, inheritable=False)
        os.chdir("/scratch")
        _set_limits({**req["limits"], "max_processes": req["limits"]["max_processes"] + 1})  # + the supervisor
        install_seccomp(SECCOMP)
        scheduling = _scheduling()
        control.send(b'{"ready": true}')
    except BaseException as exc:
        control.send(json.dumps({"setup_error": f"{type(exc).__name__}: {exc}"}).encode())
        os._exit(127)
    cpu_limit = int(req["limits"]["cpu_s"])
    try:
        while True:
            message, fds, _, _ = socket.recv_fds(control, 4096, 3, socket.MSG_CMSG_CLOEXEC)
            if not message:
                os._exit(0)  # the zygote closed the batch: our exit takes the namespace with it
            if not fds:
                continue  # a kill for a run that had already ended
            reply = _spawn_and_wait(req, fds, null, json.loads(message)["timeout_s"], control)
            used = r.getrusage(r.RUSAGE_SELF)
            reply["retire"] = used.ru_utime + used.ru_stime >= cpu_limit / 2 or _scheduling() != scheduling
            control.send(json.dumps(reply).encode())
    except BaseException as exc:  # our own failure, never the program's: the run is a sandbox error
        control.send(json.dumps({"setup_error": f"batch supervisor: {type(exc).__name__}: {exc}"}).encode())
    finally:
        os._exit(127)


def _scheduling() -> tuple:
    """What a run of the same uid could change about the supervisor, and so about every later run it spawns."""
    ioprio = libc.syscall(SYS_IOPRIO_GET[os.uname().machine], 1, 0)  # IOPRIO_WHO_PROCESS, this process
    return os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), os.sched_getaffinity(0), ioprio


def _spawn_and_wait(req: dict, fds: list[int], null: int, timeout_s: float, control: socket.socket) -> dict:
    """One run: exec the program on fds 0-2 (/dev/null on 3 and 4), wait for it (kill it at the deadline or when
    the zygote asks), then kill and reap whatever else it left in the namespace."""
    try:
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate([*fds, null, null])]
        pid = os.posix_spawn(req["argv"][0], req["argv"], req["env"], file_actions=actions)
    except OSError as exc:
        return {"setup_error": f"{type(exc).__name__}: {exc}"}
    finally:
        for fd in fds:
            os.close(fd)
    exited = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(exited, select.POLLIN)
    poller.register(control, select.POLLIN)
    deadline, why = time.monotonic() + timeout_s, None
    while why is None:
        left = deadline - time.monotonic()
        events = dict(poller.poll(max(1, int(left * 1000) + 1))) if left > 0 else {}
        if exited in events:
            break
        if left <= 0:
            why = "timeout"
        elif control.fileno() in events:
            if not control.recv(16):
                os._exit(0)
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
    return {"status": status, "why": why, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}


class Box:
    """The zygote's side of a batch: the shared scratch, the supervisor, and one run at a time through it."""

    def __init__(self, req: dict, uid: int, pidns_fd: int) -> None:
        mount_scratch(req, uid, shared=True)
        try:
            _write_files(req, 0o555)
            self.program = set(os.listdir("/scratch"))
            self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            unshare(CLONE_NEWPID)
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
                _check(libc.setns(pidns_fd, CLONE_NEWPID), "setns back to own pid namespace")
            theirs.close()
        except BaseException:
            _check(libc.umount2(b"/scratch", MNT_DETACH), "umount scratch")
            raise
        ready = select.select([self.control], [], [], BATCH_START_S)[0] and self._said()
        if not ready or not ready.get("ready"):
            self.close()
            raise OSError(f"the batch supervisor did not start: {ready and ready.get('setup_error')}")

    def start(self, stdin: bytes, limits: dict) -> dict:
        """Hand one run to the supervisor: its stdin, fresh pipes for its output, and its deadline. (Batches are
        for stdin/stdout tests, so no proof of completion: fds 3 and 4 are /dev/null.)"""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        theirs = [_stdin_fd(stdin), out_w, err_w]
        started = time.monotonic()
        try:
            socket.send_fds(self.control, [json.dumps({"timeout_s": limits["timeout_s"]}).encode()], theirs)
        except OSError:
            pass  # the supervisor is gone; its setup error, if any, is waiting to be read
        finally:
            for fd in theirs:
                os.close(fd)
        return {"readers": {"out": out_r, "err": err_r}, "started": started}

    def finish(self, run: dict, limits: dict) -> tuple[dict, bool]:
        """Wait for a started run: (its reply, whether this box can take the next run)."""
        readers, started = run["readers"], run["started"]
        deadline = started + limits["timeout_s"] + BATCH_SLACK_S  # the supervisor ends a run at its own deadline
        try:
            verdict, got = _collect(self.control.fileno(), readers, limits, deadline)
        finally:
            for fd in readers.values():
                os.close(fd)
        answered = verdict is None
        if verdict == "output_limit":  # the supervisor kills the run and answers
            try:
                self.control.send(b"kill")
            except OSError:
                pass
            answered = _collect(self.control.fileno(), {}, limits, deadline)[0] is None
        wall = time.monotonic() - started
        said = self._said() if answered else {}
        if "status" not in said:  # no answer in time, or a dead supervisor: this box is done
            reply = {"verdict": verdict, "setup_error": said.get("setup_error", ""), "wall_s": wall}
            if not reply["setup_error"] and verdict is None:
                reply["setup_error"] = "the batch supervisor exited"
            return {**reply, **_outcome(got, limits, None, None, 0.0, 0.0)}, False
        verdict = verdict or {"timeout": "timeout", "killed": "output_limit"}.get(said["why"])
        reply = {"verdict": verdict, "setup_error": "", "wall_s": wall}
        keep = not said["retire"] and set(os.listdir("/scratch")) == self.program
        return {**reply, **_outcome(got, limits, None, said["status"], said["cpu_s"], said["peak_mb"])}, keep

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
        _check(libc.umount2(b"/scratch", MNT_DETACH), "umount scratch")


def _next_refused() -> bool:
    """A stream's answer after a reply: anything but "next" (a stop, or the service gone) ends the batch."""
    return (_read_msg(0) or {}).get("control") != "next"


def _stop_requested() -> bool:
    """The service sent its closing control message before the end (a stop), or is gone."""
    if not select.select([0], [], [], 0)[0]:
        return False
    _read_msg(0)
    return True


def _write_held(held: list[bytes]) -> None:
    data = b"".join(struct.pack(">I", len(body)) + body for body in held)
    while data:
        data = data[os.write(1, data) :]
    held.clear()


def run_batch(req: dict, uid: int, pidns_fd: int, stdins: list[bytes]) -> None:
    """Run req's program once per stdin, one reply each, then {"end": true}; then take the service's closing
    control message ("close", or "stop" when it wanted no more runs) unless a stop already came.

    A stream (the service may stop early) waits after each reply for "next" or "stop". Otherwise the next run
    starts before the last one's reply is written, and replies are held and written together (at most
    HELD_REPLY_S apart): the zygote's own work overlaps the program's, and a service woken for every reply would
    take CPU from the runs.
    """
    if PER_RUN_IPC:
        raise OSError("no batches where SysV IPC is not disabled")
    limits, stream, held, stopped = req["limits"], bool(req.get("stream")), [], False
    written = time.monotonic()
    box = Box(req, uid, pidns_fd)
    try:
        run = box.start(stdins[0], limits)
        for i in range(len(stdins)):
            reply, keep = box.finish(run, limits)
            held.append(json.dumps({"files": {}, "collect_error": "", **reply}).encode())
            more = i + 1 < len(stdins)
            if stream or sum(map(len, held)) > HELD_REPLY_BYTES or time.monotonic() - written > HELD_REPLY_S:
                _write_held(held)
                written = time.monotonic()
            stopped = more and (_next_refused() if stream else _stop_requested())
            if more and not stopped:
                if not keep:
                    box.close()
                    box = Box(req, uid, pidns_fd)
                run = box.start(stdins[i + 1], limits)
            if stopped:
                break
    finally:
        box.close()
    _write_held([*held, b'{"end": true}'])
    if not stopped:
        _read_msg(0)


def main() -> int:
    cfg = json.loads(sys.argv[1])
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the service died -> so do we
    uid = cfg["uid_base"] + os.getpid()  # unique among live zygotes, so RLIMIT_NPROC is per run
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            cap_last_cap = int(f.read())
        pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY)
        global SECCOMP
        SECCOMP = seccomp_filter(os.uname().machine)
        build_root(cfg, uid)
        for argv0 in cfg.get("check_exists", []):
            if not os.path.exists(argv0):
                raise FileNotFoundError(f"{argv0} is not visible inside the sandbox root")
    except Exception as exc:
        _write_msg(1, {"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    _write_msg(1, {"ready": True, "uid": uid, "pid": os.getpid(), "batches": not PER_RUN_IPC})
    while True:
        req = _read_msg(0)
        if req is None:
            return 0
        # Raw after the JSON: stdin, then each binary file (a built program), in the order the sizes are listed.
        batch = [(f"\0stdin{i}", n) for i, n in enumerate(req.get("batch_stdin_sizes", []))]
        sizes = [("stdin", req.pop("stdin_bytes", 0)), *batch, *req.pop("blob_sizes", [])]
        raw = {name: _read_exact(0, n) if n else b"" for name, n in sizes}
        if any(data is None for data in raw.values()):
            return 0
        req["stdin"] = raw.pop("stdin")
        stdins = [raw.pop(f"\0stdin{i}") or b"" for i in range(len(req.pop("batch_stdin_sizes", [])))]
        req["blobs"] = raw
        req["cap_last_cap"] = cap_last_cap
        try:
            if req.get("batch") and stdins:
                run_batch(req, uid, pidns_fd, stdins)
                continue
            reply = run_one(req, uid, pidns_fd)
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _write_msg(1, reply)


if __name__ == "__main__":
    sys.exit(main())
