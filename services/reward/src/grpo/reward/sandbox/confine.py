"""The kernel calls the sandbox is made of, for the zygote (zygote.py) and its batches (batch.py).

Stdlib only, like them: it runs in the zygote's process (`python3 -I -S`), never in the service's. Namespaces,
mounts, the read-only root, the seccomp filter, the unprivileged uid, rlimits, the length-prefixed messages to
the service, and reading a run's output under its deadline and output limit.
"""

# Syscall-level code on purpose: plain os calls map one-to-one to what the kernel does.
# ruff: noqa: PTH103, PTH106, PTH112, PTH113, PTH114, PTH115, PTH120, PTH208, PTH211

from __future__ import annotations

import base64
import ctypes
import fnmatch
import json
import os
import resource as r
import select
import signal
import socket
import struct
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x04000000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
WALL = 0x40000000  # waitpid's __WALL: children of any kind, those cloned without an exit signal too
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")
PROOF_FD, NONCE_FD = 3, 4
# CPython ignores these at start-up, and an ignored signal stays ignored across exec: a run gets them at their
# default, as a shell's child does (else `yes | head` prints "Broken pipe" and a file past RLIMIT_FSIZE is EFBIG).
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
INIT = "/sandbox-init"  # where a copy of init.c's program lies in the read-only sandbox root, when there is one
HELD = "/held"  # the built programs the service keeps in a zygote (mount_held)
MAX_MESSAGE_BYTES = 1 << 30  # a length header past this means a broken stream, not a request

BATCH_UID_OFFSET = 1 << 22  # a batch's uid is its zygote's plus this: above every pid, so never another zygote's
SECCOMP = b""  # built once at start-up
CAP_LAST_CAP = 63  # read at start-up from /proc/sys/kernel/cap_last_cap
PER_RUN_IPC = False  # set at start-up when SysV IPC cannot be disabled for the zygote's IPC namespace
ROOTLESS = False  # set at start-up in rootless mode: the zygote is root only in a user namespace of its own
CLEAR_REFS = -1  # the zygote's /proc/self/clear_refs, opened at start-up (forget_peak)
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


def check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def cpu_time(pid: int) -> float:
    """CPU seconds a child has used so far (0.0 when it is already gone: then wait4 tells all)."""
    clock = ctypes.c_int()
    if libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:  # returns the error number itself
        return 0.0
    try:
        return time.clock_gettime(clock.value)
    except OSError:
        return 0.0


def _b(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(libc.mount(_b(src), _b(dst), _b(fstype), flags, _b(data)), f"mount {src} on {dst}")


def unshare(flags: int) -> None:
    check(libc.unshare(flags), f"unshare({flags:#x})")


def bind_ro(src: str, dst: str, devices: bool = False) -> None:
    """Bind `src` read-only at `dst`; device nodes keep working only where asked.

    The source's own nosuid/nodev/noexec are kept: in a user namespace (rootless mode) they are locked, and a
    remount that would clear one fails with EPERM (a container's /dev or /tmp may well be noexec)."""
    mount(src, dst, None, MS_BIND | MS_REC)
    locked = os.statvfs(src).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)  # ST_* and MS_* agree on these
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if devices else MS_NODEV) | locked
    mount(None, dst, None, flags)


def enter_user_namespace(uid: int, gid: int) -> None:
    """Rootless mode: a new user namespace in which we are root, our own `uid`/`gid` (the ids outside) mapped to 0.

    The only ids an unprivileged process may map are its own, one each (more takes newuidmap, a setuid helper):
    every run shares this one uid. setgroups is denied first, as the kernel requires before an unprivileged
    gid_map. We then hold every capability, over namespaces this user namespace owns only."""
    unshare(CLONE_NEWUSER)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def disable_sysv_ipc() -> None:
    """SysV IPC objects outlive processes; with none allowed in this IPC namespace nothing passes between runs.

    (POSIX message queues are off through RLIMIT_MSGQUEUE=0; POSIX shm lives in each run's scratch.) A fresh
    /proc, private to our mount namespace, because container runtimes mount /proc/sys read-only.
    """
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name, value in (("shmmni", "0"), ("msgmni", "0"), ("sem", "0 0 0 0")):
        with open(f"/proc/sys/kernel/{name}", "w") as f:
            f.write(value)


