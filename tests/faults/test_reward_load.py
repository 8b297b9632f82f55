"""Offer the reward service several times its measured throughput: it sheds (429 / RESOURCE_EXHAUSTED), its memory
stays bounded, and it serves normally afterwards."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter

import grpc
import httpx
import pytest

from grpo.v1 import reward_pb2 as pb
from grpo.v1 import reward_pb2_grpc
from tests.support.load import closed_loop_rate, open_loop, rss_mb
from tests.support.reward_proc import start_reward_service, stop_reward_service

pytestmark = [pytest.mark.faults, pytest.mark.slow]
log = logging.getLogger(__name__)

# A sandboxed run of ~50 ms CPU per call: the service (one sandbox worker), not this client, is the bottleneck.
CODE = "x = 0\nfor i in range(400_000):\n    x += i\nprint(x)"
BODY = {"language": "python", "code": CODE}
PATH = "/v1/execute"
OVERLOAD = 4.0
LOAD_S = 8.0


def ok_answer(reply: httpx.Response) -> bool:
    """Every closed-loop answer must be a served run (the throughput measured is of real work)."""
    assert reply.status_code == 200 and reply.json()["status"] == "ok", reply.text
    return True


def test_overload_is_shed_memory_bounded_and_recovers() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    service = start_reward_service("--max-queue", "32", workers=1)
    try:
        url = service.http_url
        throughput = closed_loop_rate(f"{url}{PATH}", BODY, 3.0, clients=4, served=ok_answer)
        assert 1 < throughput < 100, throughput  # the work is real: a bounded offered rate follows
        rss_before = rss_mb(service.proc.pid)
        peak = [rss_before]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.2):
                peak[0] = max(peak[0], rss_mb(service.proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        grpc_codes: Counter[str] = Counter()

        def grpc_probe() -> None:  # the gRPC edge sheds from the same admission queue
            with grpc.insecure_channel(service.grpc_addr) as ch:
                stub = reward_pb2_grpc.RewardServiceStub(ch)
                stop = time.monotonic() + LOAD_S * 0.8
                while time.monotonic() < stop:
                    try:
                        stub.Execute(pb.ExecuteRequest(**BODY), timeout=30)
                        grpc_codes["OK"] += 1
                    except grpc.RpcError as err:
                        grpc_codes[err.code().name] += 1
                    time.sleep(0.02)

        prober = threading.Thread(target=grpc_probe)
        started = time.monotonic()
        prober.start()
        codes, _ = asyncio.run(open_loop(f"{url}{PATH}", BODY, OVERLOAD * throughput, LOAD_S))
        prober.join()
        load_wall = time.monotonic() - started
        sampling.set()
        sampler.join()
        offered = sum(codes.values())
        log.info(
            "throughput %.1f/s; offered %d in %.1fs (%.1fx): %s; grpc %s; rss %.0f -> peak %.0f MiB",
            throughput, offered, load_wall, OVERLOAD, dict(codes), dict(grpc_codes), rss_before, peak[0],
        )  # fmt: skip
        assert set(codes) <= {200, 429}, codes  # no 5xx, no timeouts, no dropped connections
        assert codes[429] >= 0.3 * offered, codes  # a real share of the excess is refused up front
        assert codes[200] >= 0.5 * throughput * LOAD_S, codes  # while it keeps serving near capacity
        assert grpc_codes["RESOURCE_EXHAUSTED"] > 0 and set(grpc_codes) <= {"OK", "RESOURCE_EXHAUSTED"}, grpc_codes
        assert peak[0] < rss_before + 200, (rss_before, peak[0])  # bounded: queue of 32, not the offered backlog
        recovered_at = time.monotonic()
        r = httpx.post(f"{url}{PATH}", json=BODY, timeout=30)
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert time.monotonic() - recovered_at < 5
        assert load_wall < LOAD_S + 30, "the backlog drained in bounded time"
        service.assert_alive()
    finally:
        stop_reward_service(service)
