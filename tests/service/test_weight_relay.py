"""Relay fan-out to real replicas: one copy from the trainer reaches a chain and a tree, each replica checking it."""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from grpo.common.weights.codec import weights_checksum
from grpo.common.weights.relay import Relayer, TensorPayload, relay_tree
from grpo.trainer.pusher import PushResult, ReplicaTarget, push_to_replicas, replica_status
from grpo.v1 import rollout_pb2 as pb
from tests.support.rollout_proc import RolloutProc, perturbed, start_rollout_service, tiny_model_weights, update_bytes
from tests.support.trainer_proc import trainer_config


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RolloutProc]]:
    log_dir = tmp_path_factory.mktemp("relay")
    procs = [start_rollout_service("--replica-id", f"r{i}", log_dir=log_dir) for i in (1, 2, 3)]
    yield procs
    for proc in procs:
        assert proc.stop() == 0, proc.log_text()[-2000:]


@pytest.fixture(scope="module")
def base() -> dict[str, torch.Tensor]:
    return tiny_model_weights()


def targets(procs: list[RolloutProc]) -> list[ReplicaTarget]:
    return [ReplicaTarget(f"r{i}", p.address, p.data_port) for i, p in enumerate(procs, 1)]


def states(procs: list[RolloutProc]) -> list[tuple[int, str]]:
    return [(s.weight_version, s.weight_checksum) for s in (replica_status(p.address) for p in procs)]


def next_version(procs: list[RolloutProc]) -> int:
    return max(v for v, _ in states(procs)) + 1


def model_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def relayed_bytes(proc: RolloutProc) -> float:
    """The replica's grpo_rollout_weight_relay_bytes_total: what it passed on to other replicas."""
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    prefix = "grpo_rollout_weight_relay_bytes_total "
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize(
    ("fanout", "routes", "copies_passed_on"),
    [
        (1, ["relay root", "relayed via r1", "relayed via r2"], [1, 1, 0]),  # a chain
        (2, ["relay root", "relayed via r1", "relayed via r1"], [2, 0, 0]),  # a tree: r1 feeds both
    ],
)
def test_one_copy_from_the_trainer_reaches_every_replica(
    replicas: list[RolloutProc],
    base: dict[str, torch.Tensor],
    fanout: int,
    routes: list[str],
    copies_passed_on: list[int],
) -> None:
    version = next_version(replicas)
    weights = perturbed(base, seed=version)
    by_data_port = [update_bytes(p, "data_port") for p in replicas]
    passed_on = [relayed_bytes(p) for p in replicas]
    results = push_to_replicas(targets(replicas), weights, version, timeout_s=60, mode="relay", fanout=fanout)
    assert [(r.replica_id, r.ok, r.route) for r in results] == [
        (f"r{i}", True, route) for i, route in enumerate(routes, 1)
    ]
    assert states(replicas) == [(version, weights_checksum(weights))] * 3
    # The trainer's egress is one model, not three; every replica took its copy on its data port.
    assert sum(r.bytes_sent for r in results) == model_bytes(weights)
    assert [update_bytes(p, "data_port") - before for p, before in zip(replicas, by_data_port, strict=True)] == [
        model_bytes(weights)
    ] * 3
    # The egress moved to the replicas with children, one copy per child.
    assert [relayed_bytes(p) - before for p, before in zip(replicas, passed_on, strict=True)] == [
        n * model_bytes(weights) for n in copies_passed_on
    ]


def test_the_relay_falls_back_to_the_grpc_stream_hop_by_hop(
    replicas: list[RolloutProc], base: dict[str, torch.Tensor]
) -> None:
    """Hops without a data port (advertised 0) take the bytes in the stream; a relaying replica then forwards
    them as they arrive there, the header first."""
    version = next_version(replicas)
    weights = perturbed(base, seed=version)
    by_stream = [update_bytes(p, "stream") for p in replicas]
    no_ports = [ReplicaTarget(t.replica_id, t.address, 0) for t in targets(replicas)]
    results = push_to_replicas(no_ports, weights, version, timeout_s=60, mode="relay", fanout=1)
    assert all(r.ok for r in results), results
    assert states(replicas) == [(version, weights_checksum(weights))] * 3
    assert [update_bytes(p, "stream") - before for p, before in zip(replicas, by_stream, strict=True)] == [
        model_bytes(weights)
    ] * 3


def test_a_replica_forwards_what_it_refuses_itself(replicas: list[RolloutProc], base: dict[str, torch.Tensor]) -> None:
    """r2 already holds a newer version: it refuses the relayed one and still passes it on to r3, which lacks it."""
    version = next_version(replicas)
    (newer,) = push_to_replicas(targets(replicas)[1:2], perturbed(base, seed=50), version + 1, timeout_s=60)
    assert newer.ok, newer
    weights = perturbed(base, seed=version)
    results = push_to_replicas(targets(replicas), weights, version, timeout_s=60, retries=0, mode="relay", fanout=1)
    assert [r.ok for r in results] == [True, False, True], results
    assert results[1].error.startswith("FAILED_PRECONDITION") and results[2].route == "relayed via r2"
    assert [v for v, _ in states(replicas)] == [version, version + 1, version]


def test_direct_push_sends_one_copy_per_replica(replicas: list[RolloutProc], base: dict[str, torch.Tensor]) -> None:
    version = next_version(replicas)
    weights = perturbed(base, seed=version)
    results = push_to_replicas(targets(replicas), weights, version, timeout_s=60, mode="direct")
    assert all(r.ok and r.route == "direct" for r in results), results
    assert sum(r.bytes_sent for r in results) == 3 * model_bytes(weights)


