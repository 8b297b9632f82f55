"""A run's output: its stdout, stderr and proof fd read under its limits and output cap, and the reply's fields;
and the run's CPU time read while it runs.

A run's time limit (timeout_s) is CPU time, as contest judges count it: on a loaded host a correct program waits
for a CPU, and a wall-clock limit would judge it too slow at random. Its wall-clock limit (wall_s, by default a
multiple of timeout_s) stops a program that sleeps or blocks. Whoever waits for the run anyway (the zygote for a
single run, a batch's supervisor) reads its CPU time every CPU_POLL_S and kills it at the limit, so a CPU-bound
loop on an idle host still ends after about timeout_s of wall time; RLIMIT_CPU stays as a backstop.

Stdlib only, like confine.py: it runs in the zygote's process (`python3 -I -S`); the service imports only its
stderr bound (grpo/reward/output.py reads the sandbox's cut).
"""

from __future__ import annotations

import base64
import os
import select
import time
from collections.abc import Callable

STDERR_KEEP_BYTES = 32 << 10  # a run's stderr is kept to its first and its last this many bytes
STDERR_FLOOD_BYTES = 256 << 20  # past this much stderr the run is stopped (output_limit): a flood, not debugging
PROOF_KEEP_BYTES = 64  # more than the nonce on the proof fd is no proof; the rest is read and dropped
CPU_POLL_S = 0.03  # how often a run's CPU time is read while it runs: a CPU-bound loop overruns its limit by this
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # /proc/PID/stat counts CPU time in these


def stat_cpu_s(pid: int, proc: int | None = None) -> float | None:
    """CPU seconds process `pid` has used (user + system), the children it waited for included as wait4 counts
    them, from /proc/PID/stat (`proc`: a /proc directory's fd; None: /proc). None when it is gone (reaped)."""
    try:
        fd = os.open(f"{pid}/stat" if proc is not None else f"/proc/{pid}/stat", os.O_RDONLY, dir_fd=proc)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # After the command name (in parentheses, which it may itself hold): field 3 on; utime, stime, cutime and
    # cstime are fields 14 to 17.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS if len(fields) >= 15 else None


def over_cpu(cpu_s: float, limits: dict) -> bool:
    """The run used its CPU time up: a program that ended on its own between two reads of its CPU time, past its
    limit, is judged as if the read had caught it (the verdict does not depend on when the reads fell)."""
    return cpu_s >= limits["timeout_s"]


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


def read_outputs(
    done: int, readers: dict[str, int], limits: dict, deadline: float, cpu: Callable[[], float] | None = None
) -> tuple[str | None, dict]:
    """Read outputs until every writer is gone and `done` is readable, the deadline (wall clock) passes, the run's
    CPU time (`cpu`, read every CPU_POLL_S) reaches limits["timeout_s"], or the output limit is hit: (None, or the
    verdict "timeout" / "output_limit"; the bytes read per reader name). Only stdout counts against the cap;
    stderr is kept bounded (Output) and stops the run only as a flood; the proof fd never counts."""
    outputs = {fd: Output(name) for name, fd in readers.items()}
    poller = select.poll()
    for fd in (*outputs, done):
        poller.register(fd, select.POLLIN)
    open_fds, verdict = {*outputs, done}, None
    stop_at = {"out": limits["max_output_bytes"], "err": STDERR_FLOOD_BYTES}
    next_read = time.monotonic() + CPU_POLL_S
    while open_fds:
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            verdict = "timeout"
            break
        if cpu is not None and now >= next_read:  # at most every CPU_POLL_S, however much output arrives
            next_read = now + CPU_POLL_S
            if over_cpu(cpu(), limits):
                verdict = "timeout"
                break
        wait = left if cpu is None else min(left, max(0.0, next_read - now))
        for fd, _ in poller.poll(max(1, int(wait * 1000) + 1)):
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
