"""A cap on the rate a host sends weight bytes at: one token bucket shared by all of a sender's streams.

Weight pushes use what the network gives them: a direct push to 16 replicas fills the trainer's NIC, and a
relaying replica forwards as fast as it receives. `weights_send_rate_mb_s` (the trainer's and the rollout's)
keeps that traffic under a budget, so it does not starve other traffic on the same links (the queues, the
reward calls, a co-located job). The benchmarks use it to emulate a per-host NIC on loopback.

The bucket is shared by every stream the host sends at once (one NIC), holds at most `burst` bytes of
credit (a sender that idled does not then go at line rate for long), and lets a taker go into debt: whoever
takes more than there is sleeps for the deficit, so concurrent streams share the rate fairly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

# Pieces of at most this size go out at a time: small enough that the rate is smooth at a few MB/s (and a
# relaying hop gets bytes to forward early), large enough that the per-piece cost is nothing at GB/s.
PIECE_BYTES = 256 * 1024


class SendRate:
    """At most `mb_per_s` megabytes (10^6 bytes) per second through `take`, on average over any window longer
    than `burst_bytes / rate`; the first `burst_bytes` go at once."""

    def __init__(self, mb_per_s: float, burst_bytes: int = PIECE_BYTES) -> None:
        if mb_per_s <= 0:
            raise ValueError(f"a send rate must be > 0 MB/s (got {mb_per_s}); use no SendRate for no cap")
        self.bytes_per_s = mb_per_s * 1e6
        self.burst_bytes = burst_bytes
        self._credit = float(burst_bytes)
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def take(self, size: int) -> None:
        """Return once `size` bytes may be sent (at once when there is credit; else after the deficit)."""
        with self._lock:
            now = time.monotonic()
            self._credit = min(self.burst_bytes, self._credit + (now - self._stamp) * self.bytes_per_s) - size
            self._stamp = now
            wait = -self._credit / self.bytes_per_s
        if wait > 0:
            time.sleep(wait)

    def pieces(self, view: memoryview, piece_bytes: int = PIECE_BYTES) -> Iterator[memoryview]:
        """`view` in pieces of at most `piece_bytes`, each when the rate allows it."""
        for start in range(0, len(view), piece_bytes):
            piece = view[start : start + piece_bytes]
            self.take(len(piece))
            yield piece


def send_rate(mb_per_s: float) -> SendRate | None:
    """The setting as a bucket: 0 means no cap (None)."""
    return SendRate(mb_per_s) if mb_per_s > 0 else None


def paced(view: memoryview, rate: SendRate | None) -> Iterator[memoryview]:
    """`view` as it may be sent: whole when there is no cap, else in paced pieces."""
    if rate is None:
        yield view
    else:
        yield from rate.pieces(view)
