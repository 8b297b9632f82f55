"""Outcome GRPO vs PRM-GRPO vs VinePPO on the demo: a table from finished `grpo demo` runs.

Run the demos first (one folder per run under RUNS_DIR), e.g.
    for seed in 0 1 2; do for preset in grpo prm; do
      grpo --runs-dir RUNS_DIR demo --no-live --preset $preset --seed $seed --run-id $preset-s$seed
    done; grpo --runs-dir RUNS_DIR demo --no-live --preset vineppo --steps 24 --seed $seed --run-id vineppo-s$seed
    done
then `python scripts/credit_table.py RUNS_DIR [--json bench/results/credit.json]` prints one row per run and the
mean per preset: held-out accuracy before GRPO, the evaluations, "after" = the mean of the last three evaluations,
and the rollout tokens spent (every sampled group, plus value continuations for VinePPO; lengths from the per-step
means, so approximate).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("credit_table")
NOT_GROUPS = {"groups/refills", "groups/zero_variance_fraction", "groups/duplicate", "groups/superseded"}


def run_row(folder: Path) -> dict[str, Any]:
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    tokens = 0.0
    for r in rows:
        if "rollout/response_len_mean" not in r:
            continue
        # Every group that came back cost its samples, kept or dropped (their lengths: the kept groups' mean).
        groups = sum(v for k, v in r.items() if k.startswith("groups/") and k not in NOT_GROUPS)
        policy = groups * summary["config"]["group_size"] * r["rollout/response_len_mean"]
        tokens += policy * r.get("vine/rollout_tokens_per_trained_token", 1.0)
    evals = [e["accuracy"] for e in summary["eval_history"] if e["step"] > 0]
    after = sum(evals[-3:]) / len(evals[-3:]) if evals else None
    at_20 = next((e["accuracy"] for e in summary["eval_history"] if e["step"] == 20), None)
    return {
        "run": folder.name, "preset": summary["config"]["preset"], "seed": summary["config"]["seed"],
        "steps": summary["grpo_steps"], "before": summary["eval_accuracy_before"], "evals": evals, "after": after,
        "at_step_20": at_20,
        "gain": None if after is None else after - summary["eval_accuracy_before"],
        "rollout_tokens_M": round(tokens / 1e6, 3), "wall_s": summary.get("wall_seconds"),
    }  # fmt: skip


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = [run_row(f) for f in sorted(args.runs_dir.iterdir()) if (f / "summary.json").is_file()]
    log.info("| run | steps | before | evaluations | at step 20 | after (last 3) | gain | rollout tokens | wall |")
    log.info("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        evals = " ".join(f"{100 * e:.1f}" for e in r["evals"])
        log.info("| %s | %d | %.1f %% | %s | %.1f %% | %.1f %% | %+.1f | %.2f M | %.0f s |", r["run"], r["steps"],
                 100 * r["before"], evals, 100 * r["at_step_20"], 100 * r["after"], 100 * r["gain"],
                 r["rollout_tokens_M"], r["wall_s"])  # fmt: skip
    by_preset: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_preset.setdefault(r["preset"], []).append(r)
    means = {}
    for preset, group in by_preset.items():
        n = len(group)
        keys = ("before", "at_step_20", "after", "gain", "rollout_tokens_M")
        means[preset] = {k: sum(r[k] for r in group) / n for k in keys}
        means[preset]["runs"] = n
        m = means[preset]
        log.info("mean %s over %d run(s): before %.1f %%, at step 20 %.1f %%, after %.1f %%, gain %+.1f points, "
                 "%.2f M rollout tokens", preset, n, 100 * m["before"], 100 * m["at_step_20"], 100 * m["after"],
                 100 * m["gain"], m["rollout_tokens_M"])  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "means": means}, indent=1) + "\n")


if __name__ == "__main__":
    main()
