"""R1's whole recipe measured stage by stage (docs/demo.md, "R1's whole recipe"), as `grpo up` runs it.

Runs deploy/local/r1.yaml (or --quick: r1-quick.yaml) with the trainer's `seed` set, through the real services
(`grpo up -c`, from the repository root), then the comparison arms below, each on the recipe's stages 1-2 (their
folders copied: the trainer skips finished stages). Writes bench/results/r1_recipe_seed<N>.json: held-out accuracy
(overall and per task) after each stage,

* base: the untrained built-in tiny model, decoded greedily in-process (transformers' generate, as the rollout's hf
  engine decodes evaluations) and judged by the reward service's math verifier, on the same 256 held-out problems;
* after stage 1 (SFT) and stage 4 (RS-SFT from base): the next GRPO stage's step-0 evaluation of the model it
  starts from; after stages 2 and 5 (GRPO): that stage's last evaluation (its final model);

the rejection-sampling stage's kept / sampled answers and prompts with none kept, each stage's wall time, and the
accuracy of two arms that reuse the recipe's stages 1-2: `control` (stage 2 continued by a GRPO stage with stage 5's
settings, instead of stages 3-5) and `filtered` (stages 3-5 with the rejection-sampling stage also keeping only
answers whose scratchpad is the column algorithm's: grpo.demo.r1_task.worked_scratchpad, a plug-in filter).
Usage: .venv/bin/python bench/r1_recipe.py --seed 0 [--quick] [--arms control filtered] [--arms-only]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TASKS = ("add", "sub")
log = logging.getLogger("bench.r1_recipe")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def accuracy_of(row: dict[str, Any]) -> dict[str, float]:
    """An evaluation row's accuracy, overall and per task."""
    return {"all": row["eval/accuracy"], **{t: row[f"eval/{t}/accuracy"] for t in TASKS}}


def evaluations(stage: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(stage / "metrics.jsonl") if "eval/accuracy" in r]


def stage_accuracies(run: Path) -> dict[str, dict[str, float]]:
    """Held-out accuracy after stages 1, 2, 4 and 5, from the GRPO stages' evaluations (see the module doc)."""
    two, five = evaluations(run / "stage-2-grpo"), evaluations(run / "stage-5-grpo")
    assert two[0]["step"] == 0 and five[0]["step"] == 0, "a GRPO stage without its step-0 evaluation"
    return {"sft": accuracy_of(two[0]), "grpo": accuracy_of(two[-1]), "rs_sft": accuracy_of(five[0]),
            "grpo_final": accuracy_of(five[-1])}  # fmt: skip


def worked_scratchpads(rows: list[dict[str, Any]]) -> int:
    """Kept rows whose whole answer is the worked one: the right scratchpad, not only the right result (the
    filters check the result and the format; a wrong scratchpad with a right result passes them)."""
    from grpo.demo.r1_task import worked_scratchpad

    return sum(worked_scratchpad(r) is True for r in rows)


def rejection_numbers(stage: Path) -> dict[str, Any]:
    """The rejection-sampling stage's summary, and its kept rows per task and with the worked scratchpad."""
    summary = json.loads((stage / "rs_summary.json").read_text())
    rows = read_jsonl(stage / "data.jsonl")
    keep = ("prompts", "sampled", "kept", "prompts_with_none", "kept_per_prompt", "rejected")
    return {**{k: summary[k] for k in keep}, "kept_by_task": dict(Counter(r["task_type"] for r in rows)),
            "keep_rate": summary["kept"] / max(summary["sampled"], 1),
            "kept_with_worked_scratchpad": worked_scratchpads(rows)}  # fmt: skip


def stage_seconds(run: Path) -> dict[str, float]:
    summary = json.loads((run / "summary.json").read_text())
    return {f"{s['index']}-{s['mode']}": s["seconds"] for s in summary["stages"]}


def base_accuracy(eval_path: Path, max_new_tokens: int) -> dict[str, float]:
    """The untrained built-in tiny model, greedy, judged by the reward service's math verifier (in-process)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.common.tiny_model import ensure_tiny_model
    from grpo.reward.verifiers.math import verify_math

    torch.set_num_threads(1)
    path = ensure_tiny_model()
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
    rows = read_jsonl(eval_path)
    ids = torch.tensor([tokenizer.encode(r["prompt"], add_special_tokens=False) for r in rows])  # one length
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    texts = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    right = [bool(verify_math(t, r["checks"]["math"]["gold"]).correct) for t, r in zip(texts, rows, strict=True)]
    by_task = {t: [ok for ok, r in zip(right, rows, strict=True) if r["task_type"] == t] for t in TASKS}
    return {"all": sum(right) / len(right), **{t: sum(v) / len(v) for t, v in by_task.items()}}


def grpo_up(stack: dict[str, Any], runs_dir: Path, name: str) -> float:
    """`grpo up -c <stack>` from the repository root; returns its wall seconds (RuntimeError when it fails)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(stack, sort_keys=False))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    started = time.monotonic()
    with (runs_dir / f"{name}.log").open("w") as out:
        done = subprocess.run(["grpo", "--runs-dir", str(runs_dir), "up", "-c", str(path), "--no-live"], cwd=ROOT,
                              env=env, stdout=out, stderr=subprocess.STDOUT, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"grpo up {name} exited {done.returncode}; see {runs_dir / f'{name}.log'}")
    return time.monotonic() - started


