"""Rollout benchmarks, each against a reference measured in the same run → bench/results/rollout.json.

(a) tokens/s through gRPC Generate vs the same engine in-process (target >= 0.9x);
(b) UpdateWeights of a ~200 MB model vs safetensors save + load + copy through /dev/shm (target <= 2x),
    per replica and end to end (with the sender's sha256), with the bytes on the weights data port (the
    default) and in the gRPC stream (the fallback), next to a bare gRPC stream of the same bytes;
(c) how long a Generate waits while an update is applied.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.weights.codec import iter_wire_messages, model_weights, weights_checksum
from grpo.local.services import start_rollout
from grpo.rollout.engines.base import SamplingParams
from grpo.rollout.engines.hf import HFEngine
from grpo.v1 import rollout_pb2 as pb
from grpo.v1 import rollout_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
# A script's path starts at bench/: push_weights and the certificate helper live in tests/.
sys.path.insert(0, str(ROOT))
from tests.support.weight_push import push_weights  # noqa: E402

log = logging.getLogger("bench_rollout")
# ~50M parameters (~200 MB in fp32) with the tiny model's tokenizer.
BIG = {"hidden_size": 512, "num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 4}
BIG |= {"intermediate_size": 2048}
QUESTIONS = [f"What is {a} + {b}?" for a, b in [(3, 4), (12, 30), (7, 8), (51, 9), (2, 2), (40, 17), (66, 5), (1, 99)]]


def throughput(log_dir: Path, reps: int) -> dict:
    """(a) the same requests through the service and through an in-process engine, interleaved."""
    path = str(ensure_tiny_model())
    engine = HFEngine(path, torch_threads=1)
    sampling = pb.SamplingParams(n=16, temperature=1.0, max_new_tokens=64, seed=0)
    params = SamplingParams(n=16, temperature=1.0, max_new_tokens=64, seed=0)
    prompts = [pb.Prompt(text=q, apply_chat_template=True) for q in QUESTIONS]
    proc = start_rollout("--model", path, log_dir=log_dir)
    try:
        with grpc.insecure_channel(proc.address) as channel:
            stub = pb_grpc.RolloutServiceStub(channel)
            reply = stub.Generate(pb.GenerateRequest(prompts=prompts, sampling=sampling), timeout=300)
            ids = [list(r.prompt_token_ids) for r in reply.results]
            engine.generate(ids, params)  # warm-up
            service_rates, local_rates = [], []
            for _ in range(reps):
                start = time.perf_counter()
                reply = stub.Generate(pb.GenerateRequest(prompts=prompts, sampling=sampling), timeout=300)
                tokens = sum(len(c.token_ids) for r in reply.results for c in r.completions)
                service_rates.append(tokens / (time.perf_counter() - start))
                start = time.perf_counter()
                out = engine.generate(ids, params)
                local = sum(len(s.token_ids) for o in out for s in o.samples)
                local_rates.append(local / (time.perf_counter() - start))
                assert local == tokens, "same seed, same engine: the same tokens"
    finally:
        proc.stop()
    service, local = statistics.median(service_rates), statistics.median(local_rates)
    return {
        "workload": "8 prompts x n=16 x <=64 new tokens, tiny model fp32, 1 torch thread",
        "tokens_per_request": tokens,
        "service_tokens_per_s": round(service, 1),
        "in_process_tokens_per_s": round(local, 1),
        "ratio": round(service / local, 3),
        "target": ">= 0.9",
        "ok": service / local >= 0.9,
    }


def reference_reload(tensors: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> float:
    """safetensors save to /dev/shm, load, copy into the live tensors: the in-process baseline."""
    from safetensors.torch import load_file, save_file

    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    file = shm / f"grpo-bench-{time.time_ns()}.safetensors"
    start = time.perf_counter()
    try:
        save_file(tensors, str(file))
        loaded = load_file(str(file))
        with torch.no_grad():
            for name, t in loaded.items():
                target[name].copy_(t)
    finally:
        file.unlink(missing_ok=True)
    return time.perf_counter() - start


def bare_grpc_stream(tensors: dict[str, torch.Tensor], reps: int) -> float:
    """The transport floor: the same wire messages through a bare gRPC handler that only counts them."""
    from concurrent import futures

    received = []

    def count(messages: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        received.append(sum(len(m) for m in messages))
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(2), options=[("grpc.max_receive_message_length", 64 << 20)])
    handler = grpc.stream_unary_rpc_method_handler(count)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Bare", {"Stream": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    checksum = weights_checksum(tensors)
    times = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = channel.stream_unary("/bench.Bare/Stream")
            for _ in range(reps):
                start = time.perf_counter()
                stream(iter_wire_messages(tensors, 1, checksum=checksum), timeout=300)
                times.append(time.perf_counter() - start)
    finally:
        server.stop(0)
    return statistics.median(times)


def weight_updates(log_dir: Path, reps: int) -> tuple[dict, dict]:
    """(b) UpdateWeights vs the /dev/shm reload, and (c) the pause it causes to Generate.

    Each repetition pushes a new version three times. End to end: push_weights as it is, the
    pusher computing the sha256 while the bytes go out over the data port. Per replica: the
    same with the checksum already known (the trainer hashes a version once for all replicas).
    The gRPC stream fallback: the header (hence the hash) must go first, so its end-to-end time
    is the hash plus the push. The first update is reported on its own: it also maps the
    replica's staging buffer.
    """
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model(**BIG)
    model = AutoModelForCausalLM.from_pretrained(path)
    live = model_weights(model)
    params = sum(t.numel() for t in live.values())
    size = sum(t.numel() * t.element_size() for t in live.values())
    proc = start_rollout("--model", str(path), log_dir=log_dir)
    ref_s, replies, checksum_s, replica_s, grpc_s, end_to_end_s = [], [], [], [], [], []
    try:
        new = {k: v + 0.01 for k, v in live.items()}
        first = time.perf_counter()
        push_weights(proc.address, new, 1, timeout_s=300, data_port=proc.data_port)
        first_s = time.perf_counter() - first
        for rep in range(reps):
            version = 3 * rep + 2
            new = {k: v + 0.01 * version for k, v in live.items()}
            start = time.perf_counter()  # end to end: the pusher hashes the new version as it sends it
            push_weights(proc.address, new, version, timeout_s=300, data_port=proc.data_port)
            end_to_end_s.append(time.perf_counter() - start)
            version += 1
            start = time.perf_counter()
            checksum = weights_checksum(new)
            hashed = time.perf_counter()
            replies.append(
                push_weights(proc.address, new, version, timeout_s=300, checksum=checksum, data_port=proc.data_port)
            )
            checksum_s.append(hashed - start)
            replica_s.append(time.perf_counter() - hashed)
            start = time.perf_counter()
            push_weights(proc.address, new, version + 1, timeout_s=300, checksum=checksum)
            grpc_s.append(time.perf_counter() - start)
            ref_s.append(reference_reload(new, {k: v.clone() for k, v in live.items()}))
        pause = generation_pause(proc.address, live, 3 * reps + 2, proc.data_port)
    finally:
        proc.stop()
    bare = bare_grpc_stream(live, reps)
    tls = tls_updates(path, live, log_dir, reps)
    ref, replica, sha = statistics.median(ref_s), statistics.median(replica_s), statistics.median(checksum_s)
    end_to_end = statistics.median(end_to_end_s)
    grpc_end_to_end = statistics.median(c + g for c, g in zip(checksum_s, grpc_s, strict=True))
    update = {
        "params": params,
        "bytes": size,
        "reference_shm_save_load_copy_s": round(ref, 4),
        "end_to_end_s": round(end_to_end, 4),
        "end_to_end_ratio": round(end_to_end / ref, 3),
        "target": "<= 2.0",
        "ok": end_to_end / ref <= 2.0,
        "sender_sha256_s": round(sha, 4),
        "per_replica_update_s": round(replica, 4),
        "per_replica_ratio": round(replica / ref, 3),
        "per_replica_ok": replica / ref <= 2.0,
        "first_update_end_to_end_s": round(first_s, 4),
        "grpc_stream_end_to_end_s": round(grpc_end_to_end, 4),
        "grpc_stream_end_to_end_ratio": round(grpc_end_to_end / ref, 3),
        "bare_grpc_stream_s": round(bare, 4),
        "bare_grpc_ratio": round(bare / ref, 3),
        "tls": tls,
        "server_receive_s": round(statistics.median(r.receive_s for r in replies), 4),
        "server_apply_s": round(statistics.median(r.apply_s for r in replies), 4),
        "per_replica_gb_per_s": round(size / replica / 1e9, 3),
        "note": "the bytes over the weights data port; receive = transfer + sha256 verify (overlapped) into a "
        "reused staging buffer. grpc_stream = the same update with the bytes in the gRPC stream (the fallback); "
        "bare_grpc_stream = those gRPC messages through a handler that only counts them",
    }
    return update, pause


def tls_updates(path: Path, live: dict[str, torch.Tensor], log_dir: Path, reps: int) -> dict:
    """The same update to a replica serving TLS: the data port encrypts too (with gRPC's certificate)."""
    from tests.unit.reward.helpers import self_signed_cert

    cert, key = self_signed_cert(log_dir)
    env = {"GRPO_ROLLOUT_TLS_CERT_FILE": str(cert), "GRPO_ROLLOUT_TLS_KEY_FILE": str(key)}
    proc = start_rollout("--model", str(path), log_dir=log_dir, env=env, ca_file=cert)
    data_port_s, grpc_s = [], []
    try:
        new = {k: v + 0.5 for k, v in live.items()}
        checksum = weights_checksum(new)
        push_weights(
            proc.address, new, 1, timeout_s=300, checksum=checksum, ca_file=str(cert), data_port=proc.data_port
        )
        for rep in range(reps):
            start = time.perf_counter()
            push_weights(proc.address, new, 2 * rep + 2, timeout_s=300, checksum=checksum, ca_file=str(cert),
                         data_port=proc.data_port)  # fmt: skip
            data_port_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            push_weights(proc.address, new, 2 * rep + 3, timeout_s=300, checksum=checksum, ca_file=str(cert))
            grpc_s.append(time.perf_counter() - start)
    finally:
        proc.stop()
    return {
        "per_replica_update_s": round(statistics.median(data_port_s), 4),
        "grpc_stream_per_replica_update_s": round(statistics.median(grpc_s), 4),
    }


def generation_pause(address: str, live: dict[str, torch.Tensor], version: int, data_port: int) -> dict:
    """(c) short Generate calls in a loop while an update streams in: how much longer does the slowest wait?"""
    request = pb.GenerateRequest(
        prompts=[pb.Prompt(text=QUESTIONS[0], apply_chat_template=True)],
        sampling=pb.SamplingParams(n=1, temperature=0, max_new_tokens=4),
    )
    latencies: list[tuple[float, float]] = []
    stop = threading.Event()

    def loop() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.RolloutServiceStub(channel)
            while not stop.is_set():
                start = time.perf_counter()
                stub.Generate(request, timeout=60)
                latencies.append((start, time.perf_counter() - start))

    thread = threading.Thread(target=loop)
    thread.start()
    time.sleep(1.0)
    new = {k: v - 0.01 for k, v in live.items()}
    begin = time.perf_counter()
    reply = push_weights(address, new, version, timeout_s=300, data_port=data_port)
    end = time.perf_counter()
    time.sleep(0.5)
    stop.set()
    thread.join()
    before = [lat for s, lat in latencies if s + lat < begin]
    during = [lat for s, lat in latencies if s < end and s + lat > begin]
    baseline = statistics.median(before)
    worst = max(during) if during else 0.0
    return {
        "generate_baseline_s": round(baseline, 4),
        "generate_worst_during_update_s": round(worst, 4),
        "pause_s": round(max(worst - baseline, 0.0), 4),
        "server_apply_s": round(reply.apply_s, 4),
        "update_total_s": round(end - begin, 4),
        "generate_calls_during_update": len(during),
        "note": "weights are received outside the generation lock; only the apply (copy) blocks Generate",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--part", choices=["all", "generate", "weights"], default="all")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rollout.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        # A partial run updates its part of the results file and keeps the rest.
        result = json.loads(args.out.read_text()) if args.part != "all" and args.out.exists() else {}
        if args.part in ("all", "generate"):
            result["generate_throughput"] = throughput(Path(tmp), args.reps)
            log.info("throughput: %s", result["generate_throughput"])
        if args.part in ("all", "weights"):
            result["update_weights"], result["generation_pause"] = weight_updates(Path(tmp), args.reps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
