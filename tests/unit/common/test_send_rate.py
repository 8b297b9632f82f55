"""The send-rate cap: N bytes at R MB/s take at least (N - burst) / R, however many streams share the bucket."""

from __future__ import annotations

import threading
import time

import pytest

from grpo.common.send_rate import SendRate, paced, send_rate


def test_one_stream_is_held_to_the_rate() -> None:
    rate = SendRate(4.0)  # 4 MB/s
    view = memoryview(bytearray(2_000_000))
    start = time.monotonic()
    sent = sum(len(piece) for piece in rate.pieces(view))
    elapsed = time.monotonic() - start
    assert sent == len(view)
    floor = (len(view) - rate.burst_bytes) / rate.bytes_per_s
    assert elapsed >= floor, f"{sent} bytes at 4 MB/s in {elapsed:.3f}s, less than {floor:.3f}s"
    assert elapsed < floor + 1.0  # and not much slower (a loose bound: the machine is shared)


def test_streams_sharing_a_bucket_share_the_rate() -> None:
    """One NIC: four streams of 0.5 MB each through one 4 MB/s bucket take as long as 2 MB through it."""
    rate = SendRate(4.0)
    views = [memoryview(bytearray(500_000)) for _ in range(4)]
    threads = [threading.Thread(target=lambda v=v: sum(len(p) for p in rate.pieces(v))) for v in views]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    assert elapsed >= (2_000_000 - rate.burst_bytes) / rate.bytes_per_s


def test_idle_credit_is_capped_at_the_burst() -> None:
    """A sender that idled does not then go at line rate for more than one burst."""
    rate = SendRate(4.0)
    time.sleep(0.2)  # would be 800 kB of credit without the cap
    start = time.monotonic()
    for _ in rate.pieces(memoryview(bytearray(800_000))):
        pass
    assert time.monotonic() - start >= (800_000 - rate.burst_bytes) / rate.bytes_per_s


def test_no_cap_is_one_piece_and_a_bad_rate_is_refused() -> None:
    view = memoryview(b"x" * 1000)
    assert send_rate(0) is None
    assert [bytes(p) for p in paced(view, None)] == [bytes(view)]
    assert b"".join(bytes(p) for p in paced(view, SendRate(100.0))) == bytes(view)
    with pytest.raises(ValueError, match="> 0 MB/s"):
        SendRate(0)
