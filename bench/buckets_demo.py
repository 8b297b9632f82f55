"""Difficulty buckets against DAPO's dynamic sampling (refill) on the addition demo (issue 39 part 2).

Runs `grpo demo` (grpo.demo.demo.run_demo: cold start, then GRPO through the real services) once per arm and seed:

* `neither`: the demo as it is (zero-variance groups dropped, not replaced);
* `refill`: refill_zero_variance (DAPO dynamic sampling: each zero-variance drop is replaced by a new task, up to
  max_refill_per_step, 2 × prompts_per_step), which spends rollouts to find signal after the fact;
* `buckets`: skip_solved_after / set_aside_after (difficulty.py), which passes over prompts whose earlier groups
  were all solved or all wrong, before sampling them;
* `predicted_flat`: skip_flat_above, which passes over prompts whose last group makes a flat next one likely;
* `probe_refill`, `probe_all_refill`: adaptive group size (probe_size 4 of G 8) with refill: a group's first 4
  answers, and the other 4 only where they disagree, so a flat group costs 4 samples, not 8; on the rows whose last
  group says the probe pays (0, 1, 7 or 8 of 8 solved), or on every task (probe_all).

Every arm compares groups on the reward (zero_variance_on: reward): the refill arm's `auto` would switch to
accuracy, and the arms' zero-variance counts would then measure different things. A prompt is only skipped after
its groups were judged, so buckets act from the second epoch on: --n-grpo sets the GRPO split so that the run's
steps × prompts_per_step draws span several epochs (default 1024 rows: 200 × 32 draws ≈ 6 epochs).

Writes bench/results/buckets_seed<N>.json, per arm: groups by verdict, zero-variance groups and the rollouts
(samples, and tokens estimated from each step's mean response length) they took, rollouts per trained group, the
draws the buckets passed over, the last bucket counts, and held-out accuracy over wall time (each evaluation's step,
seconds since the trainer's first logged step, accuracy). A full measurement is 5 arms × 3-5 min per seed:
    .venv/bin/python bench/buckets_demo.py --seed 0
--smoke runs the smallest demo that exercises the code path (minutes; its numbers are no result and are written
beside its runs, not under bench/results).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from grpo.demo.config import DemoConfig
from grpo.demo.demo import run_demo

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
log = logging.getLogger("bench.buckets_demo")

ARMS: dict[str, dict[str, Any]] = {
    "neither": {},
    "refill": {"refill_zero_variance": True},
    "buckets": {"skip_solved_after": 2, "set_aside_after": 4, "revisit_after_epochs": 1},
    # quicker to judge: one all-solved group makes a prompt easy, two unsolved ones hard
    "buckets_eager": {"skip_solved_after": 1, "set_aside_after": 2, "revisit_after_epochs": 1},
    # predicted flat: set aside rows whose last group makes a flat next group >= 25 % likely (G 8: 0-1 or 7-8 of 8)
    "predicted_flat": {"skip_flat_above": 0.25, "revisit_after_epochs": 1},
    # ... from 12.5 % (G 8: 0-2 or 6-8 of 8)
    "predicted_flat_12": {"skip_flat_above": 0.12, "revisit_after_epochs": 1},
    # both: pass over the likely flat prompts before, replace the flat groups that still come after
    "predicted_flat_refill": {"skip_flat_above": 0.25, "revisit_after_epochs": 1, "refill_zero_variance": True},
    # adaptive group size: 4 answers first, the other 4 only where they disagree (a flat probe costs 4, not 8), on
    # the rows whose last group says the probe pays (0, 1, 7 or 8 of 8), with refill replacing the flat groups
    "probe_refill": {"probe_size": 4, "refill_zero_variance": True},
    # ... on every task, unseen rows included
    "probe_all_refill": {"probe_size": 4, "probe_all": True, "refill_zero_variance": True},
}
COMMON = {"zero_variance_on": "reward"}  # see the module doc
SMOKE: dict[str, Any] = {
    "steps": 6, "prompts_per_step": 8, "group_size": 4, "eval_every": 3, "eval_size": 16, "n_sft": 256,
    "n_grpo": 16, "sft_max_steps": 10, "sft_eval_every": 5, "sft_eval_size": 16, "sft_threshold": 0.0,
    "warmup_steps": 1,
}  # fmt: skip
SMOKE_ARMS = {
    "buckets": {"skip_solved_after": 1, "set_aside_after": 1, "revisit_after_epochs": 1},
    "predicted_flat": {"skip_flat_above": 0.1, "revisit_after_epochs": 1},
    "probe_refill": {"probe_size": 2, "refill_zero_variance": True},
    "probe_all_refill": {"probe_size": 2, "probe_all": True, "refill_zero_variance": True},
}


class ArmConfig(DemoConfig):
    """The demo's settings plus trainer settings of one arm (the SFT cache key leaves them out: the arms of a seed
    share one cold start)."""

    trainer_overrides: dict[str, Any] = Field(default_factory=dict)

    def trainer_settings(self, **kwargs: Any) -> dict[str, object]:  # type: ignore[override]
        return {**super().trainer_settings(**kwargs), **self.trainer_overrides}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


SAMPLED = ("train", "zero_variance", "stale", "unscored")  # verdicts of groups whose samples were all generated


def arm_numbers(rows: list[dict[str, Any]], group_size: int) -> dict[str, Any]:
    """What one arm's metrics.jsonl says: groups, rollouts and their cost, skips, accuracy over wall time.

    Samples and tokens are the trainer's exact counts (rollout/samples, groups/zero_variance_samples, ...: every
    group has G samples but a flat probe); runs logged before those metrics existed get G × groups and tokens
    estimated from each step's mean response length (the `_est` keys)."""
    steps = [r for r in rows if r["step"] > 0 and "groups/train" in r]
    groups = {v: sum(r.get(f"groups/{v}", 0.0) for r in steps) for v in SAMPLED}

    def counted(key: str, groups_of: tuple[str, ...], per_sample: str | None) -> float:
        """Each step's exact `key`, else G × its groups of those verdicts (× the mean response length)."""

        def estimate(r: dict[str, Any]) -> float:
            n = group_size * sum(r.get(f"groups/{v}", 0.0) for v in groups_of)
            return n * r.get(per_sample, 0.0) if per_sample else n

        return sum(r[key] if key in r else estimate(r) for r in steps)

    samples = counted("rollout/samples", SAMPLED, None)
    tokens = counted("rollout/tokens", SAMPLED, "rollout/response_len_mean")
    zv_samples = counted("groups/zero_variance_samples", ("zero_variance",), None)
    zv_tokens = counted("groups/zero_variance_tokens", ("zero_variance",), "rollout/response_len_mean")
    trained = max(groups["train"], 1.0)
    start = rows[0]["time"] if rows else 0.0
    evals = [{"step": r["step"], "wall_s": round(r["time"] - start, 1), "accuracy": r["eval/accuracy"]}
             for r in rows if "eval/accuracy" in r]  # fmt: skip
    last = steps[-1] if steps else {}
    return {
        "steps": len(steps), "groups": groups, "refills": sum(r.get("groups/refills", 0.0) for r in steps),
        "zero_variance_groups": groups["zero_variance"], "zero_variance_samples": zv_samples,
        "zero_variance_tokens_est": round(zv_tokens), "samples": samples, "tokens_est": round(tokens),
        "samples_per_trained_group": samples / trained, "tokens_per_trained_group_est": tokens / trained,
        "skipped_draws": sum(r.get("buckets/skipped", 0.0) for r in steps),
        "probe_flat_groups": sum(r.get("groups/probe_flat", 0.0) for r in steps),
        "exact_counts": bool(steps) and all("rollout/samples" in r for r in steps),
        "buckets_last": {b: last[f"buckets/{b}"] for b in ("easy", "medium", "hard", "unseen") if f"buckets/{b}" in last},
        "accuracy_over_time": evals, "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "wall_s": round(steps[-1]["time"] - start, 1) if steps else 0.0,
    }  # fmt: skip


