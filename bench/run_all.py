"""Run every benchmark in turn (each writes bench/results/<name>.json), then print the ratios.

Benchmarks measure ratios against a reference run in the same process or script, because
these machines are noisy; absolute numbers are only context.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    "bench_sandbox.py",
    "bench_reward.py",
    "bench_math_verify.py",
    "bench_languages.py",
    "bench_rollout.py",
    "bench_eval.py",  # ~1 min: a 500-problem evaluation through the services vs in-process
    "bench_footprint.py",  # ~2 min: RSS/PSS of every process of the demo stack, ready and peak
    "bench_episodes.py",  # ~3 min: episodes vs single-turn through the services, and a timed episode batch
    "bench_python_session.py",  # ~15 s: python calls in a session (replaying the earlier ones) vs fresh programs
    "bench_weight_broadcast.py",
    "bench_trainer.py",
    "bench_packing.py",  # ~6 min on 1 CPU thread: packed vs padded Learner steps, peak RSS per arm
    "bench_ranks.py",
    "bench_async.py",
    "bench_load.py",
    "bench_overload.py",  # ~2 min: 8 -> 64 -> 8 clients of a math/code/score mix, a worker and a zygote killed
    "bench_control_path.py",
    "bench_weight_fanout.py",  # ~20 min: 64 receivers, 200 MB, capped arms at 5 MB/s per sender
]
log = logging.getLogger("bench")


def main(names: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    failed = []
    for name in names or BENCHES:
        started = time.monotonic()
        log.info("running %s", name)
        if subprocess.run([sys.executable, str(HERE / name)], check=False).returncode != 0:
            failed.append(name)
        log.info("%s done in %.0f s", name, time.monotonic() - started)
    for path in sorted((HERE / "results").glob("*.json")):
        data = json.loads(path.read_text())
        scalars = {k: v for k, v in data.items() if isinstance(v, int | float | str | bool)}
        log.info("%s: %s", path.name, json.dumps(scalars))
    if failed:
        log.error("failed: %s", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
