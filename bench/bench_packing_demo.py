"""Packing false vs auto on the real demo → bench/results/packing_demo.json.

Each arm is a whole `grpo demo --quick` run (grpo.demo.demo.run_demo: services, cold-start model reused from the
cache, seed 0) whose trainer settings carry `packing` as given; arms interleave (false, auto, false, auto, …) so
machine noise hits both alike. From each run's metrics.jsonl: the share of steps train/packed == 1 (how often
auto packs), the mean train/train_s (the Learner's update) and time/step_s (the whole step), and the eval accuracy
before/after (summary.json). Timings on a shared 2-core machine are noisy: compare train_s within a pair.

    .venv/bin/python bench/bench_packing_demo.py --pairs 2 [--task tool]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any, Literal

from grpo.demo.config import DemoConfig
from grpo.demo.demo import run_demo

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench_packing_demo")
Packing = bool | Literal["auto"]


class ArmConfig(DemoConfig):
    """The demo's settings plus the trainer's `packing` (a bench-only knob: the demo itself takes the default)."""

    packing: Packing = False

    def trainer_settings(self, **kw: Any) -> dict[str, object]:  # type: ignore[override]
        return {**super().trainer_settings(**kw), "packing": self.packing}


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl (one per logged step)."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
    return statistics.fmean(values) if values else None


def summarise(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """What one arm did: how often it packed, its step times, its learning."""
    rows = [r for r in read_metrics(run_dir) if "train/train_s" in r]
    packed = [float(r.get("train/packed", 0.0)) for r in rows]
    return {
        "run_dir": str(run_dir),
        "steps": len(rows),
        "packed_share": sum(packed) / len(packed) if packed else None,
        "train_s_mean": mean_of(rows, "train/train_s"),
        "step_s_mean": mean_of(rows, "time/step_s"),
        "tokens_per_s_mean": mean_of(rows, "train/tokens_per_s"),
        "accuracy_before": summary.get("eval_accuracy_before"),
        "accuracy_after": summary.get("eval_accuracy_after"),
        "wall_s": summary.get("wall_seconds"),
        "reward_first_steps": summary.get("reward_first_steps"),
        "reward_last_steps": summary.get("reward_last_steps"),
        "eval_history": summary.get("eval_history"),
    }


def run_arm(packing: Packing, task: str, runs_dir: Path, label: str) -> dict[str, Any]:
    cfg = ArmConfig.model_validate({**DemoConfig.quick(task=task).model_dump(), "packing": packing})
    run_id = f"{task}-{label}"
    started = time.monotonic()
    summary = run_demo(cfg, runs_dir=runs_dir, run_id=run_id, live_view=False)
    out = summarise((runs_dir / run_id).resolve(), summary)
    out.update(packing=packing, label=label, bench_wall_s=time.monotonic() - started)
    log.info("%s: %s", label, {k: v for k, v in out.items() if k != "eval_history"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--first-pair", type=int, default=0, help="> 0: add pairs to the arms already in --out")
    parser.add_argument("--task", choices=("addition", "tool"), default="addition")
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/packing/runs"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "packing_demo.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    earlier = json.loads(args.out.read_text()).get(args.task, {}) if args.out.exists() else {}
    arms: list[dict[str, Any]] = earlier.get("arms", []) if args.first_pair else []
    for pair in range(args.first_pair, args.first_pair + args.pairs):
        for packing in (False, "auto"):
            arms.append(run_arm(packing, args.task, args.runs_dir, f"{str(packing).lower()}-{pair}"))
            # written after every arm: a run cut short still leaves the finished arms
            results = json.loads(args.out.read_text()) if args.out.exists() else {}
            results[args.task] = {"arms": arms, "pairs": pair_ratios(arms)}
            args.out.write_text(json.dumps(results, indent=2) + "\n")


def pair_ratios(arms: list[dict[str, Any]]) -> list[dict[str, float | None]]:
    """auto / false within each interleaved pair (the machine's load is closest there)."""
    out = []
    for off, auto in zip(arms[0::2], arms[1::2], strict=False):
        out.append({key: (auto[key] / off[key] if auto.get(key) and off.get(key) else None)
                    for key in ("train_s_mean", "step_s_mean", "tokens_per_s_mean")})  # fmt: skip
    return out


if __name__ == "__main__":
    main()
