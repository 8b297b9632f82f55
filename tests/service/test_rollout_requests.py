"""The rollout gRPC API in-process on a free port (real engine, service and server): abandoned calls give the
engine back, non-finite weights are refused on every route, engine failures are INTERNAL, and a request that
leaves temperature out samples."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import torch

from grpo.common.grpc_server import GrpcServer
from grpo.common.net import free_port
from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.weights.data_port import WeightDataPort
from grpo.rollout.engines.hf import HFEngine
from grpo.rollout.grpc_api import SERVICE_NAME, register
from grpo.rollout.service import RolloutService
from grpo.v1 import rollout_pb2 as pb
from grpo.v1 import rollout_pb2_grpc as pb_grpc
from tests.support.rollout_proc import perturbed, tiny_model_weights
from tests.support.weight_push import push_weights

PROMPT = [pb.Prompt(text="Ana has 5 pens.")]
GREEDY = pb.SamplingParams(n=1, temperature=0, max_new_tokens=8)


class Replica:
    def __init__(self) -> None:
        model = str(ensure_tiny_model())
        self.engine = HFEngine(model, torch_threads=1)
        self.service = RolloutService(self.engine, model)
        self.service.data_port = WeightDataPort("127.0.0.1", 0)
        self.server = GrpcServer(register(self.service), [SERVICE_NAME], "127.0.0.1", free_port(), workers=8)
        self.server.start()
        self.address = f"127.0.0.1:{self.server.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.RolloutServiceStub(self.channel)

    def greedy(self) -> list[int]:
        reply = self.stub.Generate(pb.GenerateRequest(prompts=PROMPT, sampling=GREEDY), timeout=60)
        return list(reply.results[0].completions[0].token_ids)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(grace=1)
        self.service.close()


@pytest.fixture(scope="module")
def replica() -> Iterator[Replica]:
    r = Replica()
    yield r
    r.close()


def test_abandoned_generate_calls_give_the_engine_back(replica: Replica) -> None:
    # Alone, one of these runs for tens of seconds on a CPU (16 x 16 samples of up to 300 tokens).
    big = pb.GenerateRequest(
        prompts=[pb.Prompt(text=f"Ana has {i} pens.") for i in range(16)],
        sampling=pb.SamplingParams(n=16, temperature=1, max_new_tokens=300),
    )
    calls = [replica.stub.Generate.future(big, timeout=1.0) for _ in range(3)]
    for call in calls:
        with pytest.raises(grpc.RpcError) as info:
            call.result()
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 5
    while replica.service.status().busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert replica.service.status().busy == 0, "abandoned calls still hold the engine 5 s after their deadline"
    start = time.monotonic()
    assert replica.greedy()
    assert time.monotonic() - start < 10


def test_a_cancelled_generate_call_ends_cancelled_on_the_server(replica: Replica) -> None:
    done = threading.Event()

    def record(module: Any, inputs: Any, out: Any) -> None:  # a forward pass: the call is in the engine
        done.set()

    handle = replica.engine.model.lm_head.register_forward_hook(record)
    try:
        big = pb.GenerateRequest(prompts=PROMPT, sampling=pb.SamplingParams(n=16, temperature=1, max_new_tokens=300))
        call = replica.stub.Generate.future(big, timeout=60)
        assert done.wait(30)
        call.cancel()
        with pytest.raises(grpc.FutureCancelledError):
            call.result()
    finally:
        handle.remove()
    deadline = time.monotonic() + 5
    while replica.service.status().busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert replica.service.status().busy == 0, "a cancelled call still holds the engine 5 s later"


@pytest.mark.parametrize("route", ["stream", "data_port"])
def test_non_finite_weights_are_refused_and_the_old_ones_serve(replica: Replica, route: str) -> None:
    weights = tiny_model_weights()
    before, version = replica.greedy(), replica.service.version
    for i, bad_value in enumerate([float("nan"), float("inf")]):
        bad = perturbed(weights, seed=7)
        bad["model.norm.weight"][3] = bad_value
        data_port = replica.service.data_port.port if route == "data_port" and replica.service.data_port else 0
        with pytest.raises(grpc.RpcError) as info:
            push_weights(replica.address, bad, version + 1 + i, timeout_s=60, data_port=data_port)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        assert "model.norm.weight has 1 non-finite value" in (info.value.details() or "")
        assert replica.service.version == version and replica.greedy() == before
    good = perturbed(weights, seed=8)
    assert push_weights(replica.address, good, version + 5, timeout_s=60).version == version + 5


def test_an_engine_failure_is_internal_with_its_message(replica: Replica) -> None:
    def fail(module: Any, inputs: Any, out: Any) -> None:
        raise RuntimeError("the device ran out of memory")

    handle = replica.engine.model.lm_head.register_forward_hook(fail)
    try:
        with pytest.raises(grpc.RpcError) as info:
            replica.greedy()
    finally:
        handle.remove()
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "RuntimeError: the device ran out of memory" in (info.value.details() or "")
    assert replica.greedy()  # the engine is free again


def test_temperature_left_out_samples_and_zero_is_greedy(replica: Replica) -> None:
    def completions(sampling: pb.SamplingParams) -> set[tuple[int, ...]]:
        reply = replica.stub.Generate(pb.GenerateRequest(prompts=PROMPT, sampling=sampling), timeout=60)
        return {tuple(c.token_ids) for c in reply.results[0].completions}

    assert len(completions(pb.SamplingParams(n=6, max_new_tokens=8, seed=1))) > 1
    assert len(completions(pb.SamplingParams(n=6, max_new_tokens=8, temperature=0))) == 1


def test_weights_at_the_float_limits_are_not_mistaken_for_non_finite(replica: Replica) -> None:
    weights = perturbed(tiny_model_weights(), seed=9)
    weights["model.norm.weight"][0] = torch.finfo(torch.float32).max
    version = replica.service.version + 1
    assert push_weights(replica.address, weights, version, timeout_s=60).version == version
