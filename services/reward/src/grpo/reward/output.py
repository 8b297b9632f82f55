"""What a reply returns of a run's output: a bounded head and tail of each stream, its byte count, its encoding.

A run may write max_output_bytes of stdout (16 MiB) and a request may hold 512 tests: returned whole, 4 tests of a
flood made a 67 MB reply (and went past gRPC's 64 MiB message limit). The judge and a checker still see the whole
stdout; a reply gets each stream's first and last halves of `keep` bytes joined by a line saying how many bytes were
cut between them, with the stream's byte count and a `truncated` flag. The streams of one reply share its budget
(settings.max_response_output_bytes), so no reply carries more than that of program output.

Bytes come back exactly: text when they are UTF-8, else base64 (`encoding`). A cut falls on a character boundary,
so the head and tail of UTF-8 output stay text.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Literal

from grpo.reward.sandbox.run_output import STDERR_KEEP_BYTES

Encoding = Literal["utf-8", "base64"]
DEFAULT_RETURN_BYTES = 64 << 10
"""Bytes of each stream a reply returns unless the request asks otherwise (its first and last 32 KiB, as the
sandbox keeps of stderr): a traceback's end and a program's first lines both fit."""
MAX_RETURN_BYTES = 64 << 20
"""The most a request may ask for per stream (the reply's budget caps it further)."""
# The sandbox's own cut of stderr (run_output.Output): its first STDERR_KEEP_BYTES, this line, its last ones.
_SANDBOX_CUT = re.compile(rb"\n\[\.\.\. (\d+) bytes of stderr cut \.\.\.\]\n")


@dataclass(frozen=True)
class Returned:
    """One stream as a reply returns it."""

    text: str
    """Its head and tail (or all of it): as text, or base64 when those bytes are not UTF-8."""
    encoding: Encoding
    total: int
    """Bytes the program wrote to the stream (stdout: up to the cap that stopped it)."""
    truncated: bool
    """Bytes between the head and the tail were not returned (`text` names how many)."""


def share(requested: int | None, streams: int, budget: int) -> int:
    """Bytes per stream: what the request asked for (default DEFAULT_RETURN_BYTES), at most an equal share of the
    reply's budget among its `streams` (two a run: stdout and stderr)."""
    wanted = DEFAULT_RETURN_BYTES if requested is None else requested
    return max(0, min(wanted, budget // max(1, streams)))


def encode(data: bytes) -> tuple[str, Encoding]:
    """`data` as text when it is UTF-8, else as base64."""
    try:
        return data.decode(), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def stream_bytes(text: str, raw: bytes | None) -> bytes:
    """A stream's exact bytes: `raw` when the sandbox kept them (output that is not UTF-8), else the text's."""
    return raw if raw is not None else text.encode()


def sandbox_cut(data: bytes) -> tuple[bytes, bytes, int]:
    """(head, tail, bytes written) of stderr as the sandbox keeps it: past 2 × STDERR_KEEP_BYTES, its first and last
    STDERR_KEEP_BYTES with its cut line between them (output that short was kept whole, so a line the program
    wrote itself is not taken for it). Counted on the stderr's text: a byte that is not UTF-8, or a character the
    sandbox's cut split, reads as U+FFFD, 3 bytes."""
    if len(data) > 2 * STDERR_KEEP_BYTES:
        cut = _SANDBOX_CUT.search(data, STDERR_KEEP_BYTES)  # U+FFFD only lengthens the head: never before this
        if cut is not None:
            head, tail = data[: cut.start()], data[cut.end() :]
            return head, tail, len(head) + int(cut.group(1)) + len(tail)
    return data, b"", len(data)


def _is_inside(byte: int) -> bool:
    """A UTF-8 continuation byte: inside a character, not at its start."""
    return byte & 0xC0 == 0x80


def _head_end(data: bytes, end: int) -> int:
    """`end` moved back to the start of the character it falls in (at most 3 bytes)."""
    for _ in range(3):
        if 0 < end < len(data) and _is_inside(data[end]):
            end -= 1
    return end


def _tail_start(data: bytes, start: int) -> int:
    """`start` moved on past the rest of a character it falls inside (at most 3 bytes)."""
    for _ in range(3):
        if start < len(data) and _is_inside(data[start]):
            start += 1
    return start


def _marker(cut: int, name: str) -> str:
    return f"\n[... {cut} bytes of {name} cut ...]\n"


def clip(name: str, head: bytes, tail: bytes, total: int, keep: int) -> Returned:
    """At most `keep` bytes of a stream of `total` bytes known as `head` + `tail` (all of it, or the two ends the
    sandbox kept): its first keep/2 and last keep/2 bytes, cut on character boundaries, joined by the line
    `[... N bytes of <name> cut ...]`, then text when that is UTF-8, else base64."""
    if len(head) + len(tail) == total <= keep:
        return Returned(*encode(head + tail), total, False)
    if keep <= 0:
        return Returned("", "utf-8", total, True)
    if not tail:  # one piece, longer than keep: both ends come from it
        tail = head
    first = head[: _head_end(head, min(len(head), keep // 2))]
    last = tail[_tail_start(tail, max(0, len(tail) - (keep - keep // 2))) :]
    return Returned(*encode(first + _marker(total - len(first) - len(last), name).encode() + last), total, True)


def returned_stdout(text: str, raw: bytes | None, keep: int) -> Returned:
    """A run's stdout as a reply returns it (`raw`: its bytes when they are not UTF-8)."""
    if raw is None and text.isascii():  # the usual case: cut the text itself, no copy of megabytes to bytes
        if len(text) <= keep:
            return Returned(text, "utf-8", len(text), False)
        if keep <= 0:
            return Returned("", "utf-8", len(text), True)
        first, last = text[: keep // 2], text[len(text) - (keep - keep // 2) :]
        return Returned(first + _marker(len(text) - keep, "stdout") + last, "utf-8", len(text), True)
    data = stream_bytes(text, raw)
    return clip("stdout", data, b"", len(data), keep)


def returned_stderr(text: str, keep: int) -> Returned:
    """A run's stderr as a reply returns it: the sandbox's own cut read into head, tail and count first."""
    if text.isascii() and len(text) <= min(keep, 2 * STDERR_KEEP_BYTES):
        return Returned(text, "utf-8", len(text), False)
    head, tail, total = sandbox_cut(text.encode())
    return clip("stderr", head, tail, total, keep)
