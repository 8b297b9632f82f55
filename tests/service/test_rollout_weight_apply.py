"""The apply half of a weight push on a real replica (tiny hf engine, real gRPC and HTTP servers): updates that
wait for the engine stay bounded and are dropped when their caller gives up; a copy that fails part-way stops the
replica from serving mixed weights until a complete update."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpo.common.tiny_model import ensure_tiny_model
from grpo.rollout.__main__ import start
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.grpc_api import SERVICE_NAME
from grpo.rollout.service import RolloutService
from grpo.rollout.settings import RolloutSettings
from grpo.v1 import rollout_pb2 as pb
from grpo.v1 import rollout_pb2_grpc as pb_grpc
from tests.support.polling import wait_until
from tests.support.weight_push import push_weights

GREEDY = pb.SamplingParams(n=1, temperature=0, max_new_tokens=4)


@dataclass
class Replica:
    service: RolloutService
    address: str
    http: str

    def count(self, result: str) -> float:
        value = self.service.metrics.registry.get_sample_value("grpo_rollout_weight_updates_total", {"result": result})
        return value or 0.0

    def in_hand(self) -> float | None:
        return self.service.metrics.registry.get_sample_value("grpo_rollout_weight_updates_in_hand")

    def generate(self) -> pb.GenerateResponse:
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.RolloutServiceStub(channel)
            return stub.Generate(pb.GenerateRequest(prompts=[pb.Prompt(text="3 + 4 =")], sampling=GREEDY), timeout=30)

    def health(self, service: str) -> str:
        """The standard gRPC health service's answer for `service` ("" is the server as a whole)."""
        with grpc.insecure_channel(self.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=10
            )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def probe(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(self.http + path, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture
def replica() -> Iterator[Replica]:
    """A replica started as `grpo-rollout` starts it (its gRPC and HTTP servers wired to the service)."""
    settings = RolloutSettings(
        model=str(ensure_tiny_model()), host="127.0.0.1", grpc_port=0, http_port=0, weights_data_port=-1,
        torch_threads=1, weights_stream_timeout_s=30.0, grpc_workers=8,
    )  # fmt: skip
    server, http, service = start(settings)
    yield Replica(service, f"127.0.0.1:{server.port}", f"http://127.0.0.1:{http.port}")
    http.stop()
    server.stop(0)
    service.close()


def _weights(service: RolloutService, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in _engine(service).weights().items()}


def _engine(service: RolloutService) -> HFEngine:
    assert isinstance(service.engine, HFEngine)
    return service.engine


def _push_in_background(replica: Replica, version: int, results: dict[int, Any]) -> threading.Thread:
    def push() -> None:
        try:
            results[version] = push_weights(replica.address, _weights(replica.service, version), version, timeout_s=60)
        except grpc.RpcError as exc:
            results[version] = exc

    thread = threading.Thread(target=push, daemon=True)
    thread.start()
    return thread


def _push_and_wait(replica: Replica, version: int, results: dict[int, Any]) -> threading.Thread:
    """Push `version` in the background and return once the replica has received it (it then waits)."""
    held = replica.in_hand() or 0
    thread = _push_in_background(replica, version, results)
    wait_until(lambda: replica.in_hand() == held + 1, 10, "the update to hold one more")
    time.sleep(1.0)  # received (the tiny model's bytes take milliseconds): it waits for the engine
    return thread


def test_pushes_whose_callers_gave_up_waiting_for_the_engine_are_dropped(replica: Replica) -> None:
    """The engine is busy (the generation lock held, as a long generation holds it) past each push's deadline:
    every caller sees DEADLINE_EXCEEDED, and the replica drops the update then, buffer and all, rather than
    holding it and applying it once the engine is free."""
    before = replica.service.checksum
    with replica.service._gen_lock:  # a long generation call
        for version in (1, 2, 3):
            with pytest.raises(grpc.RpcError) as info:
                push_weights(replica.address, _weights(replica.service, version), version, timeout_s=2)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(
            lambda: replica.in_hand() == 0, 10, "nothing held"
        )  # given up within a poll of the caller going away
    time.sleep(0.5)  # an update still waiting would apply now
    assert (replica.service.version, replica.service.checksum) == (0, before)
    assert replica.count("abandoned") == 3
    reply = push_weights(replica.address, _weights(replica.service, 4), 4, timeout_s=60)
    assert reply.version == 4 and replica.count("ok") == 1


def test_updates_waiting_for_the_engine_keep_their_slots(replica: Replica) -> None:
    """Two updates received and waiting for a busy engine hold their buffers, so a third is refused at once
    (ABORTED) instead of being received into a third model-sized buffer; the two apply when the engine is free."""
    results: dict[int, Any] = {}
    with replica.service._gen_lock:  # a long generation call
        # One after the other: an older update is refused while a newer one waits.
        threads = [_push_and_wait(replica, version, results) for version in (1, 2)]
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            push_weights(replica.address, _weights(replica.service, 3), 3, timeout_s=20)
        assert info.value.code() == grpc.StatusCode.ABORTED, info.value.details()
        assert "already being received or waiting to apply" in info.value.details()
        assert time.monotonic() - start < 10
        assert not results
    for thread in threads:
        thread.join(60)
    assert replica.service.version == 2
    assert all(isinstance(results[v], pb.UpdateWeightsResponse) for v in (1, 2))
    assert replica.in_hand() == 0


def test_an_older_update_is_refused_at_once_while_a_newer_one_waits(replica: Replica) -> None:
    results: dict[int, Any] = {}
    with replica.service._gen_lock:  # a long generation call
        thread = _push_and_wait(replica, 5, results)
        with pytest.raises(grpc.RpcError) as info:
            push_weights(replica.address, _weights(replica.service, 4), 4, timeout_s=20)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "version 5, waiting to apply" in info.value.details()
    thread.join(60)
    assert replica.service.version == 5


def test_a_copy_that_fails_part_way_stops_the_replica_until_a_complete_update(replica: Replica) -> None:
    """The engine copies tensor by tensor. A fault in the engine's memory (here the last live tensor made
    unwritable: every element one memory location, so torch refuses the copy) stops the copy after the others
    took the new values. The replica must not serve that mix as version 0."""
    service = replica.service
    live = _engine(service).weights()
    names = list(live)
    original = {k: v.clone() for k, v in live.items()}
    last = live[names[-1]]
    own = last.detach()  # the tensor's own memory, put back below
    with torch.no_grad():
        last.set_(torch.zeros(1, dtype=last.dtype).untyped_storage(), 0, last.shape, (0,) * last.dim())

    with pytest.raises(grpc.RpcError) as info:
        push_weights(replica.address, _weights(service, 1), 1, timeout_s=60)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "failed part-way" in info.value.details()
    assert not torch.equal(live[names[0]], original[names[0]])  # the weights really are mixed now
    assert service.version == 0

    with pytest.raises(grpc.RpcError) as info:
        replica.generate()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "failed part-way" in info.value.details()
    code, body = replica.probe("/readyz")
    assert code == 503 and body["missing"][0].startswith("weights: the copy of weight version 1 failed part-way")
    assert replica.probe("/healthz")[1]["weights_broken"]
    assert service.metrics.registry.get_sample_value("grpo_rollout_weights_broken") == 1
    assert [replica.health(name) for name in ("", SERVICE_NAME)] == ["NOT_SERVING"] * 2  # gRPC balancers see it too

    with torch.no_grad():
        last.set_(
            own.untyped_storage(), own.storage_offset(), own.shape, own.stride()
        )  # the fault is gone: the next complete update makes the replica whole
    reply = push_weights(replica.address, _weights(service, 1), 1, timeout_s=60)
    assert reply.version == 1
    assert replica.generate().weight_version == 1
    assert replica.probe("/readyz")[0] == 200
    assert replica.probe("/healthz")[1]["weights_broken"] is None
    assert [replica.health(name) for name in ("", SERVICE_NAME)] == ["SERVING"] * 2
