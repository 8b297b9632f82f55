"""The messages between the sandbox's processes: length-prefixed JSON, fd passing, an init's request and exit record.

Stdlib only, like confine.py: it runs in the zygote's process (`python3 -I -S`) and its runs' inits, never in the
service's. The service and the zygote speak length-prefixed JSON on the zygote's stdin/stdout, with large stdins
passed as memfds on a socket beside them (`receive_fd`); a prepared single run's init gets its request on a socket
(`send_request`, as init.c reads it) and reports its program's wait status on a pipe (`exit_record`).
"""

from __future__ import annotations

import json
import os
import socket
import struct

MAX_MESSAGE_BYTES = 1 << 30  # a length header past this means a broken stream, not a request


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


def receive_fd(channel: socket.socket) -> int:
    """One fd the service passed on the fd channel (a stdin as a sealed memfd)."""
    _, fds = receive_fds(channel, 1, 1)
    if len(fds) != 1:
        raise OSError("the service's fd channel is out of step")
    return fds[0]


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