def mount_visible_proc(path: str) -> None:
    """Rootless mode: a proc of our own PID namespace in the root, under each run's own /proc. A user namespace
    may mount a proc only where its mount namespace already holds one that shows everything (the kernel's
    mount_too_revealing), and after the pivot the container's is gone. Runs never see this one: each mounts its
    own over it first thing, and may not unmount (seccomp; no capability over this mount namespace anyway)."""
    try:
        mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as exc:
        raise OSError(
            exc.errno,
            f"{exc.strerror}: a user namespace may mount a fresh /proc only where the container's is not masked "
            "(Kubernetes: hostUsers: false with procMount: Unmasked; docker: --security-opt systempaths=unconfined)",
        ) from exc


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
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=512,mode=0755")  # init.c's ~0.8 MB
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
    for d in ("dev", "etc", "proc", "scratch", "held", ".old"):
        os.makedirs(f"{new}/{d}", exist_ok=True)
    if ROOTLESS:
        mount_visible_proc(new + "/proc")
    if cfg.get("init") is not None:  # a copy of what the service holds open: the file it checked, whatever the
        fd = os.open(new + INIT, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o755)  # path names now
        try:
            copy_in(fd, cfg["init"])
        finally:
            os.close(fd)
            os.close(cfg["init"])
    os.symlink("scratch", f"{new}/tmp")  # /tmp is the run's own scratch tmpfs
    for name in DEVICES:
        open(f"{new}/dev/{name}", "w").close()
        bind_ro(f"/dev/{name}", f"{new}/dev/{name}", devices=True)
    os.symlink("/scratch", f"{new}/dev/shm")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{new}/dev/{name}")
    os.symlink("/proc/self/fd", f"{new}/dev/fd")
    # Rootless: runs are uid 0 of our user namespace, named as runs are in root mode; what real root owns shows as
    # the overflow uid, 65534.
    users = (
        {0: "sandbox", 65534: "nobody"} if ROOTLESS else {0: "root", uid: "sandbox", uid + BATCH_UID_OFFSET: "sandbox"}
    )
    etc = {
        "passwd": "".join(
            f"{name}:x:{u}:{u}::{'/scratch' if name == 'sandbox' else '/'}:/bin/false\n" for u, name in users.items()
        ),
        "group": "".join(f"{name}:x:{u}:\n" for u, name in users.items()),
        "hosts": "127.0.0.1 localhost\n",
        "hostname": "sandbox\n",
    }
    for name, text in etc.items():
        with open(f"{new}/etc/{name}", "w") as f:
            f.write(text)
    check(libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], _b(new), _b(new + "/.old")), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    libc.sethostname(b"sandbox", 7)


# Syscalls an unprivileged program could use to widen the kernel surface it reaches (new user namespaces,
# eBPF, io_uring, perf, keyrings, ptrace) or that need privileges it no longer has; Docker's default profile
# blocks the same ones. clone3 answers ENOSYS so libc falls back to clone, whose flags can be checked.
# prlimit64 works on the caller only (pid 0, which is how libc's setrlimit calls it): in a batch the runs share
# their uid with the supervisor, whose limits they must not change.
# memfd_create too: a memfd's pages are charged to no rlimit of the process (16 MiB each by RLIMIT_FSIZE, 256
# of them per process), so sixty of them held 960 MiB under a 64 MiB limit.
DENY = {
    "x86_64": (0xC000003E, 56, (272, 308, 165, 166, 155, 101, 321, 298, 323, 250, 248, 249, 425, 310, 311, 246,
               175, 313, 176, 161, 304, 303, 428, 429, 430, 431, 432, 442, 163, 167, 168, 169, 103, 179, 319)),
    "aarch64": (0xC00000B7, 220, (97, 268, 40, 39, 41, 117, 280, 241, 282, 219, 217, 218, 425, 270, 271, 104,
                105, 273, 106, 51, 265, 264, 428, 429, 430, 431, 432, 442, 89, 224, 225, 142, 116, 60, 279)),
}  # fmt: skip
CLONE3 = 435
PRLIMIT64 = {"x86_64": 302, "aarch64": 261}
NS_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET


