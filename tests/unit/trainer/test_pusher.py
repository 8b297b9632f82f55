"""The weight pusher: its retries follow the one retry policy (grpo.common.retry), and how it picks direct or relay."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Literal

import pytest
import torch

from grpo.common.net import free_port
from grpo.trainer.pusher import MAX_STREAMS, ReplicaTarget, push_mode, push_to_replicas

PushSetting = Literal["auto", "direct", "relay"]


def test_a_failed_push_waits_before_each_retry() -> None:
    target = ReplicaTarget("gone", f"127.0.0.1:{free_port()}")  # nothing listens: UNAVAILABLE at once
    start = time.monotonic()
    [result] = push_to_replicas([target], {"w": torch.zeros(4)}, 1, timeout_s=30, retries=2)
    took = time.monotonic() - start
    assert not result.ok and result.attempts == 3 and "UNAVAILABLE" in result.error
    # Backoff 0.5 s then 1 s, each jittered by at most ±50%: no retry storm against a restarting replica.
    assert 0.7 <= took < 5, took


def test_retries_end_at_the_push_deadline() -> None:
    start = time.monotonic()
    [result] = push_to_replicas([ReplicaTarget("gone", f"127.0.0.1:{free_port()}")], {"w": torch.zeros(4)}, 1,
                                timeout_s=2, retries=100)  # fmt: skip
    assert not result.ok and time.monotonic() - start < 3.5


@pytest.mark.parametrize(
    ("setting", "replicas", "mode"),
    [("auto", 1, "direct"), ("auto", 2, "relay"), ("auto", 3, "relay"), ("auto", 8, "relay"),
     ("direct", 8, "direct"), ("relay", 2, "relay")],
)  # fmt: skip
def test_auto_relays_to_three_replicas_or_more(setting: PushSetting, replicas: int, mode: str) -> None:
    assert push_mode(setting, replicas) == mode


def test_a_relay_whose_root_is_gone_reports_every_replica_and_retries_directly() -> None:
    """Nothing listens anywhere: the trainer re-routes around each dead hop, then pushes to each directly; every
    replica has its own failed result and none is counted as done."""
    targets = [ReplicaTarget(f"r{i}", f"127.0.0.1:{free_port()}") for i in range(3)]
    results = push_to_replicas(targets, {"w": torch.zeros(4)}, 1, timeout_s=10, retries=1, mode="relay", fanout=1)
    assert [r.replica_id for r in results] == ["r0", "r1", "r2"]
    assert all(not r.ok and r.attempts == 2 and "UNAVAILABLE" in r.error for r in results), results
    assert [r.route.split(" (")[0] for r in results] == ["direct, after the relay failed"] * 3


def test_a_broadcast_to_nobody_falls_back_and_still_ends_at_once() -> None:
    """With a broadcaster, a replica that is not there fails the round at once (its call ends before it
    joins) and gets the ordinary push, with its retries, instead of a collective timeout."""
    from grpo.common.weights.broadcast import WeightBroadcaster

    broadcaster = WeightBroadcaster("127.0.0.1:0", timeout_s=30)
    try:
        start = time.monotonic()
        [result] = push_to_replicas([ReplicaTarget("gone", f"127.0.0.1:{free_port()}")], {"w": torch.zeros(4)}, 1,
                                    timeout_s=30, retries=1, broadcaster=broadcaster)  # fmt: skip
        took = time.monotonic() - start
    finally:
        broadcaster.close()
    assert not result.ok and result.attempts == 2 and "UNAVAILABLE" in result.error
    assert took < 5, took  # not the 30 s collective timeout
    assert broadcaster.epoch == 1 and broadcaster.pieces_sent == 0


def test_replicas_a_broadcast_missed_are_relayed_to() -> None:
    """Broadcast first, then the configured push for the rest: three missing replicas fail the broadcast round
    at once, then the relay (re-routing around each dead hop), then one direct attempt each."""
    from grpo.common.weights.broadcast import WeightBroadcaster

    targets = [ReplicaTarget(f"r{i}", f"127.0.0.1:{free_port()}") for i in range(3)]
    broadcaster = WeightBroadcaster("127.0.0.1:0", timeout_s=30)
    try:
        results = push_to_replicas(targets, {"w": torch.zeros(4)}, 1, timeout_s=20, retries=1, mode="relay",
                                   fanout=1, broadcaster=broadcaster)  # fmt: skip
    finally:
        broadcaster.close()
    assert [r.replica_id for r in results] == ["r0", "r1", "r2"]
    assert all(not r.ok and r.attempts == 2 for r in results), results
    assert [r.route.split(" (")[0] for r in results] == ["direct, after the relay failed"] * 3


def test_direct_pushes_keep_to_their_stream_limit() -> None:
    """Replicas that accept the connection and never answer (hung): the pusher has as many open at once as its
    limit, no more. Counted at the replicas' end, by the connections they hold."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(MAX_STREAMS + 4)]
    open_now, peak, stop = 0, 0, threading.Event()

    def serve() -> None:
        nonlocal open_now, peak
        with selectors.DefaultSelector() as sel:
            for listener in listeners:
                sel.register(listener, selectors.EVENT_READ)
            while not stop.is_set():
                for key, _ in sel.select(0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock in listeners:
                        sel.register(sock.accept()[0], selectors.EVENT_READ)
                        open_now += 1
                        peak = max(peak, open_now)
                    elif not sock.recv(65536):  # read and drop what it sends; b"": it hung up
                        sel.unregister(sock)
                        sock.close()
                        open_now -= 1

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        targets = [ReplicaTarget(f"r{i}", f"127.0.0.1:{s.getsockname()[1]}") for i, s in enumerate(listeners)]
        results = push_to_replicas(targets, {"w": torch.zeros(4)}, 1, timeout_s=4, retries=0, mode="direct")
    finally:
        stop.set()
        server.join()
        for listener in listeners:
            listener.close()
    assert not any(r.ok for r in results) and len(results) == len(targets)
    assert peak == MAX_STREAMS, f"{peak} pushes at once"


def test_a_stage_numbers_its_weights_above_every_earlier_stages(tmp_path: Path) -> None:
    """A staged run's stages push to the same replicas. Stage 3 numbered its model above its own folder's pushes
    and the replicas' heartbeats only; a heartbeat still saying v11 while the replica held stage 2's v13 gave stage 3
    v12: the replica, above it, was never pushed, and every group came back from stage 2's weights under a future
    version (compose CI: "trained on no group (tasks dropped: stale 64)")."""
    from grpo.common.registry import ReplicaInfo
    from grpo.trainer.config import parse_settings
    from grpo.trainer.pusher import highest_pushed_in_run, record_pushed
    from grpo.trainer.replica_sync import ReplicaSync

    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "gold": "2"}\n')
    run = tmp_path / "run"
    record_pushed(run / "stage-2-grpo", 13)
    stage3 = run / "stage-3-rejection_sampling"
    lagging = [ReplicaInfo("r1", "127.0.0.1:1", weight_version=11, weight_checksum="", heartbeat=0.0)]
    for stage, expected in ((3, 14), (0, 12)):  # staged: above stage 2's 13; a run of its own: its folder only
        settings = parse_settings(["--train-data", str(data), "--output-dir", str(stage3), "--stage", str(stage)])
        assert ReplicaSync(settings, registry=None, retry=None).fresh_version(lagging, 0) == expected  # type: ignore[arg-type]
    assert highest_pushed_in_run(stage3, staged=True) == 13 and highest_pushed_in_run(stage3, staged=False) == 0
