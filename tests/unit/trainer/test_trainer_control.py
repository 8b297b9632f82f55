"""TrainerService over a real in-process gRPC server: status, checkpoint requests answered by a loop, Stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from grpo.common.grpc_server import GrpcServer
from grpo.common.net import free_port
from grpo.trainer.control import ReplicaView, RunControl
from grpo.trainer.grpc_api import register
from grpo.trainer.ledger import drop_after, read_ledger, write_segment
from grpo.trainer.pusher import ReplicaTarget, push_to_replicas, verify_reply
from grpo.v1 import rollout_pb2, trainer_pb2, trainer_pb2_grpc


@pytest.fixture
def served() -> Iterator[tuple[RunControl, trainer_pb2_grpc.TrainerServiceStub]]:
    control = RunControl("unit", 10)
    server = GrpcServer(register(control), ["grpo.v1.TrainerService"], "127.0.0.1", free_port(), workers=4)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield control, trainer_pb2_grpc.TrainerServiceStub(channel)
    channel.close()
    server.stop(0)


def test_status_reflects_the_snapshot(served: tuple[RunControl, trainer_pb2_grpc.TrainerServiceStub]) -> None:
    control, stub = served
    control.update(phase="grpo", step=3, dropped={"stale": 2}, replicas=(ReplicaView("r1", "h:1", 4, 0.5),),
                   metrics={"rollout/reward_mean": 0.25})  # fmt: skip
    status = stub.GetRunStatus(trainer_pb2.GetRunStatusRequest(), timeout=5)
    assert (status.run_id, status.phase, status.step, status.total_steps) == ("unit", "grpo", 3, 10)
    assert dict(status.dropped) == {"stale": 2} and status.replicas[0].weight_version == 4
    assert status.metrics["rollout/reward_mean"] == 0.25


def test_grpc_status_says_what_the_http_status_says(
    served: tuple[RunControl, trainer_pb2_grpc.TrainerServiceStub],
) -> None:
    """Every field of /v1/status is in GetRunStatus, with the same value: a gRPC client once could not see
    why a run failed, its evaluations, its stage, or the groups beside the books (duplicates, superseded)."""
    control, stub = served
    stage = {"index": 1, "mode": "sft", "steps": 4, "seconds": 2.5, "folder": "/runs/x/stage-1-sft",
             "outcome": "SFT loss 2.1 → 0.4", "sft_loss_first": 2.1, "sft_loss_last": 0.4}  # fmt: skip
    control.update(phase="failed", step=3, dropped={"stale": 2}, replicas=(ReplicaView("r1", "h:1", 4, 0.5),),
                   metrics={"rollout/reward_mean": 0.25}, duplicates=5, superseded=6, error="every group failed",
                   eval_history=((0, 0.25), (3, 0.5)), stage="2/2 grpo", stages=(stage,),
                   last_eval=(3, {"eval/accuracy": 0.5}))  # fmt: skip
    want = control.status().to_json()
    got = stub.GetRunStatus(trainer_pb2.GetRunStatusRequest(), timeout=5)
    assert set(want) == {f.name for f in trainer_pb2.RunStatus.DESCRIPTOR.fields}
    for key in ("run_id", "phase", "step", "total_steps", "policy_version", "tasks_published", "groups_trained",
                "in_flight", "duplicates", "superseded", "error", "stage"):  # fmt: skip
        assert getattr(got, key) == want[key], key
    assert dict(got.dropped) == want["dropped"] and dict(got.metrics) == want["metrics"]
    assert [(r.replica_id, r.address, r.weight_version, r.last_seen_s) for r in got.replicas] == [("r1", "h:1", 4, 0.5)]
    assert [(p.step, p.accuracy) for p in got.eval_history] == [(0, 0.25), (3, 0.5)]
    (done,) = got.stages
    assert (done.index, done.mode, done.steps, done.seconds, done.folder, done.outcome) == (
        1, "sft", 4, 2.5, "/runs/x/stage-1-sft", "SFT loss 2.1 → 0.4")  # fmt: skip
    assert (got.last_eval.step, dict(got.last_eval.metrics)) == (3, {"eval/accuracy": 0.5})
    control.update(last_eval=None, stages=({"index": 2, "mode": "grpo", "steps": None, "seconds": None},))
    got = stub.GetRunStatus(trainer_pb2.GetRunStatusRequest(), timeout=5)
    assert not got.HasField("last_eval") and (got.stages[0].index, got.stages[0].steps) == (2, 0)


def test_checkpoint_request_is_served_between_steps(
    served: tuple[RunControl, trainer_pb2_grpc.TrainerServiceStub],
) -> None:
    control, stub = served

    def loop() -> None:  # what the training loop does at a step boundary
        while not control.stopping:
            for fut in control.take_checkpoint_requests():
                fut.set_result(("/ckpt/step-7", 7))
            time.sleep(0.05)

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        reply = stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(), timeout=10)
        assert (reply.path, reply.step) == ("/ckpt/step-7", 7)
        stub.Stop(trainer_pb2.StopRequest(), timeout=5)
        thread.join(5)
        assert control.stopping and not thread.is_alive()
    finally:
        control.request_stop()


def test_checkpoint_request_has_a_deadline(served: tuple[RunControl, trainer_pb2_grpc.TrainerServiceStub]) -> None:
    _, stub = served  # nobody serves requests: the call ends at its deadline, not never
    with pytest.raises(grpc.RpcError) as exc:
        stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(), timeout=1)
    assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_checkpoint_refused_when_run_ended(served: tuple[RunControl, trainer_pb2_grpc.TrainerServiceStub]) -> None:
    control, stub = served
    control.update(phase="done")
    with pytest.raises(grpc.RpcError) as exc:
        stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(), timeout=5)
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_push_to_unreachable_replica_fails_within_timeout() -> None:
    tensors = {"w": torch.zeros(4)}
    start = time.monotonic()
    results = push_to_replicas([ReplicaTarget("gone", f"127.0.0.1:{free_port()}")], tensors, 1, timeout_s=2, retries=3)
    assert time.monotonic() - start < 4
    assert not results[0].ok and results[0].error


def test_verify_reply() -> None:
    assert verify_reply(rollout_pb2.UpdateWeightsResponse(version=3, checksum="ab"), 3, "ab") == ""
    assert "version 2" in verify_reply(rollout_pb2.UpdateWeightsResponse(version=2, checksum="ab"), 3, "ab")
    assert "checksum" in verify_reply(rollout_pb2.UpdateWeightsResponse(version=3, checksum="cd"), 3, "ab")


def test_ledger_segments_and_resume_truncation(tmp_path: Path) -> None:
    write_segment(tmp_path, 2, [("a", "trained"), ("b", "stale")])
    # A second checkpoint of the same step rewrites the step's whole segment (the checkpoint carries it).
    write_segment(tmp_path, 2, [("a", "trained"), ("b", "stale"), ("c", "trained")])
    write_segment(tmp_path, 4, [("d", "zero_variance")])
    assert [e["task_id"] for e in read_ledger(tmp_path)] == ["a", "b", "c", "d"]
    assert drop_after(tmp_path, 2) == 1  # resuming from step 2 discards step 4's outcomes
    assert [e["task_id"] for e in read_ledger(tmp_path)] == ["a", "b", "c"]


def test_abandoned_checkpoint_request_is_skipped() -> None:
    control = RunControl("unit", 1)
    fut = control.request_checkpoint()
    fut.cancel()  # the gRPC caller's deadline passed
    assert control.take_checkpoint_requests() == []