def mount_held(size_bytes: int, files: int) -> int:
    """A tmpfs on /held for the built programs the service keeps in this zygote (zygote.stock), read-only to runs
    (a read-only bind over it) and writable to us through the fd returned (the tmpfs beneath, which no path
    reaches any more). Mode 0711: a run may follow a link into it but not list it, and the names are random.
    Rootless mode: 0111, since a run's uid is the owner's there; we write through CAP_DAC_OVERRIDE instead (we
    hold it in our user namespace, which owns this tmpfs)."""
    mode = "0111" if ROOTLESS else "0711"
    mount("tmpfs", HELD, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size_bytes},nr_inodes={files},mode={mode}")
    store = os.open(HELD, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    mount(HELD, HELD, None, MS_BIND)
    mount(None, HELD, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return store


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
    check(libc.prctl(22, 2, ctypes.c_char_p(prog), 0, 0), "seccomp")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def read_msg(fd: int) -> dict | None:
    head = read_exact(fd, 4)
    if head is None:
        return None
    size = struct.unpack(">I", head)[0]
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"a request of {size} bytes: the stream is out of step")
    body = read_exact(fd, size)
    return None if body is None else json.loads(body)


def read_exact(fd: int, n: int) -> bytes | None:
    """n bytes into one buffer (linear: a megabyte of stdin arrives in 64 KiB pipe reads), None at EOF."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if not k:
            return None
        got += k
    return bytes(buf)


def write_msg(fd: int, obj: dict) -> None:
    body = json.dumps(obj).encode()
    write_all(fd, struct.pack(">I", len(body)) + body)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def mount_scratch(scratch_mb: int, uid: int, shared: bool = False) -> None:
    """A size-capped tmpfs on /scratch, mounted by the zygote (one per run or batch) so that the files a run
    leaves (a compiler's output) can be read back after its whole PID namespace is gone; owned by `uid`.

    `shared` (a batch): owned by root and sticky like /tmp, so the runs may add files but not change or remove
    the program's, which the zygote writes as root.
    """
    # Group root may read (mode 0750, gid 0): the zygote lists and reads build outputs without CAP_DAC_OVERRIDE.
    # A batch's scratch is mounted over a prepared single run's (zygote.py) and unmounted first.
    owner = "mode=1777,uid=0" if shared else f"mode=0750,uid={uid}"  # rootless: uid 0 either way
    opts = f"size={scratch_mb}m,nr_inodes=4096,{owner},gid=0"
    mount("tmpfs", "/scratch", "tmpfs", MS_NOSUID | MS_NODEV, opts)


def resize_scratch(scratch_mb: int) -> None:
    """A new cap for the (empty) /scratch. The size is the filesystem's, so it holds in the copy of the mount
    a prepared run's own mount namespace has."""
    mount(None, "/scratch", None, MS_REMOUNT | MS_NOSUID | MS_NODEV, f"size={scratch_mb}m")


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
            st = os.fstat(fd)
            if st.st_mode & 0o170000 != 0o100000:  # not S_IFREG
                continue
            total += st.st_size  # every process of the run is gone: the size no longer changes
            if total > max_bytes:
                return out, f"output files exceed {max_bytes} bytes"
            data = bytearray(st.st_size)  # one buffer: appending chunks copied 100 MiB in 7 s
            view, got = memoryview(data), 0
            while got < len(data) and (n := os.readv(fd, [view[got:]])):
                got += n
        finally:
            os.close(fd)
        out[name] = base64.b64encode(view[:got]).decode()
    return out, ""


def setup_mounts() -> None:
    """Fresh mount namespace (it keeps the zygote's /scratch tmpfs) with this PID namespace's /proc (init.c's
    set_up does the same)."""
    unshare(CLONE_NEWNS | (CLONE_NEWIPC if PER_RUN_IPC else 0))
    if not ROOTLESS:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        return
    # Rootless: the run's uid is the kernel's uid of the worker's namespaces' owner, and /proc/sys files of
    # namespaced sysctls (net.*, SysV IPC's kernel.shm*/msg*/sem) are writable by that uid without a capability:
    # /proc/sys read-only, or a run could switch SysV IPC back on for later runs. hidepid=2: a non-dumpable init
    # shows /proc/1/* as owned by that same uid; hidden, its few writable files (clear_refs) are out of reach.
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
    mount(None, "/proc/sys", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def first_to_die() -> None:
    """If memory runs out, the OOM killer takes runs first."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    os.write(fd, b"1000")
    os.close(fd)


def as_file_owner(uid: int) -> None:
    """Create and write files as `uid` (0: as root again): the filesystem uid and gid alone, so the zygote can
    write a run's files into its scratch, owned by the run, without CAP_CHOWN or CAP_DAC_OVERRIDE. Per thread;
    the zygote has one."""
    libc.setfsgid(uid)
    libc.setfsuid(uid)
    if libc.setfsuid(-1) != uid or libc.setfsgid(-1) != uid:  # -1 changes nothing and returns the current ids
        raise OSError(f"could not take filesystem ids {uid}")


def drop_bounding_set() -> None:
    """An empty capability bounding set (when CAP_SETPCAP allows): it bounds what an execve may grant. Per run's
    init, not once for the zygote: init.c is exec'd as root and needs its capabilities for its own set-up."""
    for cap in range(CAP_LAST_CAP + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # no CAP_SETPCAP: moot anyway for a non-root uid under no_new_privs and seccomp


SYS_CAPSET = {"x86_64": 126, "aarch64": 91}


def drop_capabilities() -> None:
    """Empty effective, permitted and inheritable sets (capset, version 3). Rootless mode: a setresuid to the uid we
    already have (0 in our user namespace) does not clear them."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable}, all zero
    check(libc.syscall(SYS_CAPSET[os.uname().machine], header, data), "capset")


def become(uid: int) -> None:
    """An empty bounding set, no_new_privs, then the unprivileged uid.

    Rootless mode: a user namespace of the run's own first (per run: RLIMIT_NPROC is counted per user namespace,
    so a run counts its own processes, not every run's under the one uid), then no capabilities at all."""
    if ROOTLESS:
        enter_user_namespace(0, 0)  # 0 of the zygote's namespace, which is our uid outside
    drop_bounding_set()  # after the new user namespace: entering one fills the bounding set again
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if not ROOTLESS:  # setgroups is denied in a user namespace made without privileges
        os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if ROOTLESS:
        drop_capabilities()
    # A uid change clears the parent-death signal, so it is set after: zygote gone -> this init and its
    # whole PID namespace gone.
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")


def write_files(req: dict, mode: int) -> None:
    """The program's files into /scratch, created by the caller's filesystem uid. A held file (its path in /held,
    zygote.stock) that the run executes is linked, not copied: a megabyte of Go binary costs a symlink. Others
    are copied, as a runtime may resolve the links of what it reads (node places a linked script in /held)."""
    for name, data in [*((n, t.encode()) for n, t in req["files"].items()), *req["blobs"].items()]:
        if isinstance(data, str) and req["argv"][0] == "./" + name:
            os.symlink(data, "/scratch/" + name)
            continue
        fd = os.open("/scratch/" + name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            if isinstance(data, str):
                held = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    copy_in(fd, held)
                finally:
                    os.close(held)
            else:
                copy_in(fd, data)
        finally:
            os.close(fd)


def receive_fds(sock: socket.socket, size: int, most: int) -> tuple[bytes, list[int]]:
    """socket.recv_fds with every fd received close-on-exec: CPython 3.11's recv_fds drops its flags argument
    (MSG_CMSG_CLOEXEC included), and an inheritable one would reach the next program we exec or spawn."""
    message, fds, _, _ = socket.recv_fds(sock, size, most)
    for fd in fds:
        os.set_inheritable(fd, False)
    return message, fds


def send_request(fd: int, data: bytes, passed: int | None) -> None:
    """A prepared init's request on its socket, with the fd `passed` (its stdin) riding on the first bytes."""
    if passed is None:
        write_all(fd, data)  # one call: no socket object to build on the run's path
        return
    with socket.socket(fileno=os.dup(fd)) as sock:
        socket.send_fds(sock, [data], [passed])


def receive_request(fd: int) -> tuple[bytes, int | None]:
    """All of a request, up to the zygote's close, and the fd that came with it, if one did."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        data, fds = receive_fds(sock, 1 << 16, 1)
        if data:
            while chunk := sock.recv(1 << 16):
                data += chunk
    return data, fds[0] if fds else None


def send_namespace(fd: int) -> None:
    """A prepared init's own mount namespace, to the zygote on its request socket (`zygote.release`). Sent, not
    opened by the zygote: /proc/PID/ns of a process under another uid takes CAP_SYS_PTRACE, which the
    deployments do not grant."""
    ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            socket.send_fds(sock, [b"n"], [ns])
    finally:
        os.close(ns)


def receive_namespace(fd: int) -> int:
    """What send_namespace sent, or -1 when the init died before it sent it."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        _, fds = receive_fds(sock, 1, 1)
    return fds[0] if fds else -1


def copy_in(fd: int, data: bytes | int) -> None:
    """`data` into fd: bytes, or all of the file open at fd `data`, copied in the kernel, its offset untouched."""
    if not isinstance(data, int):
        write_all(fd, data)
        return
    size, done = os.fstat(data).st_size, 0
    while done < size:
        sent = os.sendfile(fd, data, done, size - done)
        if not sent:
            raise OSError(f"a held file ended at {done} of {size} bytes")
        done += sent


def receive_fd(channel: socket.socket) -> int:
    """One fd the service passed on the fd channel (a stdin as a sealed memfd)."""
    _, fds = receive_fds(channel, 1, 1)
    if len(fds) != 1:
        raise OSError("the service's fd channel is out of step")
    return fds[0]


def memfd_holding(data: bytes, name: str) -> int:
    fd = os.memfd_create(name)
    write_all(fd, data)
    return fd


def stdin_fd(data: bytes | int) -> int:
    """The run's stdin: a memfd holding `data` (a program may seek or mmap it), /dev/null when empty. A memfd
    the service passed is sealed, so a run that writes to its stdin changes nothing."""
    if isinstance(data, int):  # one run at a time reads it: a run queued again in a fresh batch starts over
        os.lseek(data, 0, os.SEEK_SET)
        return os.dup(data)
    if not data:
        return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    stdin = memfd_holding(data, "stdin")
    os.lseek(stdin, 0, os.SEEK_SET)
    return stdin


M_MMAP_THRESHOLD = -3


def keep_heap_small() -> None:
    """Every allocation of 128 KiB or more its own mapping, unmapped when freed, for the life of the zygote.

    glibc's default threshold is dynamic: freeing a large block raises it to that block's size (up to 32 MiB), so
    later blocks that size come from the heap and stay resident once freed. After a request read back a few 16 MB
    files the zygote stayed at ~50 MB, and forget_peak could reset its high-water mark only to that: every later
    run reported a 50 MB peak (a print(1) at a 40 MB limit was a memory_limit). A fixed threshold turns the
    dynamic one off; a run's outputs, read-back files and replies all come and go as mappings.
    """
    libc.mallopt(M_MMAP_THRESHOLD, 128 << 10)


def forget_peak() -> None:
    """Reset this process's peak resident size to its current size, before a run's init is spawned from it.

    A run's reported peak (ru_maxrss) starts at the high-water mark of the memory its init was spawned from:
    the kernel keeps the old memory's peak at an exec, and a vfork'ed child's old memory is ours. Without
    this, one request that read back a 50 MB file made every later run report 98 MB, and a crash of a small
    program at a 100 MB limit a memory_limit. What stays is our current size, ~12 MB: a floor on the peaks.
    """
    if CLEAR_REFS >= 0:
        os.write(CLEAR_REFS, b"5")


def rlimits(limits: dict) -> list[tuple[int, int]]:
    """(resource, value) for each rlimit of a run, soft and hard alike, in the order they are set."""
    # RLIMIT_AS counts address space a runtime only reserves (the JVM's class space, V8's code range, Go's
    # arenas), so those runtimes get RLIMIT_DATA: writable memory actually mapped.
    memory = r.RLIMIT_DATA if limits.get("memory_kind") == "data" else r.RLIMIT_AS
    # Deep recursion in compiled contest code; glibc also sizes thread stacks by it. Set first: the stack is
    # part of the address space.
    stack = [(r.RLIMIT_STACK, limits["stack_mb"] << 20)] if limits.get("stack_mb") else []
    return [
        *stack,
        (memory, limits["memory_mb"] << 20),
        (r.RLIMIT_CPU, int(limits["cpu_s"])),  # soft = hard: at the hard limit the kernel sends SIGKILL alone
        (r.RLIMIT_NPROC, limits["max_processes"]),
        (r.RLIMIT_FSIZE, limits["max_file_bytes"]),
        (r.RLIMIT_NOFILE, 256),
        (r.RLIMIT_CORE, 0),
        (r.RLIMIT_MSGQUEUE, 0),
    ]


def beside_init(limits: dict) -> dict:
    """A run's limits with one process more: its namespace's init (a single run's, or a batch's supervisor) shares
    the run's uid, and so its RLIMIT_NPROC count, yet is not one of the program's processes."""
    return {**limits, "max_processes": limits["max_processes"] + 1}


def wait_for(program: int) -> int:
    """As an init: reap until `program` has exited (an orphan re-parented to us goes on the way: a zombie counts
    against the run's RLIMIT_NPROC until it is reaped); its wait status."""
    while True:
        pid, status = os.waitpid(-1, WALL)
        if pid == program:
            return status


def exit_record(wait_status: int) -> bytes:
    """How a single run's init reports its program's wait status on the status pipe, after any set-up error's
    text: a NUL byte, then the status in decimal (init.c writes the same)."""
    return b"\0" + str(wait_status).encode()


def read_status(data: bytes) -> tuple[str, int | None]:
    """What a single run's init wrote on the status pipe: (its set-up error, empty when none; the program's wait
    status, None when it did not report one: killed by us, or failed before its program ran)."""
    error, nul, record = data.partition(b"\0")
    try:
        status = int(record) if nul else None
    except ValueError:
        return f"a malformed exit record after {error[-200:]!r}", None
    return error.decode("utf-8", "replace"), status


def set_limits(pairs: list[tuple[int, int]]) -> None:
    for res, val in pairs:
        r.setrlimit(res, (val, val))


STDIN_NULL, STDIN_OWN, STDIN_PASSED = 0, 1, 2  # a single run's stdin: /dev/null, its prepared memfd, a passed fd


def encode_request(stdin: int, limits: list[tuple[int, int]], argv: list[str], env: dict[str, str]) -> bytes:
    """A prepared init's request, as init.c reads it: little-endian u64 words (stdin, the counts, the rlimits),
    then argv and env as NUL-terminated strings."""
    strings = [*argv, *(f"{k}={v}" for k, v in env.items())]
    text = "\0".join(strings) + "\0"
    if text.count("\0") != len(strings):
        raise ValueError("a NUL byte in a program's arguments or environment")
    words = [stdin, len(limits), len(argv), len(env), *(x for pair in limits for x in pair)]
    return struct.pack(f"<{len(words)}Q", *words) + text.encode()


def decode_request(data: bytes) -> tuple[int, list[tuple[int, int]], list[str], dict[str, str]]:
    """encode_request's inverse, for the init that sets up in Python (zygote._child)."""
    stdin, nlimits, nargs, _ = struct.unpack_from("<4Q", data)
    words = struct.unpack_from(f"<{2 * nlimits}Q", data, 32)
    strings = [s.decode() for s in data[32 + 16 * nlimits :].split(b"\0")[:-1]]
    env = dict(s.split("=", 1) for s in strings[nargs:])
    return stdin, list(zip(words[::2], words[1::2], strict=True)), strings[:nargs], env


STDERR_KEEP_BYTES = 32 << 10  # a run's stderr is kept to its first and its last this many bytes
STDERR_FLOOD_BYTES = 256 << 20  # past this much stderr the run is stopped (output_limit): a flood, not debugging
PROOF_KEEP_BYTES = 64  # more than the nonce on the proof fd is no proof; the rest is read and dropped


class Output:
    """What a run wrote to one of its fds, kept bounded while it is read: stdout whole (the caller stops the run
    past its cap), stderr's head and tail (a traceback's end and Go's first words both matter, megabytes of debug
    output between them do not), the proof fd's first bytes."""

    def __init__(self, name: str) -> None:
        self.name, self.seen = name, 0
        self.head, self.tail = bytearray(), bytearray()

    def add(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self.name == "err":
            room = max(0, STDERR_KEEP_BYTES - len(self.head))
            self.head += chunk[:room]
            self.tail += chunk[room:]
            if len(self.tail) > 2 * STDERR_KEEP_BYTES:  # trimmed now and then, not on every chunk
                del self.tail[:-STDERR_KEEP_BYTES]
        elif self.name != "proof" or len(self.head) <= PROOF_KEEP_BYTES:
            self.head += chunk

    def data(self) -> bytes:
        tail = self.tail[-STDERR_KEEP_BYTES:]
        cut = self.seen - len(self.head) - len(tail)  # by the trims while reading, or here
        if cut <= 0 or self.name != "err":
            return bytes(self.head + self.tail)
        return bytes(self.head) + f"\n[... {cut} bytes of stderr cut ...]\n".encode() + bytes(tail)


def read_outputs(done: int, readers: dict[str, int], limits: dict, deadline: float) -> tuple[str | None, dict]:
    """Read outputs until every writer is gone and `done` is readable, the deadline passes, or the output limit
    is hit: (None, or the verdict "timeout" / "output_limit"; the bytes read per reader name). Only stdout counts
    against the cap; stderr is kept bounded (Output) and stops the run only as a flood; the proof fd never counts."""
    outputs = {fd: Output(name) for name, fd in readers.items()}
    poller = select.poll()
    for fd in (*outputs, done):
        poller.register(fd, select.POLLIN)
    open_fds, verdict = {*outputs, done}, None
    stop_at = {"out": limits["max_output_bytes"], "err": STDERR_FLOOD_BYTES}
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
            output = outputs[fd]
            output.add(chunk)
            if output.seen > stop_at.get(output.name, output.seen):
                verdict = "output_limit"
        if verdict is not None:
            break
    return verdict, {output.name: output.data() for output in outputs.values()}


def wire_text(data: bytes) -> str | dict:
    """Output for the reply's JSON: its text when it is UTF-8 (nearly always), else {"base64": ...}, which JSON text
    can carry exactly; ExecResult reads both forms, so a program's binary stdout reaches the API byte for byte."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def outcome(
    got: dict, limits: dict, nonce: bytes | None, wait_status: int | None, cpu_s: float, peak_mb: float
) -> dict:
    """The reply's fields for one run from what `read_outputs` read and how the program ended."""
    cap = limits["max_output_bytes"]
    exit_code = None
    if wait_status is not None:
        exit_code = -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)
    return {
        "exit_code": exit_code,
        "stdout": wire_text(got["out"][:cap]),
        "stderr": got["err"].decode("utf-8", "replace"),  # already bounded (Output)
        "proof": nonce is not None and got["proof"] == nonce,
        "cpu_s": cpu_s,
        "peak_mb": peak_mb,
    }
