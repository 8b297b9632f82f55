"""A replica SIGKILLed mid-relay: the replicas after it still get the version in time, re-routed around it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from grpo.common.weights.codec import weights_checksum
from grpo.common.weights.relay import Relayer, TensorPayload, relay_tree
from grpo.trainer.pusher import ReplicaTarget, push_to_replicas, replica_status
from grpo.v1 import rollout_pb2 as pb
from tests.support.rollout_proc import RolloutProc, perturbed, start_rollout_service, tiny_model_weights

pytestmark = pytest.mark.faults

DEADLINE_S = 60.0
PIECE_BYTES = 64 * 1024  # the tiny model (3 MB) in ~50 pieces, sent over ~2.5 s: time to kill a hop mid-transfer


class SlowPayload(TensorPayload):
    """The trainer's tensors, sent slowly; `at_third` runs once a third of them has gone."""

    def __init__(self, tensors: dict[str, torch.Tensor], version: int, at_third: Callable[[], None]) -> None:
        super().__init__(tensors, version, None, PIECE_BYTES)
        self.at_third = at_third
        self.sent = 0

    def pieces(self, deadline: float) -> Iterator[memoryview]:
        total = self.size(deadline)
        for view in super().pieces(deadline):
            yield view
            self.sent += len(view)
            if self.sent >= total // 3 and self.at_third is not None:
                self.at_third()
                self.at_third = None  # type: ignore[assignment]  # once
            time.sleep(0.05)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[list[RolloutProc]]:
    procs = [start_rollout_service("--replica-id", f"r{i}", log_dir=tmp_path) for i in (1, 2, 3)]
    yield procs
    for proc in procs:
        proc.stop()


def hops(procs: list[RolloutProc]) -> list[pb.RelayHop]:
    return [pb.RelayHop(replica_id=f"r{i}", address=p.address, data_port=p.data_port) for i, p in enumerate(procs, 1)]


def kill(proc: RolloutProc) -> Callable[[], None]:
    return lambda: os.kill(proc.proc.pid, signal.SIGKILL)


def test_middle_of_a_chain_killed_mid_transfer(chain: list[RolloutProc]) -> None:
    r1, r2, r3 = chain
    weights = perturbed(tiny_model_weights(), seed=1)
    payload = SlowPayload(weights, 1, kill(r2))
    started = time.monotonic()
    results = Relayer("trainer").relay([relay_tree(hops(chain), 1)], payload, started + DEADLINE_S)
    elapsed = time.monotonic() - started
    assert r2.proc.wait(10) == -signal.SIGKILL
    by_id = {r.replica_id: r for r in results}
    assert sorted(by_id) == ["r1", "r2", "r3"]
    assert by_id["r1"].ok and by_id["r3"].ok, results
    # The dead one failed, and says why; r3 got the bytes from r1, which took r2's place.
    assert not by_id["r2"].ok and by_id["r2"].error.split(":")[0] in {"UNAVAILABLE", "CANCELLED", "UNKNOWN"}, results
    assert (by_id["r3"].sender, by_id["r3"].rerouted_around) == ("r1", "r2")
    checksum = weights_checksum(weights)
    for proc in (r1, r3):
        status = replica_status(proc.address)
        assert (status.weight_version, status.weight_checksum) == (1, checksum)
    assert elapsed < DEADLINE_S / 2, elapsed  # nothing waited for a deadline


def test_root_killed_mid_transfer_the_trainer_reroutes(chain: list[RolloutProc]) -> None:
    r1 = chain[0]
    weights = perturbed(tiny_model_weights(), seed=2)
    payload = SlowPayload(weights, 1, kill(r1))
    started = time.monotonic()
    results = Relayer("trainer").relay([relay_tree(hops(chain), 1)], payload, started + DEADLINE_S)
    assert time.monotonic() - started < DEADLINE_S / 2
    by_id = {r.replica_id: r for r in results}
    assert not by_id["r1"].ok and by_id["r2"].ok and by_id["r3"].ok, results
    assert (by_id["r2"].sender, by_id["r2"].rerouted_around) == ("trainer", "r1")
    assert by_id["r3"].sender == "r2"
    # The trainer's pusher reports per replica too, and a replica that is gone stays failed.
    targets = [ReplicaTarget(f"r{i}", p.address, p.data_port) for i, p in enumerate(chain, 1)]
    pushed = push_to_replicas(targets, perturbed(weights, seed=3), 2, timeout_s=20, retries=0, mode="relay")
    assert [(r.replica_id, r.ok) for r in pushed] == [("r1", False), ("r2", True), ("r3", True)], pushed
    assert pushed[0].route == "relay root" and pushed[0].error.startswith("UNAVAILABLE"), pushed
    assert [r.route for r in pushed[1:]] == ["r1 failed mid-relay; re-routed through trainer"] * 2
