"""A run's files: the program's written into /scratch, its stdin as a memfd, and those it leaves read back.

Stdlib only, like confine.py: it runs in the zygote's process (`python3 -I -S`), never in the service's.
"""

# Syscall-level code on purpose: plain os calls map one-to-one to what the kernel does.
# ruff: noqa: PTH208, PTH211

from __future__ import annotations

import base64
import fnmatch
import os

from grpo.reward.sandbox.protocol import write_all


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
