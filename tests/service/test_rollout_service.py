"""The rollout service as a real process: Generate, UpdateWeights, GetStatus, health, reflection, auth."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from grpo.common.net import free_port
from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.weights.codec import iter_weight_chunks, make_header, tensor_bytes, weights_checksum
from grpo.common.weights.data_port import DATA_TOKEN_KEY, MAX_WAITING, connect, new_token
from grpo.v1 import rollout_pb2 as pb
from grpo.v1 import rollout_pb2_grpc as pb_grpc
from tests.support.rollout_proc import RolloutProc, perturbed, start_rollout_service, update_bytes
from tests.support.weight_push import push_weights

GREEDY = pb.SamplingParams(n=1, temperature=0, max_new_tokens=12)
PROMPTS = [pb.Prompt(text="What is 3 + 4?", apply_chat_template=True), pb.Prompt(text="Ana has 5 pens.")]


def _greedy(stub: pb_grpc.RolloutServiceStub) -> list[list[int]]:
    reply = stub.Generate(pb.GenerateRequest(prompts=PROMPTS, sampling=GREEDY), timeout=60)
    return [list(c.token_ids) for r in reply.results for c in r.completions]


def _version(stub: pb_grpc.RolloutServiceStub) -> int:
    return stub.GetStatus(pb.GetStatusRequest(), timeout=10).weight_version


def test_generate_returns_n_completions_at_version_0(
    stub: pb_grpc.RolloutServiceStub, weights: dict[str, torch.Tensor]
) -> None:
    sampling = pb.SamplingParams(n=3, temperature=1.0, top_p=0.95, max_new_tokens=16, seed=1)
    reply = stub.Generate(pb.GenerateRequest(prompts=PROMPTS, sampling=sampling), timeout=60)
    assert reply.weight_version == 0
    # Version 0 reports the checksum the trainer computes from the same weights.
    assert reply.weight_checksum == weights_checksum(weights)
    assert len(reply.results) == 2
    for result in reply.results:
        assert len(result.completions) == 3
        for c in result.completions:
            assert 1 <= len(c.token_ids) <= 16 and len(c.logprobs) == len(c.token_ids)
            assert c.finish_reason in ("stop", "length") and all(lp <= 0 for lp in c.logprobs)
    again = stub.Generate(pb.GenerateRequest(prompts=PROMPTS, sampling=sampling), timeout=60)
    assert [list(c.token_ids) for c in again.results[0].completions] == [
        list(c.token_ids) for c in reply.results[0].completions
    ]


def test_chat_messages_use_the_chat_template(stub: pb_grpc.RolloutServiceStub) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    messages = [pb.ChatMessage(role="system", content="Be brief."), pb.ChatMessage(role="user", content="2 + 2?")]
    prompt = pb.Prompt(messages=pb.Messages(messages=messages))
    reply = stub.Generate(pb.GenerateRequest(prompts=[prompt], sampling=GREEDY), timeout=60)
    text = tok.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True, tokenize=False
    )
    assert list(reply.results[0].prompt_token_ids) == tok.encode(text, add_special_tokens=False)


def test_generate_continues_a_begun_answer(stub: pb_grpc.RolloutServiceStub) -> None:
    """prefix_token_ids: the completion tokens so far follow the prompt; what comes back is the continuation, with
    the log-probs the full answer's tokens had (greedy, the same weights: the same tokens)."""
    full = stub.Generate(pb.GenerateRequest(prompts=PROMPTS[:1], sampling=GREEDY), timeout=60).results[0]
    (answer,) = full.completions
    ids = list(answer.token_ids)
    assert len(ids) == GREEDY.max_new_tokens  # the tiny model does not stop early here, so there is a rest to match
    begun = pb.Prompt(text=PROMPTS[0].text, apply_chat_template=True, prefix_token_ids=ids[:5])
    rest = pb.SamplingParams(n=2, temperature=0, max_new_tokens=len(ids) - 5)
    reply = stub.Generate(pb.GenerateRequest(prompts=[begun], sampling=rest), timeout=60).results[0]
    assert list(reply.prompt_token_ids) == [*full.prompt_token_ids, *ids[:5]]
    for c in reply.completions:
        assert list(c.token_ids) == ids[5:]
        assert list(c.logprobs) == pytest.approx(list(answer.logprobs)[5:], abs=1e-4)
    bad = pb.Prompt(text="2 + 2?", prefix_token_ids=[10**9])
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(pb.GenerateRequest(prompts=[bad], sampling=GREEDY), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prefix_token_ids has 1000000000, not a token id of this model" in info.value.details()


@pytest.mark.parametrize(
    ("prompts", "sampling", "message"),
    [
        (PROMPTS, pb.SamplingParams(n=0, max_new_tokens=4), "sampling.n must be >= 1"),
        ([], GREEDY, "prompts is empty"),
        ([pb.Prompt(text="")], GREEDY, "prompts[0] is empty"),
        ([pb.Prompt(text="1 2 3 " * 200)], GREEDY, "exceeds the model context of 512 tokens"),
        (PROMPTS, pb.SamplingParams(n=1, top_p=2, max_new_tokens=4), "top_p must be in (0, 1]"),
        (PROMPTS, pb.SamplingParams(n=1, temperature=-1, max_new_tokens=4), "temperature must be a finite number >= 0"),
        (PROMPTS, pb.SamplingParams(n=1, max_new_tokens=0), "max_new_tokens must be >= 1"),
        (PROMPTS, pb.SamplingParams(n=1000, max_new_tokens=4), "over this replica's limit"),
    ],
)
def test_bad_requests_are_invalid_argument(
    stub: pb_grpc.RolloutServiceStub, prompts: list, sampling: pb.SamplingParams, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(pb.GenerateRequest(prompts=prompts, sampling=sampling), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_a_temperature_or_top_p_too_small_for_float32_is_invalid_argument(
    stub: pb_grpc.RolloutServiceStub, field: str
) -> None:
    """1e-300 is > 0, but 0 in the float32 sampler: it used to fail inside torch with UNKNOWN and a traceback."""
    prompts = [pb.Prompt(text="hi")]
    sampled = {"temperature": 1.0}  # top_p acts only when sampling (temperature 0 is greedy)
    tiny = pb.SamplingParams(n=1, max_new_tokens=4, seed=1, **{**sampled, field: 1e-300})
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(pb.GenerateRequest(prompts=prompts, sampling=tiny), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"sampling.{field} 1e-300 is too small to sample with" in info.value.details()
    # The smallest value taken samples (the top token, at this size).
    smallest = pb.SamplingParams(n=1, max_new_tokens=4, seed=1, **{**sampled, field: 1e-30})
    reply = stub.Generate(pb.GenerateRequest(prompts=prompts, sampling=smallest), timeout=60)
    assert len(reply.results[0].completions[0].token_ids) >= 1


@pytest.mark.parametrize("transport", ["data_port", "grpc_stream"])
def test_update_weights_changes_outputs_version_and_checksum(
    rollout: RolloutProc,
    stub: pb_grpc.RolloutServiceStub,
    weights: dict[str, torch.Tensor],
    transport: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _greedy(stub)
    version = _version(stub) + 1
    new = perturbed(weights, seed=version)
    data_port = rollout.data_port if transport == "data_port" else 0
    via = "data_port" if data_port else "stream"
    bytes_before = update_bytes(rollout, via)
    reply = push_weights(rollout.address, new, version, timeout_s=60, chunk_bytes=64 * 1024, data_port=data_port)
    assert "sending the weights over gRPC" not in caplog.text
    assert update_bytes(rollout, via) - bytes_before == sum(t.numel() * 4 for t in new.values())
    assert (reply.version, reply.checksum) == (version, weights_checksum(new))
    assert reply.receive_s >= 0 and reply.apply_s >= 0
    assert _greedy(stub) != before
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert (status.weight_version, status.weight_checksum) == (version, reply.checksum)
    assert status.weights_data_port == rollout.data_port
    assert status.engine == "hf" and status.tokens_generated > 0
    generated = stub.Generate(pb.GenerateRequest(prompts=PROMPTS[:1], sampling=GREEDY), timeout=60)
    assert (generated.weight_version, generated.weight_checksum) == (version, reply.checksum)
    assert (rollout.healthz()["weight_version"], rollout.healthz()["weight_checksum"]) == (version, reply.checksum)


def test_bf16_replica_takes_fp32_weights(tmp_path: Path, weights: dict[str, torch.Tensor]) -> None:
    """The GPU setup: an fp32 trainer pushes to a bf16 replica, which casts on apply."""
    proc = start_rollout_service("--dtype", "bfloat16", log_dir=tmp_path)
    try:
        with grpc.insecure_channel(proc.address) as channel:
            stub = pb_grpc.RolloutServiceStub(channel)
            original = _greedy(stub)
            new = perturbed(weights, seed=77)
            reply = push_weights(proc.address, new, 1, timeout_s=60)
            assert (reply.version, reply.checksum) == (1, weights_checksum(new))
            assert _greedy(stub) != original
            # The fp32 originals, cast on apply, are exactly the bf16 weights the replica started with.
            push_weights(proc.address, weights, 2, timeout_s=60)
            assert _greedy(stub) == original
            assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).weight_version == 2
    finally:
        assert proc.stop() == 0, proc.log_text()[-2000:]


def _chunks_with(weights: dict[str, torch.Tensor], version: int, how: str) -> list[pb.WeightChunk]:
    chunks = list(iter_weight_chunks(weights, version, chunk_bytes=64 * 1024))
    if how == "corrupt":
        data = bytearray(chunks[3].data)
        data[100] ^= 0x01
        chunks[3] = pb.WeightChunk(data=bytes(data))
    elif how == "truncate":
        chunks = chunks[:-1]
    elif how == "oversize":
        chunks.append(pb.WeightChunk(data=b"\0" * 8))
    elif how == "no_header":
        chunks = chunks[1:]
    return chunks


@pytest.mark.parametrize(
    ("how", "code", "message"),
    [
        ("corrupt", grpc.StatusCode.INVALID_ARGUMENT, "sha256 mismatch"),
        ("truncate", grpc.StatusCode.INVALID_ARGUMENT, "truncated"),
        ("oversize", grpc.StatusCode.INVALID_ARGUMENT, "longer than"),
        ("no_header", grpc.StatusCode.INVALID_ARGUMENT, "before the header"),
        ("wrong_shape", grpc.StatusCode.INVALID_ARGUMENT, "model.norm.weight: got shape [64]"),
        ("old_version", grpc.StatusCode.FAILED_PRECONDITION, "not newer than the loaded version"),
    ],
)
def test_bad_weight_streams_are_rejected_and_old_weights_serve(
    stub: pb_grpc.RolloutServiceStub, weights: dict[str, torch.Tensor], how: str, code: grpc.StatusCode, message: str
) -> None:
    before, loaded = _greedy(stub), stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    new = perturbed(weights, seed=1000)
    version = loaded.weight_version + 1
    if how == "wrong_shape":
        new["model.norm.weight"] = torch.ones(64)
    if how == "old_version":
        version = loaded.weight_version
    with pytest.raises(grpc.RpcError) as info:
        stub.UpdateWeights(iter(_chunks_with(new, version, how)), timeout=60)
    assert info.value.code() == code, info.value.details()
    assert message in info.value.details() and "keeps serving" in info.value.details()
    after = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert (after.weight_version, after.weight_checksum) == (loaded.weight_version, loaded.weight_checksum)
    assert _greedy(stub) == before


def _push_over_data_port(
    rollout: RolloutProc, stub: pb_grpc.RolloutServiceStub, new: dict[str, torch.Tensor], version: int, how: str
) -> None:
    """An update whose bytes go to the data port, spoiled as `how` says; raises the reply's RpcError."""
    token = new_token()
    data = bytearray(b"".join(tensor_bytes(new[n]) for n in sorted(new)))
    announced = {"oversize": len(data) * 3, "size_mismatch": len(data) - 8}.get(how, len(data))
    conn = connect("127.0.0.1", rollout.data_port, token, announced)
    assert conn is not None
    with conn:
        messages = [pb.WeightChunk(header=make_header(new, version))]
        if how == "data_in_stream":
            messages.append(pb.WeightChunk(data=b"\0" * 8))
        call = stub.UpdateWeights.future(iter(messages), timeout=60, metadata=[(DATA_TOKEN_KEY, token)])
        if how == "corrupt":
            data[5000] ^= 0x01
        elif how == "truncate":
            del data[-100:]
        elif how == "longer":
            data += b"\0" * 8
        elif how == "size_mismatch":
            del data[-8:]
        try:
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the replica rejected the header and closed the connection: the reply says why
        call.result()


@pytest.mark.parametrize(
    ("how", "code", "message"),
    [
        ("corrupt", grpc.StatusCode.INVALID_ARGUMENT, "sha256 mismatch"),
        ("truncate", grpc.StatusCode.INVALID_ARGUMENT, "truncated"),
        ("longer", grpc.StatusCode.INVALID_ARGUMENT, "longer than the byte count it announced"),
        ("oversize", grpc.StatusCode.INVALID_ARGUMENT, "this model's weights are 1 to"),
        ("size_mismatch", grpc.StatusCode.INVALID_ARGUMENT, "bytes sent to the data port"),
        ("data_in_stream", grpc.StatusCode.INVALID_ARGUMENT, "the stream must hold only the header"),
        ("old_version", grpc.StatusCode.FAILED_PRECONDITION, "not newer than the loaded version"),
    ],
)
def test_bad_data_port_updates_are_rejected_and_old_weights_serve(
    rollout: RolloutProc,
    stub: pb_grpc.RolloutServiceStub,
    weights: dict[str, torch.Tensor],
    how: str,
    code: grpc.StatusCode,
    message: str,
) -> None:
    before, loaded = _greedy(stub), stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    version = loaded.weight_version if how == "old_version" else loaded.weight_version + 1
    with pytest.raises(grpc.RpcError) as info:
        _push_over_data_port(rollout, stub, perturbed(weights, seed=2000), version, how)
    assert info.value.code() == code, info.value.details()
    assert message in info.value.details() and "keeps serving" in info.value.details()
    after = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert (after.weight_version, after.weight_checksum) == (loaded.weight_version, loaded.weight_checksum)
    assert _greedy(stub) == before
    # The replica is not left waiting on the spoiled update: the next one goes through at once.
    good = perturbed(weights, seed=2001)
    reply = push_weights(rollout.address, good, loaded.weight_version + 1, timeout_s=60, data_port=rollout.data_port)
    assert reply.checksum == weights_checksum(good)


def test_a_malformed_data_token_is_invalid_argument(
    stub: pb_grpc.RolloutServiceStub, weights: dict[str, torch.Tensor]
) -> None:
    header = pb.WeightChunk(header=make_header(weights, _version(stub) + 1))
    with pytest.raises(grpc.RpcError) as info:
        stub.UpdateWeights(iter([header]), timeout=30, metadata=[(DATA_TOKEN_KEY, "not-a-token")])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "grpo-data-token metadata must be 64 lowercase hex characters" in info.value.details()


def test_without_a_data_port_updates_come_in_the_stream(
    tmp_path: Path, weights: dict[str, torch.Tensor], caplog: pytest.LogCaptureFixture
) -> None:
    proc = start_rollout_service("--weights-data-port", "-1", log_dir=tmp_path)
    try:
        with grpc.insecure_channel(proc.address) as channel:
            stub = pb_grpc.RolloutServiceStub(channel)
            assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).weights_data_port == 0
            # A pusher told of a port that does not answer falls back to the stream, and says so.
            new = perturbed(weights, seed=5)
            reply = push_weights(proc.address, new, 1, timeout_s=60, data_port=free_port())
            assert (reply.version, reply.checksum) == (1, weights_checksum(new))
            assert "unreachable" in caplog.text and "sending the weights over gRPC" in caplog.text
            # A call that asks for the data port anyway is refused with the reason.
            header = pb.WeightChunk(header=make_header(new, 2))
            with pytest.raises(grpc.RpcError) as info:
                stub.UpdateWeights(iter([header]), timeout=30, metadata=[(DATA_TOKEN_KEY, new_token())])
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "no weights data port" in info.value.details()
    finally:
        assert proc.stop() == 0, proc.log_text()[-2000:]


def test_health_reflection_and_metrics(rollout: RolloutProc) -> None:
    with grpc.insecure_channel(rollout.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service="grpo.v1.RolloutService"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
        assert "grpo.v1.RolloutService" in services
    assert rollout.healthz()["status"] == "ok"
    with urllib.request.urlopen(f"http://127.0.0.1:{rollout.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "grpo_rollout_generated_tokens_total" in text and "grpo_rollout_weight_version" in text


def test_weights_token_guards_only_update_weights(tmp_path: Path, weights: dict[str, torch.Tensor]) -> None:
    proc = start_rollout_service("--weights-token", "s3cret", log_dir=tmp_path)
    try:
        with grpc.insecure_channel(proc.address) as channel:
            stub = pb_grpc.RolloutServiceStub(channel)
            assert len(_greedy(stub)) == 2  # Generate stays open
            with pytest.raises(grpc.RpcError) as info:
                push_weights(proc.address, weights, 1, timeout_s=30)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as info:
                push_weights(proc.address, weights, 1, token="wrong", timeout_s=30)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert push_weights(proc.address, weights, 1, token="s3cret", timeout_s=30).version == 1
            assert _version(stub) == 1
    finally:
        assert proc.stop() == 0, proc.log_text()[-2000:]


@pytest.mark.slow  # the replica waits out its 30 s hello timeout before it says the connection never came
def test_a_push_the_full_data_port_refuses_goes_over_the_stream(
    rollout: RolloutProc, stub: pb_grpc.RolloutServiceStub, weights: dict[str, torch.Tensor]
) -> None:
    loaded = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    silent = [socket.create_connection(("127.0.0.1", rollout.data_port)) for _ in range(MAX_WAITING)]  # every slot
    new, streamed = perturbed(weights, seed=3000), update_bytes(rollout, "stream")
    try:
        time.sleep(0.3)  # all accepted: the pusher's connection is accepted, then closed
        reply = push_weights(rollout.address, new, loaded.weight_version + 1, timeout_s=90, data_port=rollout.data_port)
    finally:
        for conn in silent:
            conn.close()
    assert reply.checksum == weights_checksum(new)
    assert update_bytes(rollout, "stream") - streamed == sum(t.numel() * t.element_size() for t in new.values())
