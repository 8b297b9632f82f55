"""A zygote's reply judged: its status (ok, timeout, memory_limit, process_limit, ...) from how the run ended.

What the kernel and the runtimes leave to go on: the wait status, the CPU time and peak memory against the limits,
the last words on stderr, and the writable image size of a native binary that died in its exec.
"""

from __future__ import annotations

import signal
import struct
from typing import Any

from grpo.reward.sandbox.languages import Launch


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
    # 2 vCPUs; 0.749 s with seven), hence the margin.
    if exit_code == -signal.SIGKILL and reply.get("cpu_s", 0.0) > 0.5 * reply.get("cpu_limit_s", float("inf")):
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