SCRATCHPAD_FILTER = "grpo.demo.r1_task:worked_scratchpad"


def arm_stages(stack: dict[str, Any], arm: str) -> list[dict[str, Any]]:
    """The stages of an arm that reuses the recipe's stages 1-2. `control`: then a GRPO stage with stage 5's
    settings (stage 2 continued, no stages 3-4); `filtered`: then stages 3-5 with the rejection-sampling stage also
    keeping only answers whose scratchpad is the column algorithm's (the plug-in filter)."""
    stages = stack["trainer"]["stages"]
    if arm == "control":
        return [*stages[:2], stages[4]]
    rs = {**stages[2], "rs_filters": [*stages[2].get("rs_filters", []), SCRATCHPAD_FILTER]}
    return [*stages[:2], rs, *stages[3:]]


def run_arm(stack: dict[str, Any], runs_dir: Path, recipe_run: Path, arm: str) -> dict[str, Any]:
    """Stages 1-2 copied from the recipe's run (finished: the trainer skips them), the arm's stages after them."""
    run_id = f"{stack['run_id']}-{arm}"
    run = runs_dir / run_id
    shutil.rmtree(run, ignore_errors=True)
    for folder in ("stage-1-sft", "stage-2-grpo"):
        shutil.copytree(recipe_run / folder, run / folder)
    seconds = grpo_up({**stack, "run_id": run_id, "trainer": {**stack["trainer"], "stages": arm_stages(stack, arm)}},
                      runs_dir, run_id)  # fmt: skip
    if arm == "control":
        evals = evaluations(run / "stage-3-grpo")
        return {"start": accuracy_of(evals[0]), "after": accuracy_of(evals[-1]), "steps": evals[-1]["step"],
                "wall_s": round(seconds, 1)}  # fmt: skip
    accuracy = stage_accuracies(run)
    return {"rs_sft": accuracy["rs_sft"], "grpo_final": accuracy["grpo_final"], "wall_s": round(seconds, 1),
            "rejection_sampling": rejection_numbers(run / "stage-3-rejection_sampling"),
            "stage_seconds": stage_seconds(run)}  # fmt: skip


ARMS = {"control": "control_stage2_continued", "filtered": "scratchpad_filtered"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="deploy/local/r1-quick.yaml (the pipeline, not learning)")
    ap.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS),
                    help="comparison arms after the recipe: control (stage 2 continued), filtered (stage 3 with the "
                         "scratchpad filter)")  # fmt: skip
    ap.add_argument(
        "--arms-only",
        action="store_true",
        help="run only the arms, on the recipe run and result file of an earlier run of this seed",
    )
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "bench-r1")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    profile = "r1-quick" if a.quick else "r1"
    stack = yaml.safe_load((ROOT / "deploy" / "local" / f"{profile}.yaml").read_text())
    run_id = f"{profile}-seed{a.seed}"
    stack = {**stack, "run_id": run_id, "trainer": {**stack["trainer"], "seed": a.seed}}
    runs_dir = a.runs_dir.resolve()
    run = runs_dir / run_id
    # The quick profile checks the pipeline; its numbers are no result (they stay beside its runs).
    out = (runs_dir if a.quick else RESULTS) / f"{profile.replace('-', '_')}_recipe_seed{a.seed}.json"
    if a.arms_only:
        result = json.loads(out.read_text())
    else:
        shutil.rmtree(run, ignore_errors=True)
        load_before = os.getloadavg()
        wall = grpo_up(stack, runs_dir, run_id)
        eval_rows = ROOT / stack["trainer"]["eval_data"]
        result = {
            "benchmark": "r1_recipe", "profile": profile, "seed": a.seed, "wall_s": round(wall, 1),
            "accuracy": {"base": base_accuracy(eval_rows, stack["trainer"]["max_new_tokens"]), **stage_accuracies(run)},
            "rejection_sampling": rejection_numbers(run / "stage-3-rejection_sampling"),
            "stage_seconds": stage_seconds(run),
            "eval_problems": {t: evaluations(run / "stage-5-grpo")[-1][f"eval/{t}/judged"] for t in TASKS},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_before": load_before,
                        "loadavg_after": os.getloadavg()},
        }  # fmt: skip
    for arm in a.arms:
        result[ARMS[arm]] = {**run_arm(stack, runs_dir, run, arm), "loadavg_after": os.getloadavg()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    log.info("accuracy after each stage: %s", json.dumps(result["accuracy"]))
    log.info("written %s", out)


if __name__ == "__main__":
    main()
