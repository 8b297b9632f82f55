"""R1's whole recipe through `grpo up -c deploy/local/r1-quick.yaml`, as a user runs it: Redis, the reward service,
a rollout replica and the trainer as real processes, five stages in one run (cold-start SFT, GRPO, rejection
sampling, SFT of the base model on the kept answers and general data, GRPO on all tasks). Each stage finishes, the
rejection-sampling data is what its filters promise, the re-SFT starts from the base model, and the last GRPO
stage reports per-task metrics and evaluations (add, sub)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.r1_recipe import (
    MODES,
    ROOT,
    check_books,
    check_rs_data,
    grpo_up,
    quick_trainer,
    read_jsonl,
    rows_by_id,
    stage_dir,
    stage_values,
)

# ~2 minutes on an idle 2-core machine; several times that when other test runs share the cores.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]
TASKS = ("add", "sub")


def test_grpo_up_runs_r1s_whole_recipe(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    proc = grpo_up(tmp_path / "runs", log)
    try:
        code = proc.wait(timeout=1400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-4000:]
    run = tmp_path / "runs" / "r1-quick"
    trainer = quick_trainer()

    # Every stage finished once, in order, and the run's summary lists the five outcomes.
    summary = json.loads((run / "summary.json").read_text())
    assert [s["mode"] for s in summary["stages"]] == MODES, summary["stages"]
    for i in range(1, 6):
        outcome = json.loads((stage_dir(run, i) / "stage.json").read_text())
        assert outcome["index"] == i and outcome["mode"] == MODES[i - 1], outcome
        assert outcome == summary["stages"][i - 1]

    # Stage 3 sampled with the stage-2 model, and kept exactly what its filters promise.
    rs = stage_values(trainer, 3)
    prompts = rows_by_id(ROOT / trainer["train_data"])
    rows = check_rs_data(stage_dir(run, 3), rs, prompts)
    assert rows, "rejection sampling kept nothing: the re-SFT would have no data"
    assert {r["task_type"] for r in rows} == set(TASKS)
    assert {r["provenance"]["model"] for r in rows} == {str(stage_dir(run, 2) / "final")}
    assert {r["provenance"]["stage"] for r in rows} == {3}

    # Stage 4 started from the base model (the run's `model: tiny`), not from stage 2's: the trainer says so, and
    # its first SFT loss is a random model's (ln 512 ≈ 6.2), as stage 1's was, not the ~1 a trained model starts at.
    trainer_log = (run / "logs" / "trainer.log").read_text()
    assert re.search(r"stage 4/5 \(sft\) → \S+stage-4-sft, model tiny\b", trainer_log), trainer_log[-3000:]
    assert re.search(r"stage 5/5 \(grpo\) → \S+stage-5-grpo, model \S+stage-4-sft/final\b", trainer_log)
    first, fourth = summary["stages"][0], summary["stages"][3]
    assert fourth["sft_loss_first"] > 4.0 and abs(fourth["sft_loss_first"] - first["sft_loss_first"]) < 0.5, fourth
    assert fourth["sft_loss_last"] < 0.5 * fourth["sft_loss_first"], fourth
    assert [r["step"] for r in read_jsonl(stage_dir(run, 4) / "metrics.jsonl")] == list(range(1, 41))

    # The stages that publish tasks kept their books.
    for i in (2, 3, 5):
        last = check_books(stage_dir(run, i))
        assert last["tasks/published"] > 0, last
    rs_last = check_books(stage_dir(run, 3))
    assert rs_last["tasks/published"] == rs["rs_prompts"] and rs_last["tasks/in_flight"] == 0, rs_last

    # The last GRPO stage: per-task metrics every step, and per-task held-out evaluations.
    metrics = read_jsonl(stage_dir(run, 5) / "metrics.jsonl")
    steps = [r for r in metrics if "train/loss" in r]
    assert len(steps) == trainer["steps"], metrics[-1:]
    for r in steps:
        assert sum(r[f"task/{t}/groups"] for t in TASKS) >= trainer["prompts_per_step"], r
        for t in TASKS:
            for name in ("reward_mean", "accuracy", "zero_variance_fraction"):
                assert f"task/{t}/{name}" in r, (t, name, r)
    evals = [r for r in metrics if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 6, 12], evals
    for r in evals:
        per_task = [r[f"eval/{t}/judged"] for t in TASKS]
        assert per_task == [trainer["eval_size"] // 2] * 2, r  # the eval file alternates add and sub
        overall = sum(r[f"eval/{t}/accuracy"] * r[f"eval/{t}/judged"] for t in TASKS) / sum(per_task)
        assert abs(overall - r["eval/accuracy"]) < 1e-9, r
    assert set(summary["per_task"]) == set(TASKS), summary.get("per_task")
