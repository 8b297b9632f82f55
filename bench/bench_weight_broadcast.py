"""Weight broadcast (gloo on CPU) vs the weights data port, to 2 real replicas → bench/results/weight_broadcast.json.

For ~50 MB and ~200 MB models, each repetition pushes one new version to both replicas with the trainer's
`push_to_replicas` (it hashes once; the bytes flow while it hashes) by data port, then the next version by
broadcast (one send for both). The first broadcast also forms the group and is reported on its own. The
ratio broadcast / data port is the number to read: on one machine with two cores, sender and replicas share
the CPUs, so the absolute times say little about a real fabric (docs/gpu-weight-broadcast.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.common.weights.broadcast import PIECE_BYTES, WeightBroadcaster
from grpo.common.weights.codec import model_weights
from grpo.local.services import ServiceProc, start_rollout
from grpo.trainer.pusher import ReplicaTarget, push_to_replicas

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench_weight_broadcast")
# The tiny model's tokenizer with more layers and width: ~12M and ~47M parameters in fp32.
MODELS = {
    "50MB": {"hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 1024},
    "200MB": {"hidden_size": 512, "num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 4,
              "intermediate_size": 2048},
}  # fmt: skip
REPLICAS = 2


def timed_push(targets: list[ReplicaTarget], tensors: dict[str, torch.Tensor], version: int,
               broadcaster: WeightBroadcaster | None) -> float:  # fmt: skip
    start = time.perf_counter()
    results = push_to_replicas(targets, tensors, version, timeout_s=300, retries=0, broadcaster=broadcaster)
    took = time.perf_counter() - start
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"push of version {version} failed: {failed}")
    return took


def one_size(name: str, log_dir: Path, reps: int, piece_bytes: int) -> dict:
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model(**MODELS[name])
    live = model_weights(AutoModelForCausalLM.from_pretrained(path))
    size = sum(t.numel() * t.element_size() for t in live.values())
    procs: list[ServiceProc] = []
    broadcaster = WeightBroadcaster("127.0.0.1:0", timeout_s=120, piece_bytes=piece_bytes)
    try:
        procs = [start_rollout("--model", str(path), log_dir=log_dir) for _ in range(REPLICAS)]
        targets = [ReplicaTarget(f"r{i}", p.address, p.data_port) for i, p in enumerate(procs)]
        version = 1
        timed_push(targets, {k: v + 0.01 for k, v in live.items()}, version, None)  # maps the staging buffers
        version += 1
        first = timed_push(targets, {k: v + 0.02 for k, v in live.items()}, version, broadcaster)
        data_port_s, broadcast_s = [], []
        for rep in range(reps):
            for how, times in (("data_port", data_port_s), ("broadcast", broadcast_s)):
                version += 1
                tensors = {k: v + 0.001 * version for k, v in live.items()}
                times.append(timed_push(targets, tensors, version, broadcaster if how == "broadcast" else None))
                log.info("%s %s rep %d: %.3fs", name, how, rep, times[-1])
        pieces_per_version = broadcaster.pieces_sent / (reps + 1)
    finally:
        broadcaster.close()
        for proc in procs:
            proc.stop()
    data_port, broadcast = statistics.median(data_port_s), statistics.median(broadcast_s)
    return {
        "bytes": size,
        "replicas": REPLICAS,
        "data_port_s": round(data_port, 4),
        "broadcast_s": round(broadcast, 4),
        "broadcast_over_data_port": round(broadcast / data_port, 3),
        "first_broadcast_with_group_formation_s": round(first, 4),
        "broadcast_gb_per_s_per_replica": round(size / broadcast / 1e9, 3),
        "pieces_per_version": pieces_per_version,
        "groups_formed": broadcaster.epoch,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--piece-mb", type=int, default=PIECE_BYTES // 2**20, help="bytes per collective, MiB")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "weight_broadcast.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    result: dict = {
        "workload": f"one new fp32 version to {REPLICAS} rollout replicas (hf engine, 1 torch thread) on this "
        "machine, end to end through push_to_replicas (sender sha256 included, overlapped); median of "
        f"{args.reps}; gloo over loopback, {args.piece_mb} MiB per collective",
    }
    with tempfile.TemporaryDirectory(prefix="bench-broadcast-") as tmp:
        for name in args.sizes:
            result[name] = one_size(name, Path(tmp), args.reps, args.piece_mb * 2**20)
            log.info("%s: %s", name, result[name])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log.info("wrote %s:\n%s", args.out, json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
