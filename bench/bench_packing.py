"""Sequence packing vs padding in Learner.step on a long-tailed length mix → bench/results/packing.json.

Two Learners on the same ~4M-parameter Qwen2 and the same batch, one padding (length-sorted micro-batches, each
padded to its longest) and one packing (LearnerConfig.packing); steps interleaved so machine noise hits both
alike. Completion lengths are lognormal (median 120 tokens) clipped to 20–1,000, as reasoning traces are long
tailed; lengths are scaled down from the issue's 20–2,000 so a step fits a 1-thread CPU. Peak memory: each arm
again in a subprocess of its own, RSS once loaded and its peak (VmHWM) over the steps (torch's CPU allocator
keeps no statistics, tracemalloc does not see tensors, and ru_maxrss inherits the parent's peak). Target: packed tokens/s ≥ 1.5 × padded
where padding is ≥ 40 % of the positions the padded path feeds the model.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.learner import Learner, LearnerConfig, TrainableSample
from grpo.trainer.learner.batch import plan_rank, sample_length

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench_packing")
MODEL = {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 1024, "max_position_embeddings": 2048}
# (samples, micro_batch_size): 32 samples in micro-batches of 16 pad ~55 %, of 8 ~35 % (sorting already helps)
SCENARIOS = {"mbs16": (32, 16), "mbs8": (32, 8)}


def long_tailed_batch(n: int, seed: int = 0) -> list[TrainableSample]:
    """Groups of 8 (one prompt of 20–40 tokens each), completions lognormal(median 120, σ 1.1) in [20, 1000]."""
    rng = random.Random(seed)
    out = []
    for g in range(math.ceil(n / 8)):
        prompt = [rng.randrange(5, 400) for _ in range(rng.randint(20, 40))]
        for i in range(min(8, n - 8 * g)):
            length = min(1000, max(20, int(rng.lognormvariate(math.log(120), 1.1))))
            completion = [rng.randrange(5, 400) for _ in range(length)]
            out.append(TrainableSample(prompt, completion, advantage=(-1.0) ** i * 0.5, group_id=str(g)))
    return out


def fed_positions(batch: list[TrainableSample], micro_batch_size: int, packing: bool) -> int:
    """Token positions the model computes for `batch` (real tokens plus padding) under each layout."""
    lengths = [sample_length(s) for s in batch]
    plan = plan_rank(batch, rank=0, world_size=1, micro_batch_size=micro_batch_size, max_tokens=None,
                     mask_truncated=False, packing=packing)  # fmt: skip
    if plan.rows is not None:
        return sum(len(rows) * max(sum(lengths[i] for i in row) for row in rows) for rows in plan.rows)
    return sum(len(chunk) * max(lengths[i] for i in chunk) for chunk in plan.chunks)


def make_learner(path: str, micro_batch_size: int, packing: bool) -> Learner:
    return Learner(LearnerConfig(model=path, lr=1e-5, micro_batch_size=micro_batch_size, beta=0.0, packing=packing))


def status_mb(field: str) -> float:
    """A /proc/self/status memory field in MB. VmHWM (peak RSS) belongs to this process image: unlike
    getrusage's ru_maxrss it does not inherit the parent's peak across fork and exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_arm(path: str, scenario: str, packing: bool, steps: int) -> dict[str, float]:
    """Run in a subprocess: RSS after building the Learner, then the peak RSS over `steps` steps."""
    n, mbs = SCENARIOS[scenario]
    batch = long_tailed_batch(n)
    learner = make_learner(path, mbs, packing)
    learner.step(batch)  # the optimizer state exists from the first step on: count it as loaded
    loaded = status_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: from here it is the steps' peak
    for _ in range(steps):
        learner.step(batch)
    peak = status_mb("VmHWM")
    return {"rss_loaded_mb": round(loaded, 1), "peak_rss_mb": round(peak, 1), "step_rss_mb": round(peak - loaded, 1)}


def measure_memory(scenario: str, packing: bool, threads: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--memory-arm", scenario, "--threads", str(threads)]
    cmd += ["--packing"] if packing else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def time_scenario(path: str, scenario: str, steps: int, threads: int) -> dict[str, Any]:
    n, mbs = SCENARIOS[scenario]
    batch = long_tailed_batch(n)
    tokens = sum(sample_length(s) for s in batch)
    padded, packed = make_learner(path, mbs, False), make_learner(path, mbs, True)
    padded.step(batch)  # warm-up both (allocator, first-call overheads)
    packed.step(batch)
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    for _ in range(steps):
        for name, learner in (("padded", padded), ("packed", packed)):
            start = time.perf_counter()
            learner.step(batch)
            times[name].append(time.perf_counter() - start)
    rates = {k: tokens / statistics.median(v) for k, v in times.items()}
    positions = {k: fed_positions(batch, mbs, k == "packed") for k in times}
    memory = {k: measure_memory(scenario, k == "packed", threads) for k in times}
    return {
        "samples": n,
        "micro_batch_size": mbs,
        "tokens": tokens,
        "longest": max(sample_length(s) for s in batch),
        "padding_fraction": {k: round(1 - tokens / v, 3) for k, v in positions.items()},
        "tokens_per_s": {k: round(v, 1) for k, v in rates.items()},
        "ratio": round(rates["packed"] / rates["padded"], 3),
        "memory": memory,
        "step_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--memory-arm", choices=list(SCENARIOS), help=argparse.SUPPRESS)  # the subprocess
    parser.add_argument("--packing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "packing.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(args.threads)
    path = str(ensure_tiny_model(**MODEL))
    if args.memory_arm:
        print(json.dumps(memory_arm(path, args.memory_arm, args.packing, steps=1)))
        return
    scenarios = {name: time_scenario(path, name, args.steps, args.threads) for name in args.scenarios}
    main_case = scenarios.get("mbs16")
    result = {
        "model_parameters": sum(p.numel() for p in make_learner(path, 1, False).model.parameters()),
        "threads": args.threads,
        "steps": args.steps,
        "scenarios": scenarios,
        "target_ratio": 1.5,
        "meets_target": None if main_case is None else main_case["ratio"] >= 1.5,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
