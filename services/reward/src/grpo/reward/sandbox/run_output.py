"""A run's output: its stdout, stderr and proof fd read under its deadline and output cap, and the reply's fields.

Stdlib only, like confine.py: it runs in the zygote's process (`python3 -I -S`); the service imports only its
stderr bound (grpo/reward/output.py reads the sandbox's cut).
"""

from __future__ import annotations

import base64
import os
import select
import time

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
