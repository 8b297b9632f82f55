"""The one retry policy, in real time with small delays: backoff, limits, stop, log lines."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from grpo.common.retry import Backoff, RetryPolicy, retry


class Flaky:
    """Fails `failures` times with ConnectionError, then returns the number of calls."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0
        self.times: list[float] = []

    def __call__(self) -> int:
        self.calls += 1
        self.times.append(time.monotonic())
        if self.calls <= self.failures:
            raise ConnectionError(f"down (call {self.calls})")
        return self.calls


def test_delay_doubles_up_to_the_cap_with_jitter_inside_its_band() -> None:
    plain = RetryPolicy(base_s=0.1, cap_s=0.5, jitter=0.0)
    assert [plain.delay(n) for n in (1, 2, 3, 4, 10, 100)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5, 0.5])
    jittered = RetryPolicy(base_s=1.0, cap_s=1.0, jitter=0.5)
    delays = [jittered.delay(1) for _ in range(200)]
    assert all(0.5 <= d <= 1.5 for d in delays)
    assert max(delays) - min(delays) > 0.2  # it really varies: replicas do not retry in step


def test_retries_until_success_waiting_longer_each_time(caplog: pytest.LogCaptureFixture) -> None:
    flaky = Flaky(3)
    with caplog.at_level(logging.WARNING, logger="grpo.common.retry"):
        assert retry(flaky, "reading the queue", RetryPolicy(base_s=0.02, cap_s=1.0, jitter=0.0)) == 4
    gaps = [b - a for a, b in zip(flaky.times, flaky.times[1:], strict=False)]
    assert [round(g, 2) >= want for g, want in zip(gaps, (0.02, 0.04, 0.08), strict=True)] == [True] * 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3  # one line per retry, naming what and why
    assert lines[0] == "reading the queue failed (ConnectionError: down (call 1)); retry 1 in 0.02s"
    assert "retry 3 in 0.08s" in lines[2]


def test_gives_up_after_the_attempts_with_the_last_error() -> None:
    flaky = Flaky(10)
    with pytest.raises(ConnectionError, match="call 3"):
        retry(flaky, "x", RetryPolicy(base_s=0.001, attempts=3))
    assert flaky.calls == 3


def test_gives_up_at_the_deadline_with_a_last_attempt_on_it() -> None:
    flaky = Flaky(1000)
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        retry(flaky, "x", RetryPolicy(base_s=0.05, cap_s=0.1, jitter=0.0, deadline_s=0.3))
    took = time.monotonic() - started
    assert 0.3 <= took < 0.5
    assert flaky.times[-1] - flaky.times[0] == pytest.approx(0.3, abs=0.05)  # the last wait was cut to end on it


def test_errors_it_should_not_retry_propagate_at_once() -> None:
    flaky = Flaky(5)
    with pytest.raises(ConnectionError):
        retry(flaky, "x", RetryPolicy(base_s=0.001), retryable=lambda exc: "call 1" not in str(exc))
    assert flaky.calls == 1
    calls = []

    def bad() -> None:
        calls.append(1)
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        retry(bad, "x", RetryPolicy(base_s=0.001), on=ConnectionError)
    assert len(calls) == 1


def test_a_stop_event_ends_a_long_wait_promptly() -> None:
    stop = threading.Event()
    flaky = Flaky(1000)
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        retry(flaky, "x", RetryPolicy(base_s=30.0, cap_s=30.0), stop=stop)
    assert time.monotonic() - started < 1.0
    assert flaky.calls == 1


def test_backoff_resets_after_a_success_and_stops_without_waiting() -> None:
    b = Backoff(RetryPolicy(base_s=0.01, cap_s=1.0, jitter=0.0), "a loop")
    assert b.wait("e1") and b.wait("e2") and b.failures == 2
    assert b.elapsed_s >= 0.01
    b.reset()
    assert b.failures == 0 and b.elapsed_s == 0.0
    started = time.monotonic()
    assert b.wait("e3")
    assert time.monotonic() - started < 0.02  # back to the first, shortest wait
    stop = threading.Event()
    stop.set()
    assert not Backoff(RetryPolicy(base_s=5.0), "a loop", stop).wait("e")  # no wait at all once stopping
