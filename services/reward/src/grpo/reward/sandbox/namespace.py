"""The default sandbox: a pool of zygote processes (zygote.py) that each fork one namespaced run at a time."""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import queue
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Generator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from grpo.reward.sandbox.base import (
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

log = logging.getLogger(__name__)

ZYGOTE = Path(__file__).with_name("zygote.py")
RO_BINDS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin")
# Debian's JDK keeps its configuration under /etc (java.security, jvm.cfg); the dynamic linker's cache saves every
# native program a search of a dozen directories per library. Runs see nothing else of /etc.
ETC_BINDS = ("java-*", "ld.so.cache")
RUN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/scratch", "LANG": "C.UTF-8", "TMPDIR": "/scratch"}
REPLY_SLACK_S = 5.0  # the zygote enforces the deadline itself; this only catches a wedged zygote
CANCEL_POLL_S = 0.05  # how often a run waiting for its reply looks whether it was cancelled
MAX_REPLY_BYTES = 1 << 30  # a length header past this means a broken stream, not a reply
MODES = ("auto", "root", "rootless")
REMEDY = (  # root mode: what docker-compose.yml and the Helm chart grant the reward container, and no more
    "root mode runs as root with CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID and CAP_KILL, and "
    "mount/unshare/pivot_root allowed by seccomp and AppArmor (docker: --user 0 --cap-add SYS_ADMIN --cap-add "
    "SETUID --cap-add SETGID --cap-add KILL --security-opt seccomp=unconfined --security-opt apparmor=unconfined; "
    "kubernetes: runAsUser 0, capabilities drop [ALL] add [SYS_ADMIN, SETUID, SETGID, KILL], seccompProfile "
    "Unconfined, AppArmor unconfined)"
)
REMEDY_ROOTLESS = (  # rootless mode: no root, no capability; the kernel and the container runtime must allow it
    "rootless mode runs as any uid where the kernel allows unprivileged user namespaces (user.max_user_namespaces "
    "> 0; kernel.unprivileged_userns_clone=1 and kernel.apparmor_restrict_unprivileged_userns=0 where those exist) "
    "and seccomp and AppArmor allow unshare, mount and pivot_root without CAP_SYS_ADMIN, which the runtimes' "
    "default profiles do not (docker: --security-opt seccomp=deploy/seccomp/reward-rootless.json --security-opt "
    "apparmor=unconfined; kubernetes: seccompProfile Localhost with that profile, an AppArmor profile that allows "
    "mount and userns, and an unmasked /proc where the runtime masks it: docs/reward.md#sandbox-modes)"
)
NEVER_UNCONFINED = "the sandbox never falls back to running code unconfined"
ISOLATION = (
    "linux namespaces (pid, mount, net, ipc, uts) from a zygote pool: minimal read-only root (/usr, /bin, /lib*), "
    "private size-capped tmpfs scratch, own /proc, no network interface up, SysV IPC disabled, unprivileged "
    "per-worker uid, no capabilities, no_new_privs, seccomp (no new namespaces, ptrace, bpf, io_uring, perf, "
    "keyrings, mounts), rlimits (address space, cpu, nproc, fsize, nofile), whole PID namespace killed at the deadline; "
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


# Built programs a zygote keeps between requests (files in its /held tmpfs), so that the runs of one submission
# after the first send only a name: a 1.2 MB Go binary costs about 3 ms to pass through the pipe. Per zygote; the
# service holds the same objects meanwhile. Small files cost less to send than to keep.
HELD_BYTES = 32 << 20
HELD_FILES = 64
HELD_MIN_BYTES = 8 << 10
PASSED_MIN_BYTES = 64 << 10  # a stdin from this size is passed as a memfd, not written through the pipe
SEALED = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


class Held:
    """The service's copy of what one zygote holds: key -> the very bytes object sent under it, least recently
    used first. A key is the object's id, unique while we hold the object; the zygote forgets what we evict."""

    def __init__(self) -> None:
        self.blobs: OrderedDict[str, bytes] = OrderedDict()
        self.size = 0

    def plan(
        self, blobs: dict[str, bytes], holdable: frozenset[str] = frozenset()
    ) -> tuple[list[list[Any]], list[str], list[bytes]]:
        """[name, key or None, size or None (held: nothing sent)] per file, the keys to forget, the bytes to send.
        Only `holdable` files are kept (built programs): a checker's input or a test's files come once."""
        listed: list[list[Any]] = []
        forget: list[str] = []
        sent: list[bytes] = []
        used: set[str] = set()
        for name, data in blobs.items():
            key = f"{id(data):x}"
            if self.blobs.get(key) is data:
                self.blobs.move_to_end(key)
                used.add(key)
                listed.append([name, key, None])
                continue
            keep = name in holdable and HELD_MIN_BYTES <= len(data) <= HELD_BYTES
            while keep and (self.size + len(data) > HELD_BYTES or len(self.blobs) >= HELD_FILES):
                victim = next((k for k in self.blobs if k not in used), None)
                if victim is None:  # everything held is in this request: send this one without keeping it
                    keep = False
                    break
                self.size -= len(self.blobs.pop(victim))
                forget.append(victim)
            if keep:
                self.blobs[key] = data
                self.size += len(data)
                used.add(key)
            listed.append([name, key if keep else None, len(data)])
            sent.append(data)
        return listed, forget, sent


class ZygoteError(RuntimeError):
    """The zygote died or broke the protocol."""


def _default_interpreter() -> str:
    """A python3 that lives under the read-only binds (the service's own venv is hidden from runs)."""
    for path in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(path).exists():
            return path
    raise SandboxUnavailable("no /usr/bin/python3 or /usr/local/bin/python3 to run sandboxed programs with")


class Zygote:
    """One launcher process and the pipes to it; used by one thread at a time."""

    def __init__(
        self, interpreter: str, uid_base: int, init: int | None = None, rootless: bool = False, user: int | None = None
    ) -> None:
        """`rootless`: the zygote makes its own user namespace (zygote.go_rootless). `user`: it is started as that uid
        and gid, with no supplementary group and so no capability (a root service whose sandbox runs rootless)."""
        etc = sorted(str(p) for pattern in ETC_BINDS for p in Path("/etc").glob(pattern) if p.exists())
        self._ahead, self._spare = bytearray(), bytearray(1 << 16)  # what _read_exact read past its message
        # Large stdins go as memfds over a socket beside the pipes (the pipe would copy them twice, slowly).
        self.fd_channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cfg = {
            "ro_binds": [*RO_BINDS, *etc],
            "uid_base": uid_base,
            "check_exists": [interpreter],
            "fd_channel": theirs.fileno(),
            "init": init,  # an fd of the single runs' PID 1 (init.c), or None: they set up in Python
            "held_bytes": HELD_BYTES + HELD_FILES * 4096,  # each file rounded up to whole pages
            "held_files": HELD_FILES + 8,
            "rootless": rootless,
        }
        remedy = REMEDY_ROOTLESS if rootless else REMEDY
        ids: dict[str, Any] = {} if user is None else {"user": user, "group": user, "extra_groups": []}
        # Empty environment and isolated interpreter: nothing of the service's environment reaches the zygote.
        try:
            self.proc = subprocess.Popen(
                [interpreter, "-I", "-S", str(ZYGOTE), json.dumps(cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={},
                close_fds=True,
                pass_fds=(theirs.fileno(), *([] if init is None else [init])),
                cwd="/",
                start_new_session=True,  # no run can reach the service through a shared process group
                **ids,
            )
        except OSError as exc:
            self.fd_channel.close()
            raise SandboxUnavailable(f"sandbox zygote cannot start with interpreter {interpreter}: {exc}") from exc
        finally:
            theirs.close()
        try:
            hello = self.receive(time.monotonic() + 10.0)
        except ZygoteError as exc:
            self.kill()
            raise SandboxUnavailable(f"sandbox zygote cannot start: {exc}") from exc
        if not hello.get("ready") or bool(hello.get("rootless")) != rootless:
            self.kill()
            raise SandboxUnavailable(f"sandbox zygote could not start: {hello.get('error')}; {remedy}")
        self.uid = int(hello["uid"])
        self.rootless = rootless
        self.started: dict[str, Any] = hello.get("started", {})  # its uid and CapEff before it made any namespace
        # The process that is the zygote: rootless, the child of the one we started (zygote.go_rootless).
        self.pid = self._only_child() if rootless else self.proc.pid
        self.batches = bool(hello.get("batches"))
        self.held = Held()

    def request(
        self,
        req: dict[str, Any],
        deadline: float,
        stdin: bytes = b"",
        blobs: dict[str, bytes] | None = None,
        holdable: frozenset[str] = frozenset(),
        cancel: threading.Event | None = None,
    ) -> dict[str, Any]:
        """One run: the JSON request, then `stdin` and the binary files raw (no JSON or base64 for megabytes)."""
        self.send(req, stdin, blobs, holdable=holdable)
        return self.receive(deadline, cancel)

    def send(
        self,
        req: dict[str, Any],
        stdin: bytes = b"",
        blobs: dict[str, bytes] | None = None,
        stdins: list[bytes] | None = None,
        holdable: frozenset[str] = frozenset(),
    ) -> None:
        """A request; `stdins` make it a batch (one reply per stdin, then {"end": true}). Binary files the zygote
        still holds from an earlier request are named, not sent."""
        stdins = stdins or []
        listed, forget, sent = self.held.plan(blobs or {}, holdable)
        sizes = [len(data) if len(data) < PASSED_MIN_BYTES else None for data in (stdin, *stdins)]  # None: passed
        head = {**req, "stdin_bytes": sizes[0], "blobs": listed, "forget": forget}
        if stdins:
            head["batch_stdin_sizes"] = sizes[1:]
        body = orjson.dumps(head)  # a single run's request and reply: stdlib json costs ~0.08 ms more here
        # In the order the zygote reads them, each on its own channel: either blocks only until the zygote has
        # read what is ahead of it, so neither fills up while the zygote waits on the other (a socket holds
        # ~280 passed fds; a batch may have more).
        pending = [struct.pack(">I", len(body)) + body]
        for data, size in zip((stdin, *stdins), sizes, strict=True):
            if size is not None:
                pending.append(data)
                continue
            self._write(b"".join(pending))
            pending = []
            self._pass(data)
        self._write(b"".join(pending) + b"".join(sent))

    def _pass(self, data: bytes) -> None:
        """A stdin as a sealed memfd on the fd channel, where the zygote takes it in its turn."""
        fd = os.memfd_create("stdin", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALED)  # a run cannot change it (a batch may start it again)
            os.lseek(fd, 0, os.SEEK_SET)
            socket.send_fds(self.fd_channel, [b"f"], [fd])
        except OSError as exc:
            raise ZygoteError(f"cannot pass a stdin to the zygote: {exc}") from exc
        finally:
            os.close(fd)

    def control(self, word: str) -> None:
        """A batch's control message: "next" (a stream's next run), "stop" (no more runs), "close" (after the end)."""
        body = orjson.dumps({"control": word})
        self._write(struct.pack(">I", len(body)) + body)

    def _write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError as exc:
            raise ZygoteError(f"zygote pipe broken: {exc}") from exc

    def receive(self, deadline: float, cancel: threading.Event | None = None) -> dict[str, Any]:
        """The next reply; RunCancelled when `cancel` is set while waiting for it (the zygote is then mid-run: the
        caller must kill it)."""
        size = struct.unpack(">I", self._read_exact(4, deadline, cancel))[0]
        if size > MAX_REPLY_BYTES:
            raise ZygoteError(f"a reply of {size} bytes: the zygote's stream is out of step")
        return orjson.loads(self._read_exact(size, deadline, cancel))

    def _read_exact(self, n: int, deadline: float, cancel: threading.Event | None = None) -> bytes:
        """n bytes of the zygote's stream. Each read also takes what follows them, up to 64 KiB (`_ahead`): a
        small reply costs one read for its length and body, and a batch's held replies one read for all."""
        assert self.proc.stdout is not None
        ahead = self._ahead
        if len(ahead) >= n:
            data = bytes(ahead[:n])
            del ahead[:n]
            return data
        fd, buf, got = self.proc.stdout.fileno(), bytearray(n), len(ahead)
        buf[:got] = ahead
        ahead.clear()
        view = memoryview(buf)
        while got < n:  # into one buffer: a large reply arrives in many pipe reads
            left = deadline - time.monotonic()
            if left <= 0:
                raise ZygoteError("zygote did not answer in time")
            if not select.select([fd], [], [], left if cancel is None else min(left, CANCEL_POLL_S))[0]:
                if cancel is not None and cancel.is_set():
                    raise RunCancelled("the run's request ended")
                continue
            k = os.readv(fd, [view[got:], self._spare])
            if not k:
                raise ZygoteError(f"zygote exited (code {self.proc.poll()})")
            ahead += self._spare[: max(0, k - (n - got))]
            got = min(n, got + k)
        return bytes(buf)

    def _only_child(self) -> int:
        pid = self.proc.pid
        try:
            return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return pid  # gone already: the next request finds out

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL; the runs' init processes follow through PR_SET_PDEATHSIG."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.fd_channel.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:  # closing flushes: a request the dead zygote never read is a broken pipe
                    pass


def classify(reply: dict[str, Any]) -> tuple[str, int | None]:
    """Map the zygote's raw reply to (status, exit_code)."""
    if reply.get("error") or reply.get("setup_error"):
        return "sandbox_error", None
    exit_code = reply["exit_code"]
    if reply["verdict"] is not None:  # killed by us (deadline or output limit): no exit code of its own
        return reply["verdict"], None
    if exit_code == 0:
        # Shared mappings escape RLIMIT_DATA (native code, the JVM, V8): a run that held more than its limit that
        # way and exited 0 still broke it. Its resident peak counts them.
        over = reply.get("peak_mb", 0.0) > reply.get("memory_limit_mb", float("inf"))
        return ("memory_limit", 0) if over else ("ok", 0)
    # A SIGKILL we did not send, with the CPU time used up, came from the kernel: the CPU-time rlimit, a deadline
    # too. (A run could also kill itself, and then it failed either way.) wait4's user+system time falls short
    # of the count the kernel enforces when the CPUs are contended (0.85 s at a 1 s limit, 3 test processes on
    # 2 vCPUs), hence the margin.
    if exit_code == -signal.SIGKILL and reply.get("cpu_s", 0.0) >= 0.75 * reply.get("cpu_limit_s", float("inf")):
        return "timeout", exit_code
    # A native program that ignores a failed allocation crashes; at its memory limit, that crash is the limit.
    at_memory_limit = reply.get("peak_mb", 0.0) >= 0.9 * reply.get("memory_limit_mb", float("inf"))
    # A thread or process refused below the memory limit: the process limit. (glibc reports a thread stack it
    # could not map as EAGAIN too: threads whose stacks, not their number, pass the memory limit read the same,
    # and are process_limit unless the peak reached the memory limit; stacks of hundreds of MiB are rare.)
    if not at_memory_limit and _refused_a_process(reply["stderr"]):
        return "process_limit", exit_code
    if _died_of_memory(reply["stderr"]) or at_memory_limit:
        return "memory_limit", exit_code
    # A binary whose static data alone is past the rlimit (`static char a[300 << 20]`) dies in its exec, a SIGSEGV
    # or SIGKILL from the kernel before it has run or written anything.
    never_ran = (
        exit_code in (-signal.SIGSEGV, -signal.SIGKILL) and not reply.get("stdout") and reply.get("cpu_s", 1) < 0.05
    )
    if never_ran and reply.get("image_mb", 0.0) > reply.get("rlimit_mb", float("inf")):
        return "memory_limit", exit_code
    return "runtime_error", exit_code


PT_LOAD, PF_W = 1, 2


def writable_image_mb(binary: bytes) -> float:
    """MiB of writable memory an ELF64 (little-endian) binary's loadable segments need (data and bss, which
    RLIMIT_DATA counts at its exec); 0.0 for anything else (a script)."""
    if len(binary) < 64 or binary[:6] != b"\x7fELF\x02\x01":
        return 0.0
    (phoff,) = struct.unpack_from("<Q", binary, 32)
    phentsize, phnum = struct.unpack_from("<HH", binary, 54)
    total = 0
    for i in range(phnum):
        at = phoff + i * phentsize
        if at + 56 > len(binary):
            break
        kind, flags = struct.unpack_from("<II", binary, at)
        if kind == PT_LOAD and flags & PF_W:
            total += struct.unpack_from("<Q", binary, at + 40)[0]  # p_memsz
    return total / (1 << 20)


def image_mb(launch: Launch) -> float:
    """writable_image_mb of the built program a native run executes (./main), else 0.0."""
    program = launch.binary_files.get(launch.argv[0].removeprefix("./")) if launch.argv[0].startswith("./") else None
    return writable_image_mb(program) if program else 0.0


# The last words of a program that ran out of memory: libc, libstdc++, Go, Rust, the JVM, V8 (Python: MemoryError).
OUT_OF_MEMORY = ("Cannot allocate memory", "cannot allocate", "std::bad_alloc", "runtime: out of memory",
                 "fatal error: out of memory",  # Go, e.g. "... allocating heap arena map"
                 "memory allocation of", "java.lang.OutOfMemoryError",
                 "JavaScript heap out of memory", "Allocation failed - process out of memory")  # fmt: skip


def _last_words(stderr: str) -> list[str]:
    """The lines of stderr a runtime's fatal message is in: the JVM and V8 print a stack after it; Go prints it
    first, then every goroutine."""
    lines = stderr.rstrip().splitlines()
    return lines[:3] + lines[-40:]


def _died_of_memory(stderr: str) -> bool:
    python = any(line.startswith("MemoryError") for line in stderr.rstrip().splitlines()[-3:])
    return python or any(marker in line for line in _last_words(stderr) for marker in OUT_OF_MEMORY)


# A thread or process refused (fork/clone's EAGAIN: the run's RLIMIT_NPROC, max_processes), in the words of the
# JVM (17; 8), Python's threading and Go's runtime. The JVM's is an OutOfMemoryError, so this is read first.
NO_THREAD = ("unable to create native thread", "unable to create new native thread", "can't start new thread",
             "failed to create new OS thread")  # fmt: skip
# Elsewhere, EAGAIN's message (or name) beside the call refused, in the same line or just above it: C's
# perror("fork") or strerror after pthread_create, Rust's "failed to spawn thread: Os { code: 11, ... }", Bash's
# "fork: retry: Resource temporarily unavailable", node's "spawn ... EAGAIN", Python's BlockingIOError under the
# traceback's `os.fork()` line.
# ("thread" alone is no such word: every Java exception's line starts "Exception in thread".)
EAGAIN = ("Resource temporarily unavailable", "EAGAIN")
SPAWNING = ("fork", "spawn", "clone", "pthread_create")


def _refused_a_process(stderr: str) -> bool:
    words = _last_words(stderr)
    if any(marker in line for line in words for marker in NO_THREAD):
        return True
    return any(
        any(e in line for e in EAGAIN) and any(s in near for near in words[max(0, i - 3) : i + 1] for s in SPAWNING)
        for i, line in enumerate(words)
    )


def request_for(launch: Launch, limits: Limits) -> dict[str, Any]:
    """The zygote's request: what to write, what to exec, with which limits (stdin follows it raw). `limits` has
    its output cap resolved (NamespaceSandbox._limits)."""
    resident_extra = launch.extra_memory_mb if launch.resident_extra_mb is None else launch.resident_extra_mb
    return {
        "argv": launch.argv,
        "files": launch.files,
        "collect": list(launch.collect),
        "env": {**RUN_ENV, **launch.env},
        "limits": {
            "timeout_s": limits.timeout_s,
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
BATCH_RUN_SLACK_S = 8.0  # past a run's deadline: batch.py's BATCH_SLACK_S, BATCH_START_S and HELD_REPLY_S


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
    ) -> None:
        """`mode`: root (today's: root with four capabilities, a uid per worker), rootless (a user namespace, no
        privilege: docs/reward.md#sandbox-modes), or auto (root where root mode's capabilities are in effect, else
        rootless). `user`: a root service starts its zygotes as this uid and gid, rootless (tests run that way)."""
        self.mode = self._resolve_mode(mode, user)
        self._user = user
        self.workers = workers
        self.max_output_bytes = max_output_bytes  # the stdout cap of runs whose limits set none
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
        """`limits` (or the defaults) checked, with this sandbox's stdout cap where they set none."""
        limits = limits or Limits()
        if limits.max_output_bytes is None:
            limits = replace(limits, max_output_bytes=self.max_output_bytes)
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
            deadline = started + limits.timeout_s + REPLY_SLACK_S
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
        except RunCancelled:  # unhealthy: killed with its runs
            raise
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

    @staticmethod
    def _batch_deadline(limits: Limits) -> float:
        """When the next reply of a batch is overdue: held replies are written at least once a run (or every
        HELD_REPLY_S), a run ends by its deadline plus the zygote's slack, and a fresh namespace may start first."""
        return time.monotonic() + limits.timeout_s + BATCH_RUN_SLACK_S + REPLY_SLACK_S

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
