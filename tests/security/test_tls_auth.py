"""TLS on the reward, rollout and trainer-to-rollout gRPC paths, with and without tokens; auth on the rollout's methods."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpo.common.auth import bearer_metadata
from grpo.common.channels import make_channel
from grpo.common.reward_client import RewardClient, RewardServiceError
from grpo.common.weights.codec import weights_checksum
from grpo.common.weights.relay import Relayer, TensorPayload
from grpo.rollout.settings import RolloutSettings
from grpo.rollout.worker_wiring import reward_client
from grpo.trainer.pusher import ReplicaTarget, push_to_replicas, replica_status
from grpo.v1 import reward_pb2 as rpb
from grpo.v1 import reward_pb2_grpc, rollout_pb2_grpc
from grpo.v1 import rollout_pb2 as pb
from tests.support.reward_proc import start_reward_service, stop_reward_service
from tests.support.rollout_proc import perturbed, start_rollout_service, tiny_model_weights, update_bytes
from tests.support.weight_push import push_weights
from tests.unit.reward.helpers import self_signed_cert

TOKEN = "tls-s3cret"


@pytest.fixture(scope="module")
def tls_reward(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cert, key = self_signed_cert(tmp_path_factory.mktemp("tls"))
    env = {"GRPO_REWARD_TLS_CERT_FILE": str(cert), "GRPO_REWARD_TLS_KEY_FILE": str(key), "GRPO_REWARD_TOKEN": TOKEN}
    service = start_reward_service(workers=1, env=env)
    service.cert, service.cert_path = cert.read_bytes(), cert
    yield service
    service.assert_alive()
    stop_reward_service(service)


def test_tls_with_token_scores(tls_reward: Any) -> None:
    creds = grpc.ssl_channel_credentials(tls_reward.cert)
    with grpc.secure_channel(tls_reward.grpc_addr, creds) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        reply = stub.VerifyMath(
            rpb.VerifyMathRequest(answer="\\boxed{4}", gold="4"), timeout=30, metadata=bearer_metadata(TOKEN)
        )
        assert reply.status == "correct"
        with pytest.raises(grpc.RpcError) as info:
            stub.VerifyMath(rpb.VerifyMathRequest(answer="4", gold="4"), timeout=30)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING  # probes need no token
    with RewardClient(tls_reward.grpc_addr, token=TOKEN, timeout_s=30, root_certificates=tls_reward.cert) as client:
        (result,) = client.score([{"id": "a", "completion": "\\boxed{4}", "checks": {"math": {"gold": "4"}}}])
        assert result.reward == 1.0


def test_plaintext_and_untrusted_clients_cannot_talk_to_tls(tls_reward: Any, tmp_path: Path) -> None:
    with grpc.insecure_channel(tls_reward.grpc_addr) as channel:
        with pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    other_cert, _ = self_signed_cert(tmp_path)  # a client trusting someone else's certificate: handshake fails
    with grpc.secure_channel(tls_reward.grpc_addr, grpc.ssl_channel_credentials(other_cert.read_bytes())) as channel:
        with pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # HTTP keeps its token too (TLS for HTTP is the ingress's job).
    assert httpx.post(f"{tls_reward.http_url}/v1/score", json={"items": []}, timeout=10).status_code == 401


def test_half_configured_tls_refuses_to_start(tmp_path: Path) -> None:
    cert, _ = self_signed_cert(tmp_path)
    with pytest.raises(RuntimeError, match="tls_cert_file and tls_key_file"):
        start_reward_service(workers=1, env={"GRPO_REWARD_TLS_CERT_FILE": str(cert)}, ready_timeout=30)


def test_rollout_token_guards_every_method(tmp_path: Path) -> None:
    proc = start_rollout_service("--token", "t0k", "--weights-token", "w8ts", log_dir=tmp_path)
    calls: list[tuple[str, Callable[[Any, Any], Any]]] = [
        ("Generate", lambda s, md: s.Generate(
            pb.GenerateRequest(prompts=[pb.Prompt(text="1+1=")], sampling=pb.SamplingParams(n=1, max_new_tokens=2)),
            timeout=60, metadata=md)),
        ("GetStatus", lambda s, md: s.GetStatus(pb.GetStatusRequest(), timeout=10, metadata=md)),
        ("UpdateWeights", lambda s, md: s.UpdateWeights(iter([pb.WeightChunk(data=b"x")]), timeout=10, metadata=md)),
    ]  # fmt: skip
    try:
        with grpc.insecure_channel(proc.address) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            for name, call in calls:
                for metadata in ((), bearer_metadata("wrong")):
                    with pytest.raises(grpc.RpcError) as info:
                        call(stub, metadata)
                    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
            assert call_ok(calls[0][1], stub, bearer_metadata("t0k"))
            assert call_ok(calls[1][1], stub, bearer_metadata("t0k"))
            # The weight endpoint wants its own token: the general one does not open it.
            with pytest.raises(grpc.RpcError) as info:
                calls[2][1](stub, bearer_metadata("t0k"))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as info:  # the right token gets through to the stream's checks
                calls[2][1](stub, bearer_metadata("w8ts"))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            # GetStatus (read-only) opens with the weights token too: a relaying replica holds only that one and
            # asks a hop that refused a version whether it already holds it. Generate does not.
            assert call_ok(calls[1][1], stub, bearer_metadata("w8ts"))
            with pytest.raises(grpc.RpcError) as info:
                calls[0][1](stub, bearer_metadata("w8ts"))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        weights = perturbed(tiny_model_weights(), seed=7)
        assert push_weights(proc.address, weights, 1, token="w8ts", timeout_s=60).version == 1
        hop = pb.RelayHop(replica_id="r1", address=proc.address, data_port=proc.data_port)
        (held,) = Relayer("trainer", "w8ts").relay([hop], TensorPayload(weights, 1, None), time.monotonic() + 60)
        assert held.ok and held.version == 1, held  # refused as not newer, and found to hold exactly it
        assert proc.healthz()["status"] == "ok"  # HTTP health stays open
    finally:
        assert proc.stop() == 0, proc.log_text()[-2000:]


def test_callers_without_a_token_cannot_hold_the_servers_threads(tmp_path: Path) -> None:
    """Calls without the token that never send their request message were each given a worker thread to wait in
    (the refusal was a unary handler): as many as the pool held (`grpc_workers`) blocked every call, token or not,
    for as long as they stayed open. They are refused at once now."""
    proc = start_rollout_service("--token", "t0k", "--grpc-workers", "4", log_dir=tmp_path)
    stop = threading.Event()

    def never() -> Iterator[bytes]:  # a request stream that sends nothing and does not end
        stop.wait()
        yield from ()

    channels = [grpc.insecure_channel(proc.address) for _ in range(8)]
    try:
        silent = [c.stream_unary("/grpo.v1.RolloutService/GetStatus").future(never()) for c in channels]
        for call in silent:  # refused without reading a message
            assert call.exception(timeout=10).code() == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(proc.address) as channel:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            assert stub.GetStatus(pb.GetStatusRequest(), timeout=5, metadata=bearer_metadata("t0k")).model
    finally:
        stop.set()
        for channel in channels:
            channel.close()
        assert proc.stop() == 0, proc.log_text()[-2000:]


def call_ok(call: Callable[[Any, Any], Any], stub: Any, metadata: Any) -> bool:
    return call(stub, metadata) is not None


def test_rollout_worker_reward_client_over_tls(tls_reward: Any) -> None:
    """The client the rollout worker builds from its settings talks TLS to a TLS reward service."""
    settings = RolloutSettings(
        reward_addr=tls_reward.grpc_addr, reward_token=TOKEN, reward_tls_ca_file=str(tls_reward.cert_path)
    )
    with reward_client(settings) as client:
        results = client.score([{"id": "t", "completion": "\\boxed{6}", "checks": {"math": {"gold": "6"}}}])
        assert results[0].reward == 1.0
    plaintext = RolloutSettings(reward_addr=tls_reward.grpc_addr, reward_token=TOKEN, reward_retry_budget_s=0)
    with reward_client(plaintext) as client, pytest.raises(RewardServiceError) as info:
        client.score([{"id": "t", "completion": "x", "checks": {"math": {"gold": "6"}}}])
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_rollout_over_tls_generates_and_takes_weights_from_the_trainer(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    env = {"GRPO_ROLLOUT_TLS_CERT_FILE": str(cert), "GRPO_ROLLOUT_TLS_KEY_FILE": str(key)}
    proc = start_rollout_service("--token", "t0k", log_dir=tmp_path, env=env, ca_file=cert)
    try:
        with make_channel(proc.address, cert) as channel:
            reply = rollout_pb2_grpc.RolloutServiceStub(channel).Generate(
                pb.GenerateRequest(prompts=[pb.Prompt(text="1+1=")], sampling=pb.SamplingParams(n=1, max_new_tokens=2)),
                timeout=60,
                metadata=bearer_metadata("t0k"),
            )
            assert len(reply.results[0].completions[0].token_ids) >= 1
        with grpc.insecure_channel(proc.address) as channel, pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # The trainer's path: push_weights directly, then the pusher it runs every step, and a status read.
        base = tiny_model_weights()
        first = perturbed(base, seed=1)
        reply = push_weights(proc.address, first, 1, token="t0k", timeout_s=60, ca_file=str(cert))
        assert (reply.version, reply.checksum) == (1, weights_checksum(first))
        # The pusher sends the bytes to the data port, over TLS with the same certificate.
        (result,) = push_to_replicas(
            [proc.target], perturbed(base, seed=2), 2, token="t0k", timeout_s=60, ca_file=str(cert)
        )
        assert result.ok and result.version == 2, result
        assert update_bytes(proc, "data_port") > 0 and update_bytes(proc, "stream") > 0
        assert replica_status(proc.address, token="t0k", ca_file=str(cert)).weight_version == 2
        with pytest.raises(grpc.RpcError) as info:  # the pusher never falls back to plaintext
            push_weights(proc.address, perturbed(base, seed=3), 3, token="t0k", timeout_s=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        assert proc.stop() == 0, proc.log_text()[-2000:]


def test_relay_runs_tls_and_the_token_hop_to_hop(tmp_path: Path) -> None:
    """Each replica relays to the next over TLS (trusting its own certificate, the deployment's) with its own
    weights token; a replica that does not take that token refuses the hop, and says so."""
    cert, key = self_signed_cert(tmp_path)
    env = {"GRPO_ROLLOUT_TLS_CERT_FILE": str(cert), "GRPO_ROLLOUT_TLS_KEY_FILE": str(key)}
    tokens = ["t0k", "t0k", "t0k", "another"]
    procs = [
        start_rollout_service("--token", token, "--replica-id", f"r{i}", log_dir=tmp_path, env=env, ca_file=cert)
        for i, token in enumerate(tokens, 1)
    ]
    try:
        targets = [ReplicaTarget(f"r{i}", p.address, p.data_port) for i, p in enumerate(procs, 1)]
        weights = perturbed(tiny_model_weights(), seed=1)
        results = push_to_replicas(
            targets, weights, 1, token="t0k", timeout_s=60, retries=0, ca_file=str(cert), mode="relay", fanout=1
        )
        assert [r.ok for r in results] == [True, True, True, False], results
        assert [r.route for r in results] == ["relay root", "relayed via r1", "relayed via r2", "relayed via r3"]
        assert results[3].error.startswith("UNAUTHENTICATED"), results[3]
        for proc in procs[:3]:  # the bytes went to each data port, over TLS
            assert update_bytes(proc, "data_port") > 0
            assert replica_status(proc.address, token="t0k", ca_file=str(cert)).weight_version == 1
        assert replica_status(procs[3].address, token="another", ca_file=str(cert)).weight_version == 0
    finally:
        for proc in procs:
            assert proc.stop() == 0, proc.log_text()[-2000:]


def test_half_configured_tls_rollout_refuses_to_start(tmp_path: Path) -> None:
    cert, _ = self_signed_cert(tmp_path)
    with pytest.raises(RuntimeError, match="tls_cert_file and tls_key_file"):
        start_rollout_service(log_dir=tmp_path, env={"GRPO_ROLLOUT_TLS_CERT_FILE": str(cert)}, timeout=60)
