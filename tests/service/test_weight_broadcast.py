"""The broadcast weight transport (gloo on CPU) from a trainer-side broadcaster to real rollout processes."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.weights.broadcast import WeightBroadcaster
from grpo.common.weights.codec import weights_checksum
from grpo.trainer.pusher import PushResult, push_to_replicas, replica_status
from grpo.v1 import rollout_pb2
from tests.support.rollout_proc import (
    RolloutProc,
    perturbed,
    start_rollout_service,
    tiny_model_weights,
    update_bytes,
)
from tests.support.trainer_proc import trainer_config

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return tiny_model_weights()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RolloutProc]]:
    log_dir = tmp_path_factory.mktemp("broadcast")
    procs = [start_rollout_service("--model", str(ensure_tiny_model()), log_dir=log_dir) for _ in range(2)]
    yield procs
    for proc in procs:
        proc.stop()


@pytest.fixture
def broadcaster() -> Iterator[WeightBroadcaster]:
    sender = WeightBroadcaster("127.0.0.1:0", timeout_s=10)
    yield sender
    sender.close()


def loaded(proc: RolloutProc) -> tuple[int, str]:
    status = replica_status(proc.address)
    return status.weight_version, status.weight_checksum


def test_one_broadcast_updates_every_replica_and_the_group_is_kept(
    replicas: list[RolloutProc], broadcaster: WeightBroadcaster, weights: dict[str, torch.Tensor]
) -> None:
    version = max(loaded(p)[0] for p in replicas) + 1
    size = sum(t.numel() * t.element_size() for t in weights.values())
    before = [update_bytes(p, "broadcast") for p in replicas]
    for step in range(2):
        new = perturbed(weights, seed=version + step)
        checksum = weights_checksum(new)
        outcomes = broadcaster.push([p.address for p in replicas], new, version + step,
                                    deadline=time.monotonic() + 60)  # fmt: skip
        assert [(o.version, o.checksum) for o in outcomes] == [(version + step, checksum)] * len(replicas), outcomes  # type: ignore[union-attr]
        assert [loaded(p) for p in replicas] == [(version + step, checksum)] * len(replicas)
    assert broadcaster.epoch == 1  # formed once, then reused
    assert broadcaster.pieces_sent == 2  # the tiny model is one piece: sent once per version, for both replicas
    assert [update_bytes(p, "broadcast") - b for p, b in zip(replicas, before, strict=True)] == [2 * size] * 2


def test_a_wrong_sha256_is_rejected_by_every_replica_and_the_old_weights_serve(
    replicas: list[RolloutProc], broadcaster: WeightBroadcaster, weights: dict[str, torch.Tensor]
) -> None:
    old = [loaded(p) for p in replicas]
    version = max(v for v, _ in old) + 1
    outcomes = broadcaster.push([p.address for p in replicas], perturbed(weights, 99), version, checksum="0" * 64,
                                deadline=time.monotonic() + 60)  # fmt: skip
    for outcome in outcomes:
        assert isinstance(outcome, grpc.RpcError) and isinstance(outcome, grpc.Call), outcome
        assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT and "sha256 mismatch" in str(outcome.details())
    assert [loaded(p) for p in replicas] == old
    # A failed round re-forms the group, and the next good version goes through it.
    new = perturbed(weights, 100)
    outcomes = broadcaster.push([p.address for p in replicas], new, version, deadline=time.monotonic() + 60)
    assert all(isinstance(o, rollout_pb2.UpdateWeightsResponse) for o in outcomes), outcomes
    assert broadcaster.epoch == 2
    assert [loaded(p) for p in replicas] == [(version, weights_checksum(new))] * len(replicas)


def test_a_replica_down_before_the_round_falls_back_to_the_data_port_quickly(
    replicas: list[RolloutProc], weights: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    doomed = start_rollout_service("--model", str(ensure_tiny_model()), log_dir=tmp_path)
    doomed.stop()
    targets = [p.target for p in replicas] + [doomed.target]
    version = max(loaded(p)[0] for p in replicas) + 1
    new = perturbed(weights, version)
    sender = WeightBroadcaster("127.0.0.1:0", timeout_s=20)
    try:
        start = time.monotonic()
        results = push_to_replicas(targets, new, version, timeout_s=30, retries=0, broadcaster=sender)
        took = time.monotonic() - start
    finally:
        sender.close()
    log.info("round with a replica down: %.2fs", took)
    assert [r.ok for r in results] == [True, True, False], results
    assert "UNAVAILABLE" in results[2].error
    assert took < 5, took  # the dead replica's call ends at once: the others are told to stop waiting
    assert [loaded(p) for p in replicas] == [(version, weights_checksum(new))] * len(replicas)


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_member_lost_between_rounds_does_not_hang_the_next_one(
    how: str, replicas: list[RolloutProc], weights: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """Round 1 forms a group of three; then one dies (SIGKILL) or stalls (SIGSTOP: its sockets stay open and
    nothing reads them). Round 2 reuses the group: the others hold the version (by broadcast or by the data-port
    fallback) within about two collective timeouts, the push returns by its deadline, and the round after
    forms a new group."""
    lost = start_rollout_service("--model", str(ensure_tiny_model()), log_dir=tmp_path)
    targets = [p.target for p in replicas] + [lost.target]
    version = max(loaded(p)[0] for p in replicas) + 1
    sender = WeightBroadcaster("127.0.0.1:0", timeout_s=3)
    try:
        assert all(r.ok for r in push_to_replicas(targets, perturbed(weights, 1), version, broadcaster=sender))
        os.kill(lost.proc.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        new = perturbed(weights, 2)
        expected = [(version + 1, weights_checksum(new))] * len(replicas)
        pushed: list[PushResult] = []
        start = time.monotonic()
        pusher = threading.Thread(target=lambda: pushed.extend(
            push_to_replicas(targets, new, version + 1, timeout_s=20, retries=0, broadcaster=sender)))  # fmt: skip
        pusher.start()
        while [loaded(p) for p in replicas] != expected and time.monotonic() - start < 25:
            time.sleep(0.05)
        served = time.monotonic() - start
        pusher.join(25)
        took = time.monotonic() - start
        log.info("member %s: the others hold the version after %.2fs, the push returned after %.2fs", how, served, took)
        assert [loaded(p) for p in replicas] == expected
        assert served < 9, served  # the 3 s collective timeout, 3 s of grace, the fallback; not the 20 s deadline
        assert [r.ok for r in pushed] == [True, True, False], pushed
        assert took < 22, took
        results = push_to_replicas(targets[:2], perturbed(weights, 3), version + 2, broadcaster=sender)
        assert all(r.ok for r in results) and sender.epoch == 2, results
    finally:
        sender.close()
        if how == "stopped":
            os.kill(lost.proc.pid, signal.SIGKILL)
        lost.stop()


def test_a_replica_killed_mid_broadcast_does_not_hang_the_round(
    replicas: list[RolloutProc], weights: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """Pieces of 1 KiB make the tiny model ~3,000 collectives; the third replica is SIGKILLed once 100 have
    gone out. The round fails midway, the others get the version by the fallback within the collective
    timeout and the grace, and nothing waits for the push's deadline."""
    doomed = start_rollout_service("--model", str(ensure_tiny_model()), log_dir=tmp_path)
    targets = [p.target for p in replicas] + [doomed.target]
    version = max(loaded(p)[0] for p in replicas) + 1
    new = perturbed(weights, version)
    total = -(-sum(t.numel() * t.element_size() for t in new.values()) // 1024)
    sender = WeightBroadcaster("127.0.0.1:0", timeout_s=3, piece_bytes=1024)
    pushed: list[PushResult] = []
    try:
        start = time.monotonic()
        pusher = threading.Thread(target=lambda: pushed.extend(
            push_to_replicas(targets, new, version, timeout_s=30, retries=0, broadcaster=sender)))  # fmt: skip
        pusher.start()
        while sender.pieces_sent < 100 and time.monotonic() - start < 20:
            time.sleep(0.001)
        os.kill(doomed.proc.pid, signal.SIGKILL)
        at_kill = sender.pieces_sent
        pusher.join(40)
        took = time.monotonic() - start
    finally:
        sender.close()
        doomed.stop()
    log.info("killed after %d of %d pieces; the push returned after %.2fs", at_kill, total, took)
    assert 100 <= at_kill < total and sender.pieces_sent < total  # it really died mid-broadcast
    assert [r.ok for r in pushed] == [True, True, False], pushed
    assert [loaded(p) for p in replicas] == [(version, weights_checksum(new))] * len(replicas)
    assert took < 12, took  # a 3 s collective timeout and 3 s of grace at most, then the fallback


def test_the_trainer_set_to_broadcast_syncs_its_replicas_by_broadcast(
    replicas: list[RolloutProc], tmp_path: Path, redis_url: str
) -> None:
    """`weight_transport: broadcast` end to end through the trainer's own sync: the registry's replicas get the
    version by one broadcast, counted under via="broadcast" on each replica."""
    from grpo.common.registry import ReplicaInfo
    from grpo.trainer.config import TrainerSettings
    from grpo.trainer.control import RunControl
    from grpo.trainer.run import GrpoRun

    config = trainer_config(tmp_path, "bcast", redis_url, weight_transport="broadcast", broadcast_timeout_s=10)
    run = GrpoRun(TrainerSettings(**json.loads(config.read_text())), RunControl())
    try:
        for p in replicas:
            run.registry.heartbeat(ReplicaInfo(p.target.replica_id, p.address, 0, "", time.time(),
                                               weights_data_port=p.data_port))  # fmt: skip
        before = [update_bytes(p, "broadcast") for p in replicas]
        version = max(loaded(p)[0] for p in replicas) + 1
        run.learner.set_version(version)
        run._sync_replicas()
        assert run.confirmed == {p.target.replica_id: version for p in replicas}
        assert run.broadcaster is not None and run.broadcaster.pieces_sent >= 1
        assert all(update_bytes(p, "broadcast") > b for p, b in zip(replicas, before, strict=True))
    finally:
        run.close()
