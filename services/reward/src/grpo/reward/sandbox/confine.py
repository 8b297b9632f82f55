"""The kernel calls the sandbox is made of, for the zygote (zygote.py) and its batches (batch.py).

Stdlib only, like them: it runs in the zygote's process (`python3 -I -S`), never in the service's. Namespaces,
mounts, the read-only root, the seccomp filter, the unprivileged uid and capabilities, the zygote's own memory,
and reaping. Its siblings, stdlib only too: protocol.py (the messages between the processes and fd passing),
rlimits.py (a run's limits), run_files.py (a run's files in and out) and run_output.py (reading its output).
"""

# Syscall-level code on purpose: plain os calls map one-to-one to what the kernel does.
# ruff: noqa: PTH103, PTH106, PTH112, PTH113, PTH114, PTH115, PTH120, PTH211

from __future__ import annotations

import ctypes
import os
import signal
import struct
import time

from grpo.reward.sandbox.run_files import copy_in

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

BATCH_UID_OFFSET = 1 << 22  # a batch's uid is its zygote's plus this: above every pid, so never another zygote's
SECCOMP = b""  # built once at start-up
CAP_LAST_CAP = 63  # read at start-up from /proc/sys/kernel/cap_last_cap
PER_RUN_IPC = False  # set at start-up when SysV IPC cannot be disabled for the zygote's IPC namespace
ROOTLESS = False  # set at start-up in rootless mode: the zygote is root only in a user namespace of its own
CLEAR_REFS = -1  # the zygote's /proc/self/clear_refs, opened at start-up (forget_peak)
PROC = -1  # a /proc of the zygote's own PID namespace, opened at start-up (open_proc): its runs' CPU time
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


def open_proc(path: str) -> int:
    """An fd of the proc at `path` where it shows our own PID namespace (its "self" is our pid), else -1: the
    zygote reads its runs' CPU time in it while they run (run_output.stat_cpu_s). Root mode: the proc
    disable_sysv_ipc mounted, or the container's (our PID namespace is the container's), opened before the pivot;
    the fd keeps it readable to us once it is detached, and out of every run's reach. Rootless: the one
    mount_visible_proc mounted, which runs cover with their own."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        if os.readlink("self", dir_fd=fd) == str(os.getpid()):
            return fd
    except OSError:
        pass
    os.close(fd)
    return -1


def build_root(cfg: dict, uid: int) -> None:
    """Enter private mount/net/uts namespaces and pivot into a minimal read-only root."""
    global PER_RUN_IPC, PROC
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
    PROC = open_proc(new + "/proc" if ROOTLESS else "/proc")
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


def wait_for(program: int) -> int:
    """As an init: reap until `program` has exited (an orphan re-parented to us goes on the way: a zombie counts
    against the run's RLIMIT_NPROC until it is reaped); its wait status."""
    while True:
        pid, status = os.waitpid(-1, WALL)
        if pid == program:
            return status
