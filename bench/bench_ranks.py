"""DeepSpeed ZeRO-2 on 2 ranks vs 1 rank, the same global batch → bench/results/ranks.json.

Each arm is a torchrun launch of the same worker (1 thread per rank): the Learner trains the same GRPO
batch (bench_trainer's ~4M-parameter model and batch) for a few steps and reports the median step time.
On this 2-core machine two ranks cannot be faster than one: the numbers are the overhead of sharding
(gradient reduce-scatter, the zero-weight padding passes, the metric gather), not a speed-up. The arms
alternate (1, 2, 1, 2, ...) so machine noise hits both alike; the ratio is 2-rank / 1-rank step time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from grpo.common.net import free_port

log = logging.getLogger("bench_ranks")
ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[4])
from bench_trainer import MODEL, grpo_batch
from grpo.common.tiny_model import ensure_tiny_model
from grpo.trainer.learner import Learner, LearnerConfig

steps, mbs, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
batch = grpo_batch(8, 4)
learner = Learner(LearnerConfig(model=str(ensure_tiny_model(**MODEL)), backend="deepspeed", zero_stage=2, lr=1e-5,
                                micro_batch_size=mbs, beta=0.0))
learner.step(batch)  # warm-up
times = []
for _ in range(steps):
    learner.backend.barrier()
    start = time.perf_counter()
    learner.step(batch)
    times.append(time.perf_counter() - start)
if learner.backend.rank == 0:
    json.dump({"world_size": learner.backend.world_size, "step_s": times}, open(out, "w"))
learner.close()
"""


def launch(world_size: int, steps: int, mbs: int, workdir: Path) -> list[float]:
    script, out = workdir / "worker.py", workdir / f"ranks{world_size}.json"
    script.write_text(WORKER)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), f"--nproc-per-node={world_size}", f"--master-port={free_port()}", str(script),
           str(steps), str(mbs), str(out), str(ROOT / "bench")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{world_size} ranks failed:\n{proc.stderr[-3000:]}")
    return list(json.loads(out.read_text())["step_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ranks.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    times: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for world_size in (1, 2):
                times[world_size] += launch(world_size, args.steps, args.micro_batch_size, Path(tmp))
                log.info("round %d, %d rank(s): median step %.3f s", round_, world_size,
                         statistics.median(times[world_size]))  # fmt: skip
    one, two = statistics.median(times[1]), statistics.median(times[2])
    result = {
        "backend": "deepspeed zero-2, gloo, CPU, 1 thread per rank",
        "cores": os.cpu_count(),
        "batch": {"samples": 32, "micro_batch_size": args.micro_batch_size},
        "steps_per_arm": len(times[1]),
        "one_rank_step_s": round(one, 4),
        "two_rank_step_s": round(two, 4),
        "ratio_two_over_one": round(two / one, 3),
        "step_s": {str(k): [round(t, 4) for t in v] for k, v in times.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "step_s"}, indent=1))


if __name__ == "__main__":
    main()
