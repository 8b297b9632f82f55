"""The service's end of one zygote (zygote.py): starting it, and the requests and replies on its pipes.

Built programs it holds between requests are named, not sent again (`Held`); large stdins go as sealed memfds on
a socket beside the pipes. The pool of zygotes is namespace.py's.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import struct
import subprocess
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson

from grpo.reward.sandbox.base import RunCancelled, SandboxUnavailable

ZYGOTE = Path(__file__).with_name("zygote.py")
RO_BINDS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin")
# Debian's JDK keeps its configuration under /etc (java.security, jvm.cfg); the dynamic linker's cache saves every
# native program a search of a dozen directories per library. Runs see nothing else of /etc.
ETC_BINDS = ("java-*", "ld.so.cache")


CANCEL_POLL_S = 0.05  # how often a run waiting for its reply looks whether it was cancelled
MAX_REPLY_BYTES = 1 << 30  # a length header past this means a broken stream, not a reply
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
    "apparmor=unconfined --security-opt systempaths=unconfined, as docker-compose.rootless.yml does; kubernetes: "
    "seccompProfile Localhost with that profile, an AppArmor profile that allows mount and userns, and an unmasked "
    "/proc where the runtime masks it: docs/reward.md#sandbox-modes)"
)


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