def run_arm(arm: str, overrides: dict[str, Any], base: dict[str, Any], seed: int, runs_dir: Path) -> dict[str, Any]:
    cfg = ArmConfig.model_validate({**base, "seed": seed, "trainer_overrides": {**COMMON, **overrides}})
    run_id = f"buckets-{arm}-seed{seed}"
    started = time.monotonic()
    summary = run_demo(cfg, runs_dir=runs_dir, run_id=run_id, live_view=False)
    rows = read_jsonl(runs_dir / run_id / "metrics.jsonl")
    numbers = arm_numbers(rows, cfg.group_size)
    log.info("%s: %d zero-variance groups, %.1f samples per trained group, %d draws skipped, accuracy %s", arm,
             numbers["zero_variance_groups"], numbers["samples_per_trained_group"], numbers["skipped_draws"],
             numbers["final_accuracy"])  # fmt: skip
    return {**numbers, "settings": overrides, "demo_wall_s": round(time.monotonic() - started, 1),
            "sft_accuracy": summary.get("sft_accuracy"), "loadavg_after": os.getloadavg()}  # fmt: skip


def versus_refill(result: dict[str, Any], arm: str) -> float | None:
    """The arm's zero-variance samples over refill's, when both started GRPO from the same cold start (a new SFT model
    moves refill's own count by half: such arms are not compared; None)."""
    refill = result.get("refill")
    if refill is None or result[arm].get("sft_accuracy") != refill.get("sft_accuracy"):
        return None
    return float(result[arm]["zero_variance_samples"] / max(refill["zero_variance_samples"], 1.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--n-grpo", type=int, default=1024, help="GRPO rows (fewer rows: more epochs per run)")
    ap.add_argument("--smoke", action="store_true", help="the smallest demo that runs every arm's code path")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "bench-buckets")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    base: dict[str, Any] = dict(SMOKE) if a.smoke else {"n_grpo": a.n_grpo}
    arms = {**ARMS, **SMOKE_ARMS} if a.smoke else ARMS
    runs_dir = a.runs_dir.resolve()
    for seed in a.seed:
        result: dict[str, Any] = {"benchmark": "buckets_demo", "seed": seed, "smoke": a.smoke, "demo": base,
                                  "common": COMMON, "machine": {"cpus": os.cpu_count(),
                                  "python": platform.python_version(), "loadavg_before": os.getloadavg()}}  # fmt: skip
        out = (runs_dir if a.smoke else RESULTS) / f"buckets_seed{seed}.json"
        if out.is_file() and not a.smoke:  # arms measured earlier for this seed stay; the ones run now replace theirs
            earlier = json.loads(out.read_text())
            result.update({arm: earlier[arm] for arm in ARMS if arm in earlier and arm not in a.arms})
            if "earlier_cold_start" in earlier:  # arms measured from another SFT model of this seed (kept apart)
                result["earlier_cold_start"] = earlier["earlier_cold_start"]
        for arm in a.arms:
            result[arm] = run_arm(arm, arms[arm], base, seed, runs_dir)
        for arm in (arm for arm in ARMS if arm not in ("neither", "refill") and arm in result):
            result[f"{arm}_vs_refill_zero_variance_samples"] = versus_refill(result, arm)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        log.info("written %s", out)


if __name__ == "__main__":
    main()
