"""A real staged run (issue 38) on the tiny model: `model: base` starts a stage from the run's model, not the
previous stage's; a stage without `model` continues the previous one; a weighted train_data list mixes its files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_model_base_restarts_from_the_runs_model_and_previous_continues(tmp_path: Path) -> None:
    sft = write(tmp_path / "sft.jsonl", [
        {"prompt": f"What is {i} + 1?", "gold": str(i + 1), "response": f"<think>{i} + 1 = {i + 1}</think>"
         f"<answer>{i + 1}</answer>"} for i in range(8)])  # fmt: skip
    chat = write(tmp_path / "chat.jsonl", [
        {"prompt": f"Say {i}.", "task_type": "chat", "response": f"<answer>{i}</answer>"} for i in range(4)])  # fmt: skip
    stages = [
        {"mode": "sft"},
        {"mode": "sft", "model": "base"},  # the same data, seed and steps from the same weights: the same losses
        {"mode": "sft", "train_data": [{"data": str(sft), "weight": 3}, str(chat)]},  # from stage 2's final model
    ]
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "grpo.trainer", "--mode", "sft", "--train-data", str(sft), "--output-dir", str(out),
           "--steps", "4", "--prompts-per-step", "4", "--lr", "3e-3", "--grpc-port", "0", "--http-port", "0",
           "--host", "127.0.0.1", "--torch-threads", "1", "--stages", json.dumps(stages)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]

    def losses(i: int) -> list[float]:
        rows = (out / f"stage-{i}-sft" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(row)["sft/sft_loss"] for row in rows]

    first, base, previous = losses(1), losses(2), losses(3)
    assert len(first) == len(base) == len(previous) == 4
    assert base == pytest.approx(first, rel=1e-6), "stage 2 (model: base) did not start from the run's model"
    assert previous[0] < 0.8 * first[0], "stage 3 did not continue from stage 2's trained model"
    assert f"stage 3/3 (sft) → {out / 'stage-3-sft'}, model {out / 'stage-2-sft' / 'final'}" in done.stderr
    assert f"{sft} 9 (75.0 %, 8 rows), {chat} 3 (25.0 %, 4 rows)" in done.stderr  # the mixture's draws per epoch
    summary = json.loads((out / "summary.json").read_text())
    assert [s["mode"] for s in summary["stages"]] == ["sft", "sft", "sft"]
