"""Malformed gRPC requests to the reward and rollout services: a clear status, never a crash or a hang."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpo.v1 import reward_pb2 as rpb
from grpo.v1 import reward_pb2_grpc, rollout_pb2_grpc
from grpo.v1 import rollout_pb2 as pb
from tests.support.rollout_proc import RolloutProc

GARBAGE = [b"\xff" * 64, b"\x0a\xff\xff\xff\xff\x0f", b"\x08" + b"\xff" * 10, bytes(range(256))]
# gRPC's own deserializer answers undecodable bytes before our code runs: INTERNAL is its status for that.
UNDECODABLE = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL}
REWARD_UNARY = ["Score", "VerifyMath", "Execute", "VerifyCode"]
ROLLOUT_UNARY = ["Generate", "GetStatus"]


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def _raw_unary(address: str, method: str, payload: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(method)  # no serializers: bytes go on the wire as they are
        with pytest.raises(grpc.RpcError) as info:
            call(payload, timeout=20)
        return info.value


@pytest.mark.parametrize("payload", GARBAGE, ids=["ff", "bad-varint", "bad-field", "all-bytes"])
def test_garbage_bytes_to_every_reward_method(tight_reward: Any, payload: bytes) -> None:
    for method in REWARD_UNARY:
        err = _raw_unary(tight_reward.grpc_addr, f"/grpo.v1.RewardService/{method}", payload)
        assert err.code() in UNDECODABLE, (method, err.code(), err.details())
    with grpc.insecure_channel(tight_reward.grpc_addr) as channel:
        stream = channel.unary_stream("/grpo.v1.RewardService/ScoreStream")(payload, timeout=20)
        with pytest.raises(grpc.RpcError) as info:
            list(stream)
        assert info.value.code() in UNDECODABLE
    tight_reward.assert_alive()
    assert _serving(tight_reward.grpc_addr)


def test_unknown_method_and_oversize_message(tight_reward: Any) -> None:
    err = _raw_unary(tight_reward.grpc_addr, "/grpo.v1.RewardService/DropTables", b"")
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    # Over the 64 MiB receive limit: refused by gRPC before it is buffered into a message.
    err = _raw_unary(tight_reward.grpc_addr, "/grpo.v1.RewardService/Score", b"\x0a" + b"\xff" * (65 << 20))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _serving(tight_reward.grpc_addr)


def _item(**fields: Any) -> rpb.ScoreItem:
    base: dict[str, Any] = {"id": "x", "completion": "\\boxed{1}", "checks": rpb.Checks(math=rpb.MathCheck(gold="1"))}
    return rpb.ScoreItem(**{**base, **fields})


BAD_REWARD_CALLS: list[tuple[str, Any, str]] = [
    ("Score", rpb.ScoreRequest(), "items"),
    ("Score", rpb.ScoreRequest(items=[rpb.ScoreItem(id="x", completion="a")]), "check"),
    ("Score", rpb.ScoreRequest(items=[_item(weights={"code": 1.0})]), "weights"),
    ("Score", rpb.ScoreRequest(items=[_item(weights={"math": math.nan})]), "weights"),
    ("Score", rpb.ScoreRequest(items=[_item()], timeout_s=-1), "timeout_s"),
    ("Score", rpb.ScoreRequest(items=[_item(id="i" * 10_000)]), "id"),
    ("VerifyMath", rpb.VerifyMathRequest(answer="1", gold="1", timeout_s=math.inf), "timeout_s"),
    ("Execute", rpb.ExecuteRequest(language="cobol", code="x"), "language"),
    ("Execute", rpb.ExecuteRequest(code="print(1)", memory_mb=1), "memory_mb"),
    ("VerifyCode", rpb.VerifyCodeRequest(code="x"), "tests"),
    ("VerifyCode", rpb.VerifyCodeRequest(code="x", tests=[rpb.CodeTest()]), "tests"),
]


@pytest.mark.parametrize(("method", "request_msg", "names"), BAD_REWARD_CALLS)
def test_wrong_field_values_are_invalid_argument(tight_reward: Any, method: str, request_msg: Any, names: str) -> None:
    with grpc.insecure_channel(tight_reward.grpc_addr) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            getattr(stub, method)(request_msg, timeout=20)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert names in info.value.details(), info.value.details()  # the message names what to fix


def test_huge_but_legal_message_is_refused_cleanly(tight_reward: Any) -> None:
    """A 40 MB completion fits gRPC's limit but not the service's text limit: INVALID_ARGUMENT, fast."""
    request = rpb.ScoreRequest(items=[_item(completion="9" * (40 << 20))])
    with (
        grpc.insecure_channel(tight_reward.grpc_addr, options=[("grpc.max_send_message_length", 64 << 20)]) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        reward_pb2_grpc.RewardServiceStub(channel).Score(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "completion" in info.value.details()
    assert _serving(tight_reward.grpc_addr)


@pytest.mark.parametrize("payload", GARBAGE, ids=["ff", "bad-varint", "bad-field", "all-bytes"])
def test_garbage_bytes_to_every_rollout_method(rollout: RolloutProc, payload: bytes) -> None:
    for method in ROLLOUT_UNARY:
        err = _raw_unary(rollout.address, f"/grpo.v1.RolloutService/{method}", payload)
        assert err.code() in UNDECODABLE, (method, err.code(), err.details())
    with grpc.insecure_channel(rollout.address) as channel:
        upload = channel.stream_unary("/grpo.v1.RolloutService/UpdateWeights")
        with pytest.raises(grpc.RpcError) as info:
            upload(iter([payload, payload]), timeout=20)
        assert info.value.code() in UNDECODABLE | {grpc.StatusCode.FAILED_PRECONDITION}
    assert rollout.proc.poll() is None
    assert _serving(rollout.address)


def test_rollout_survives_malformed_then_serves(rollout: RolloutProc) -> None:
    with grpc.insecure_channel(rollout.address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        bad = [
            pb.GenerateRequest(),  # nothing at all
            pb.GenerateRequest(prompts=[pb.Prompt(text="hi")]),  # no sampling params
            pb.GenerateRequest(
                prompts=[pb.Prompt(messages=pb.Messages())], sampling=pb.SamplingParams(n=1, max_new_tokens=2)
            ),
            pb.GenerateRequest(
                prompts=[pb.Prompt(text="hi")], sampling=pb.SamplingParams(n=1, max_new_tokens=2, stop=[""])
            ),
            pb.GenerateRequest(
                prompts=[pb.Prompt(text="hi")] * 100_000, sampling=pb.SamplingParams(n=1, max_new_tokens=2)
            ),
            pb.GenerateRequest(
                prompts=[pb.Prompt(text="hi")], sampling=pb.SamplingParams(n=1, max_new_tokens=2**31 - 1)
            ),
        ]
        for request in bad:
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(request, timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            stub.UpdateWeights(iter([]), timeout=30)  # an empty stream: nothing to load
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        ok = stub.Generate(
            pb.GenerateRequest(prompts=[pb.Prompt(text="2 + 2 =")], sampling=pb.SamplingParams(n=1, max_new_tokens=3)),
            timeout=60,
        )
        assert len(ok.results[0].completions[0].token_ids) >= 1
    assert Path(f"/proc/{rollout.proc.pid}").exists()