def test_an_older_version_is_rejected_everywhere(replicas: list[RolloutProc], base: dict[str, torch.Tensor]) -> None:
    version = next_version(replicas)
    newest = perturbed(base, seed=version)
    assert all(r.ok for r in push_to_replicas(targets(replicas), newest, version, timeout_s=60, mode="relay"))
    results = push_to_replicas(targets(replicas), perturbed(base, seed=99), version - 1, timeout_s=60, mode="relay")
    # Each replica said no itself, and still passed the update on (its children might not have had it).
    assert [r.ok for r in results] == [False] * 3
    assert all(r.error.startswith("FAILED_PRECONDITION") and r.attempts == 1 for r in results), results
    assert [r.route for r in results] == ["relay root", "relayed via r1", "relayed via r1"]
    assert states(replicas) == [(version, weights_checksum(newest))] * 3


class FlippedByte(TensorPayload):
    """The trainer's bytes with one flipped in transit, under the header of the true ones."""

    def pieces(self, deadline: float) -> Iterator[memoryview]:
        for i, view in enumerate(super().pieces(deadline)):
            if i == 0:
                data = bytearray(view)
                data[len(data) // 2] ^= 0x01
                view = memoryview(data)
            yield view


def test_a_corrupt_hop_is_rejected_by_every_replica_below(
    replicas: list[RolloutProc], base: dict[str, torch.Tensor]
) -> None:
    before = states(replicas)
    version = next_version(replicas)
    weights = perturbed(base, seed=version)
    hops = [pb.RelayHop(replica_id=t.replica_id, address=t.address, data_port=t.data_port) for t in targets(replicas)]
    relayer = Relayer("trainer")
    results = relayer.relay([relay_tree(hops, 1)], FlippedByte(weights, version, None), time.monotonic() + 60)
    assert [(r.replica_id, r.ok) for r in results] == [("r1", False), ("r2", False), ("r3", False)]
    assert all(r.error.startswith("INVALID_ARGUMENT") and "sha256 mismatch" in r.error for r in results), results
    assert [r.sender for r in results] == ["trainer", "r1", "r2"]  # every replica got it: none was left out
    assert states(replicas) == before  # the old weights keep serving
    # A good push right after goes through.
    good = push_to_replicas(targets(replicas), weights, version, timeout_s=60, mode="relay", fanout=1)
    assert all(r.ok for r in good), good


def test_a_replica_the_relay_misses_is_pushed_to_directly(
    replicas: list[RolloutProc], base: dict[str, torch.Tensor]
) -> None:
    """A root that cannot be reached: the trainer re-routes to its children and then pushes to it directly,
    which fails too (nothing listens); every replica has a result that says what happened."""
    gone = ReplicaTarget("gone", "127.0.0.1:1", 0)  # port 1: nothing listens
    version = next_version(replicas)
    weights = perturbed(base, seed=version)
    results: list[PushResult] = push_to_replicas(
        [gone, *targets(replicas)], weights, version, timeout_s=30, retries=1, mode="relay", fanout=1
    )
    assert [r.replica_id for r in results] == ["gone", "r1", "r2", "r3"]
    assert not results[0].ok and results[0].attempts == 2 and results[0].route.startswith("direct, after the relay")
    assert results[1].ok and results[1].route == "gone failed mid-relay; re-routed through trainer"
    assert [r.ok for r in results[2:]] == [True, True], results
    assert sum(r.bytes_sent for r in results[1:]) == model_bytes(weights)


def test_a_replica_that_already_holds_the_version_counts_as_done(
    replicas: list[RolloutProc], base: dict[str, torch.Tensor]
) -> None:
    """r2 took the version directly (say from a sender that died right after passing it on): the relay finds it
    refused as not newer, sees r2 holds exactly it, and counts it done; r3 still gets it through r2."""
    version = next_version(replicas)
    weights = perturbed(base, seed=version)
    (direct,) = push_to_replicas(targets(replicas)[1:2], weights, version, timeout_s=60)
    assert direct.ok, direct
    results = push_to_replicas(targets(replicas), weights, version, timeout_s=60, retries=0, mode="relay", fanout=1)
    assert [(r.ok, r.error) for r in results] == [(True, "")] * 3, results
    assert results[2].route == "relayed via r2"
    assert states(replicas) == [(version, weights_checksum(weights))] * 3


def test_the_trainer_relays_to_three_replicas_by_default(
    replicas: list[RolloutProc], tmp_path: Path, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's own sync (weight_push auto): three live replicas, one copy sent, every replica confirmed."""
    from grpo.common.registry import ReplicaInfo
    from grpo.trainer.config import TrainerSettings
    from grpo.trainer.control import RunControl
    from grpo.trainer.run import GrpoRun

    config = json.loads(trainer_config(tmp_path, "relay", redis_url, push_timeout_s=30).read_text())
    run = GrpoRun(TrainerSettings(**config), RunControl())
    try:
        for target, state in zip(targets(replicas), states(replicas), strict=True):
            run.registry.heartbeat(ReplicaInfo(target.replica_id, target.address, state[0], state[1], time.time(),
                                               weights_data_port=target.data_port))  # fmt: skip
        version = next_version(replicas)
        run.learner.set_version(version)
        with caplog.at_level(logging.DEBUG, logger="grpo.trainer"):  # each replica's route: DEBUG, one INFO a push
            run._sync_replicas()
        assert run.confirmed == {"r1": version, "r2": version, "r3": version}
        sent = run.push_stats["push/bytes_sent"]
        assert sent == model_bytes(run.learner.push_tensors()), run.push_stats
        assert any("relayed via r1" in r.message for r in caplog.records)
    finally:
        run.close()
