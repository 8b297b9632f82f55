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

Proof of completion: the program gets fd 4 (a pipe holding a random per-run nonce) and fd 3 (an empty pipe);
a language driver copies fd 4 to fd 3 only after the user program has run to its end. The zygote compares what
arrives on fd 3 with the nonce and reports `proof`. See `languages.py` for what this does and does not prove.
"""

# Syscall-level code on purpose: plain os calls map one-to-one to what the kernel does.
# ruff: noqa: PTH103, PTH106, PTH110, PTH112, PTH114, PTH115, PTH208, PTH211

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
import struct
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
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
DENY = {
    "x86_64": (0xC000003E, 56, (272, 308, 165, 166, 155, 101, 321, 298, 323, 250, 248, 249, 425, 310, 311, 246,
               175, 313, 176, 161, 304, 303, 428, 429, 430, 431, 432, 442, 163, 167, 168, 169, 103, 179)),
    "aarch64": (0xC00000B7, 220, (97, 268, 40, 39, 41, 117, 280, 241, 282, 219, 217, 218, 425, 270, 271, 104,
                105, 273, 106, 51, 265, 264, 428, 429, 430, 431, 432, 442, 89, 224, 225, 142, 116, 60)),
}  # fmt: skip
CLONE3 = 435
NS_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET


def seccomp_filter(machine: str) -> bytes:
    """A classic-BPF seccomp program: EPERM for DENY, clone with namespace flags, and x32 calls; ENOSYS for clone3."""
    arch, clone, deny = DENY[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38, 0x80000000
    body: list[tuple[int, int | str, int | str, int]] = [(ld, 0, 0, 0)]  # nr
    if machine == "x86_64":
        body.append((jge, "EPERM", 0, 0x40000000))  # the x32 ABI aliases every syscall
    body += [(jeq, "EPERM", 0, nr) for nr in deny]
    body += [(jeq, "ENOSYS", 0, CLONE3), (jeq, 0, "ALLOW", clone), (ld, 0, 0, 16), (jset, "EPERM", 0, NS_FLAGS)]
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


def mount_scratch(req: dict, uid: int) -> None:
    """A size-capped tmpfs on /scratch owned by `uid`, mounted by the zygote (one run at a time) so that the
    files a run leaves (a compiler's output) can be read back after its whole PID namespace is gone."""
    # Group root may read (mode 0750, gid 0): the zygote lists and reads build outputs without CAP_DAC_OVERRIDE.
    opts = f"size={req['limits']['scratch_mb']}m,nr_inodes=4096,mode=0750,uid={uid},gid=0"
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


def _write_inputs(req: dict) -> int:
    """As the unprivileged uid (no CAP_DAC_OVERRIDE needed): the program's files, and stdin as a memfd."""
    for name, data in [*((n, t.encode()) for n, t in req["files"].items()), *req["blobs"].items()]:
        fd = os.open("/scratch/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o755)
        while data:
            data = data[os.write(fd, data) :]
        os.close(fd)
    if not req["stdin"]:
        return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    stdin = os.memfd_create("stdin")
    data = req["stdin"]
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
        stdin = _write_inputs(req)
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


def _collect(pid: int, readers: dict[str, int], limits: dict, nonce: bytes, started: float) -> tuple:
    """Read outputs until every writer is gone, the deadline passes, or the output limit is hit."""
    deadline = started + limits["timeout_s"]
    bufs = {fd: bytearray() for fd in readers.values()}
    # The pidfd turns readable when init (the program) exits, which the kernel reports only after every
    # other process of its PID namespace is gone; a program that closes its pipes is still waited for.
    exited = os.pidfd_open(pid)
    poller = select.poll()
    for fd in (*bufs, exited):
        poller.register(fd, select.POLLIN)
    open_fds, verdict, total = {*bufs, exited}, None, 0
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                verdict = "timeout"
                break
            for fd, _ in poller.poll(max(1, int(left * 1000) + 1)):
                chunk = b"" if fd == exited else os.read(fd, 65536)
                if not chunk:
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                bufs[fd] += chunk
                if fd != readers["status"]:  # the program can write to out, err and the proof fd
                    total += len(chunk)
            if total > limits["max_output_bytes"]:
                verdict = "output_limit"
                break
    finally:
        os.close(exited)
    wall = time.monotonic() - started
    if verdict is not None:
        os.kill(pid, signal.SIGKILL)  # init dies -> the kernel kills the whole PID namespace
    _, wait_status, usage = os.wait4(pid, 0)
    cap = limits["max_output_bytes"]
    out = bytes(bufs[readers["out"]][:cap]).decode("utf-8", "replace")
    err = bytes(bufs[readers["err"]][:cap]).decode("utf-8", "replace")
    proof = bytes(bufs[readers["proof"]]) == nonce
    setup_error = bytes(bufs[readers["status"]]).decode("utf-8", "replace")
    cpu = usage.ru_utime + usage.ru_stime
    return verdict, out, err, wait_status, setup_error, proof, wall, cpu, usage.ru_maxrss / 1024


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
    try:
        verdict, out, err, wait_status, setup_error, proof, wall, cpu, peak_mb = _collect(
            pid, readers, req["limits"], nonce, started
        )
    finally:
        for fd in readers.values():
            os.close(fd)
    exit_code = -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)
    try:  # every process of the run is gone: what it left in /scratch can be read, then the tmpfs goes
        collected, collect_error = collect_files(req.get("collect", []), req["limits"].get("collect_max_bytes", 0))
    finally:
        _check(libc.umount2(b"/scratch", MNT_DETACH), "umount scratch")
    return {
        "files": collected,
        "collect_error": collect_error,
        "verdict": verdict,
        "exit_code": exit_code,
        "setup_error": setup_error,
        "stdout": out,
        "stderr": err,
        "proof": proof,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_mb": peak_mb,
    }


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
    _write_msg(1, {"ready": True, "uid": uid, "pid": os.getpid()})
    while True:
        req = _read_msg(0)
        if req is None:
            return 0
        # Raw after the JSON: stdin, then each binary file (a built program), in the order the sizes are listed.
        sizes = [("stdin", req.pop("stdin_bytes", 0)), *req.pop("blob_sizes", [])]
        raw = {name: _read_exact(0, n) if n else b"" for name, n in sizes}
        if any(data is None for data in raw.values()):
            return 0
        req["stdin"] = raw.pop("stdin")
        req["blobs"] = raw
        req["cap_last_cap"] = cap_last_cap
        try:
            reply = run_one(req, uid, pidns_fd)
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        _write_msg(1, reply)


if __name__ == "__main__":
    sys.exit(main())
