"""The trainer's gRPC API under garbage bytes and without its token: a status, never a crash or a stop."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpo.common.auth import bearer_metadata
from grpo.v1 import trainer_pb2, trainer_pb2_grpc
from tests.support.trainer_proc import start_trainer, trainer_config, wait_for

METHODS = ["GetRunStatus", "SaveCheckpoint", "Stop"]
GARBAGE = [b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f", bytes(range(256))]


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_trainer_survives_garbage_and_guards_every_method(tmp_path: Path, redis_url: str) -> None:
    # No replica will ever come: the trainer sits waiting for one, its API up, which is all this test needs.
    config = trainer_config(tmp_path, "hostile", redis_url, steps=1, token="tr41n", replica_wait_s=120)
    address = f"127.0.0.1:{json.loads(config.read_text())['grpc_port']}"
    log = tmp_path / "trainer.log"
    proc = start_trainer(config, log)
    try:
        wait_for(lambda: _serving(address), 90, "the trainer's gRPC API", proc, log)
        with grpc.insecure_channel(address) as channel:
            for method in METHODS:
                for payload in GARBAGE:
                    with pytest.raises(grpc.RpcError) as info:
                        channel.unary_unary(f"/grpo.v1.TrainerService/{method}")(
                            payload, timeout=10, metadata=bearer_metadata("tr41n")
                        )
                    assert info.value.code() in {grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT}, method
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            for call in (
                lambda md: stub.GetRunStatus(trainer_pb2.GetRunStatusRequest(), timeout=10, metadata=md),
                lambda md: stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(), timeout=10, metadata=md),
                lambda md: stub.Stop(trainer_pb2.StopRequest(), timeout=10, metadata=md),
            ):
                for metadata in ((), bearer_metadata("wrong")):
                    with pytest.raises(grpc.RpcError) as info:
                        call(metadata)
                    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            status = stub.GetRunStatus(trainer_pb2.GetRunStatusRequest(), timeout=10, metadata=bearer_metadata("tr41n"))
            assert status.step == 0
        assert proc.poll() is None, "garbage or an unauthenticated Stop ended the run"
        assert _serving(address)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except Exception:
                proc.kill()
                proc.wait()
