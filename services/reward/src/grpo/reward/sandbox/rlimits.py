"""A run's resource limits: which rlimits, at what values, in what order, and setting them.

Stdlib only, like confine.py: it runs in the zygote's process (`python3 -I -S`) and its runs' inits.
"""

from __future__ import annotations

import resource as r


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


def set_limits(pairs: list[tuple[int, int]]) -> None:
    for res, val in pairs:
        r.setrlimit(res, (val, val))
