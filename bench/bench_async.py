"""Wall time per GRPO step, strictly on-policy (max_staleness 0) against async (max_staleness 1), same run.

Both arms use the demo config and the same SFT model (one cold start, then two GRPO runs through
the real services, each on fresh processes). Seconds per step are taken from the trainer's
metrics.jsonl timestamps after a warm-up of `--skip` steps. Target: async ≤ 0.7 × sync.
Writes bench/results/async.json.  Usage: .venv/bin/python bench/bench_async.py [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path
from statistics import median

from grpo.common.logs import setup_logging
from grpo.demo import live
from grpo.demo.config import DemoConfig
from grpo.demo.demo import grpo_phase, prepare
from grpo.local.procs import Supervisor
from grpo.trainer.report import read_metrics

RESULTS = Path(__file__).parent / "results" / "async.json"


def seconds_per_step(metrics_path: Path, skip: int) -> dict[str, float]:
    rows = [r for r in read_metrics(metrics_path) if "time/step_s" in r]
    times = [r["time"] for r in rows]
    span = times[-1] - times[skip - 1]
    return {
        "s_per_step": span / (len(times) - skip),
        "median_step_s": median(r["time/step_s"] for r in rows[skip:]),
        "median_wait_rollouts_s": median(r.get("time/wait_rollouts_s", 0.0) for r in rows[skip:]),
        "median_train_s": median(r.get("train/train_s", 0.0) for r in rows[skip:]),
        "steps_measured": float(len(times) - skip),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the measurement")
    ap.add_argument("--work-dir", type=Path, default=Path("runs") / f"bench-async-{int(time.time())}")
    a = ap.parse_args()
    setup_logging("WARNING", False)
    cfg = DemoConfig(steps=a.steps, eval_every=0, sft_eval_size=200)
    view, quiet = live.ViewState(), (lambda: None)
    work = a.work_dir.resolve()
    sft_dir, acc, _ = prepare(cfg, work / "shared", view, quiet)
    arms: dict[str, dict[str, float]] = {}
    for name, staleness in (("sync", 0), ("async", 1)):
        run_dir = work / name
        (run_dir / "data").mkdir(parents=True, exist_ok=True)
        for f in ("train.jsonl", "eval.jsonl"):
            (run_dir / "data" / f).write_text((work / "shared" / "data" / f).read_text())
        arm_cfg = cfg.model_copy(update={"max_staleness": staleness})
        started = time.monotonic()
        with Supervisor(run_dir / "logs") as sup:
            grpo_phase(sup, arm_cfg, run_dir, f"bench-{name}", sft_dir, view, quiet)
        arms[name] = {**seconds_per_step(run_dir / "metrics.jsonl", a.skip), "wall_s": time.monotonic() - started}
        logging.getLogger("bench").warning("%s: %s", name, arms[name])
    ratio = arms["async"]["s_per_step"] / arms["sync"]["s_per_step"]
    result = {
        "benchmark": "async", "steps": a.steps, "skip": a.skip, "sft_accuracy": acc,
        "config": {k: getattr(cfg, k) for k in ("prompts_per_step", "group_size", "max_new_tokens", "replicas")},
        "sync": arms["sync"], "async": arms["async"], "async_over_sync": ratio, "target": 0.7,
        "meets_target": ratio <= 0.7, "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
    }  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    print(json.dumps({"async_over_sync": round(ratio, 3), "sync_s_per_step": arms["sync"]["s_per_step"],
                      "async_s_per_step": arms["async"]["s_per_step"], "written": str(RESULTS)}))  # fmt: skip


if __name__ == "__main__":
    main()
