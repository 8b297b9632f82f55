"""Weight streams that never finish: the pusher dies mid-stream, or stalls (slow loris). Old weights keep serving."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.weights.codec import iter_weight_chunks, model_weights, weights_checksum
from grpo.v1 import rollout_pb2 as pb
from grpo.v1 import rollout_pb2_grpc as pb_grpc
from tests.support.rollout_proc import RolloutProc, start_rollout_service
from tests.support.weight_push import push_weights

pytestmark = pytest.mark.faults

GREEDY = pb.SamplingParams(n=1, temperature=0, max_new_tokens=8)


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutProc]:
    proc = start_rollout_service(log_dir=tmp_path_factory.mktemp("rollout"))
    yield proc
    assert proc.stop() == 0, proc.log_text()[-2000:]


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model())
    return {k: v.detach().clone() for k, v in model_weights(model).items()}


def _perturbed(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in weights.items()}


def _state(address: str) -> tuple[int, str, list[int]]:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.RolloutServiceStub(channel)
        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        reply = stub.Generate(pb.GenerateRequest(prompts=[pb.Prompt(text="3 + 4 =")], sampling=GREEDY), timeout=60)
    return status.weight_version, status.weight_checksum, list(reply.results[0].completions[0].token_ids)


PUSHER = textwrap.dedent(
    """
    import os, sys, time, grpc, torch
    from grpo.common.weights.codec import iter_weight_chunks, model_weights
    from grpo.v1 import rollout_pb2_grpc
    from transformers import AutoModelForCausalLM
    from grpo.common.tiny_model import ensure_tiny_model
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model())
    tensors = {k: v.detach() + 0.1 for k, v in model_weights(model).items()}
    address, version, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]

    def chunks():
        for i, chunk in enumerate(iter_weight_chunks(tensors, version, chunk_bytes=64 * 1024)):
            yield chunk
            if i == 5:
                print("mid-stream", flush=True)
                if mode == "die":
                    os.kill(os.getpid(), 9)
                time.sleep(3600)  # stall: neither finish nor close

    stub = rollout_pb2_grpc.RolloutServiceStub(grpc.insecure_channel(address))
    stub.UpdateWeights(chunks())  # no deadline: the server must not rely on the client's
    """
)


# The same over the weights data port: the header on gRPC, then half the bytes on the socket.
DATA_PUSHER = textwrap.dedent(
    """
    import os, sys, time, grpc
    from grpo.common.tiny_model import ensure_tiny_model
    from grpo.common.weights.data_port import DATA_TOKEN_KEY, connect, new_token
    from grpo.common.weights.codec import make_header, model_weights, tensor_bytes
    from grpo.v1 import rollout_pb2, rollout_pb2_grpc
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model())
    tensors = {k: v.detach() + 0.1 for k, v in model_weights(model).items()}
    address, version, mode, port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    token = new_token()
    data = b"".join(tensor_bytes(tensors[n]) for n in sorted(tensors))
    conn = connect("127.0.0.1", port, token, len(data))
    header = rollout_pb2.WeightChunk(header=make_header(tensors, version))
    stub = rollout_pb2_grpc.RolloutServiceStub(grpc.insecure_channel(address))
    call = stub.UpdateWeights.future(iter([header]), metadata=[(DATA_TOKEN_KEY, token)])  # no deadline
    conn.sendall(data[: len(data) // 2])
    time.sleep(0.5)
    print("mid-stream", flush=True)
    if mode == "die":
        os.kill(os.getpid(), 9)
    try:
        call.result()  # stall: the socket stays open, nothing more is sent
    except grpc.RpcError as exc:
        print(exc.code().name, exc.details(), file=sys.stderr, flush=True)
        sys.exit(1)
    """
)


def _start_pusher(address: str, version: int, mode: str, data_port: int = 0) -> subprocess.Popen[str]:
    """A pusher process that sends half of a version's stream (or data-port bytes), then dies or stalls."""
    script, args = (DATA_PUSHER, [str(data_port)]) if data_port else (PUSHER, [])
    cmd = [sys.executable, "-c", script, address, str(version), mode, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _mid_stream(proc: subprocess.Popen[str]) -> subprocess.Popen[str]:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the stream is half sent
    assert line.strip() == "mid-stream", line
    return proc


def _pusher(address: str, version: int, mode: str, data_port: int = 0) -> subprocess.Popen[str]:
    return _mid_stream(_start_pusher(address, version, mode, data_port))


@pytest.mark.parametrize("via", ["stream", "data_port"])
def test_pusher_killed_mid_stream_leaves_old_weights(
    rollout: RolloutProc, weights: dict[str, torch.Tensor], via: str
) -> None:
    version, checksum, tokens = _state(rollout.address)
    pusher = _pusher(rollout.address, version + 1, "die", rollout.data_port if via == "data_port" else 0)
    assert pusher.wait(30) == -9
    time.sleep(0.5)
    assert _state(rollout.address) == (version, checksum, tokens)
    # The replica is not wedged: the next, complete push is accepted at once.
    new = _perturbed(weights, seed=7)
    started = time.monotonic()
    reply = push_weights(rollout.address, new, version + 1, timeout_s=60, data_port=rollout.data_port)
    assert (reply.version, reply.checksum) == (version + 1, weights_checksum(new))
    assert time.monotonic() - started < 30


def test_stalled_pusher_with_a_deadline_is_cut_off(rollout: RolloutProc, weights: dict[str, torch.Tensor]) -> None:
    version, checksum, tokens = _state(rollout.address)
    chunks = list(iter_weight_chunks(_perturbed(weights, seed=8), version + 1, chunk_bytes=64 * 1024))

    def stalling() -> Iterator[pb.WeightChunk]:
        yield from chunks[:5]
        time.sleep(6)  # past the 2 s deadline below

    with grpc.insecure_channel(rollout.address) as channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.RolloutServiceStub(channel).UpdateWeights(stalling(), timeout=2)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 10
    assert _state(rollout.address) == (version, checksum, tokens)  # generation kept serving throughout
    reply = push_weights(rollout.address, _perturbed(weights, seed=9), version + 1, timeout_s=60)
    assert reply.version == version + 1


def test_slow_loris_without_deadline_does_not_wedge_updates(
    rollout: RolloutProc, weights: dict[str, torch.Tensor]
) -> None:
    """A pusher that sends half a stream, sets no deadline and then never sends or closes."""
    version, checksum, tokens = _state(rollout.address)
    loris = _pusher(rollout.address, version + 1, "stall")
    try:
        assert _state(rollout.address) == (version, checksum, tokens)  # Generate is not blocked by it
        # A legitimate push must get through (or be told to retry) within its own deadline, not hang behind the loris.
        reply = push_weights(rollout.address, _perturbed(weights, seed=10), version + 1, timeout_s=20)
        assert reply.version == version + 1
    finally:
        loris.kill()
        loris.wait(10)


def test_server_cuts_off_stalled_streams_at_its_limit(tmp_path: Path, weights: dict[str, torch.Tensor]) -> None:
    """Two stalled pushers fill the receive slots: a third push is told to retry (ABORTED), never left hanging;
    the server cancels both at `weights_stream_timeout_s`, and the next push is applied."""
    limit = 8.0
    rollout = start_rollout_service("--weights-stream-timeout-s", str(limit), log_dir=tmp_path)
    lorises: list[subprocess.Popen[str]] = []
    try:
        version, checksum, tokens = _state(rollout.address)
        # Started together, so both stall within a second or two of each other.
        lorises = [_start_pusher(rollout.address, version + 1, "stall") for _ in range(2)]
        for loris in lorises:
            _mid_stream(loris)
        stalled = time.monotonic()
        time.sleep(0.5)  # both streams are open on the server
        with pytest.raises(grpc.RpcError) as info:
            push_weights(rollout.address, _perturbed(weights, seed=11), version + 1, timeout_s=20)
        assert info.value.code() == grpc.StatusCode.ABORTED, info.value
        assert "already being received" in info.value.details()
        assert time.monotonic() - stalled < limit - 1  # answered at once, not after the stalls ended
        for loris in lorises:
            _, err = loris.communicate(timeout=limit + 20)
            assert loris.returncode != 0 and "CANCELLED" in err, err[-1500:]
        assert time.monotonic() - stalled < limit + 10
        assert _state(rollout.address) == (version, checksum, tokens)  # the partial streams were dropped
        reply = push_weights(rollout.address, _perturbed(weights, seed=12), version + 1, timeout_s=20)
        assert reply.version == version + 1
        assert "not finished within 8s: cancelling it" in rollout.log_text()
    finally:
        for loris in lorises:
            loris.kill()
            loris.wait(10)
        assert rollout.stop() == 0, rollout.log_text()[-2000:]


def test_server_cuts_off_a_stalled_data_port_sender_at_its_limit(
    tmp_path: Path, weights: dict[str, torch.Tensor]
) -> None:
    """Half the bytes on the data port, then silence with the socket open: rejected at weights_stream_timeout_s,
    while other pushes go through; the old weights serve until a complete push."""
    limit = 6.0
    rollout = start_rollout_service("--weights-stream-timeout-s", str(limit), log_dir=tmp_path)
    try:
        version, checksum, tokens = _state(rollout.address)
        loris = _pusher(rollout.address, version + 1, "stall", rollout.data_port)
        stalled = time.monotonic()
        assert _state(rollout.address) == (version, checksum, tokens)  # Generate is not blocked by it
        _, err = loris.communicate(timeout=limit + 20)
        # Cut off by the stream limit (CANCELLED) or the data deadline, which fall at the same time.
        assert loris.returncode == 1 and ("CANCELLED" in err or "did not arrive in time" in err), err[-1500:]
        assert time.monotonic() - stalled < limit + 10
        assert _state(rollout.address) == (version, checksum, tokens)
        reply = push_weights(
            rollout.address, _perturbed(weights, seed=13), version + 1, timeout_s=20, data_port=rollout.data_port
        )
        assert reply.version == version + 1
    finally:
        assert rollout.stop() == 0, rollout.log_text()[-2000:]
