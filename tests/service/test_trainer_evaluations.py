"""Evaluations a stop or a crash cut short: logged without an accuracy, evaluated again on resume, one row a step.

In-process GrpoRun (as the service runs it) against a real rollout replica and reward service."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from grpo.trainer.config import TrainerSettings
from grpo.trainer.control import RunControl
from grpo.trainer.report import read_metrics, summarize
from grpo.trainer.service import final_evaluation_lost, run_mode
from tests.support.trainer_proc import trainer_config, write_data

pytestmark = pytest.mark.slow
EVAL_SIZE = 32  # long enough an evaluation (seconds) for a stop to land inside it


def settings(tmp_path: Path, run: str, redis_url: str, **extra: Any) -> TrainerSettings:
    eval_data = write_data(tmp_path / "eval.jsonl", EVAL_SIZE, offset=100)
    config = json.loads(trainer_config(tmp_path, run, redis_url, eval_data=str(eval_data), eval_size=EVAL_SIZE,
                                       **extra).read_text())  # fmt: skip
    return TrainerSettings(**config)


def start(s: TrainerSettings, control: RunControl | None = None) -> RunControl:
    """One trainer start as the service makes it (run_mode: resume, final model, the GRPO loop)."""
    control = control or RunControl(s.run_id, s.steps)
    run_mode(s, control, CollectorRegistry())
    return control


def stop_in_first_evaluation(control: RunControl, seen: list[Any]) -> threading.Thread:
    """The Stop RPC (SIGTERM does the same) the moment the status says an evaluation runs; `seen` gets that
    status."""

    def watch() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            status = control.status()
            if status.phase == "eval":
                seen.append(status)
                control.request_stop()
                return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_stop_in_the_baseline_evaluation_logs_step_0_once_and_before_is_whole(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """Stopped in the step-0 baseline: it kept a step-0 checkpoint, and the restart evaluated and logged step 0 a
    second time, the summary taking the first, partial one as "before"."""
    rollout_for("base")
    s = settings(tmp_path, "base", redis_url, steps=2, checkpoint_every=10)
    control, seen = RunControl(s.run_id, s.steps), []
    watcher = stop_in_first_evaluation(control, seen)
    start(s, control)
    watcher.join(timeout=5)
    (cut,) = read_metrics(s.output_dir / "metrics.jsonl")
    assert control.status().phase == "stopped" and cut["step"] == 0
    assert (s.output_dir / "checkpoints" / "step-00000000").is_dir()

    assert start(s).status().phase == "done"
    rows = read_metrics(s.output_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert cut.get("eval/stopped") == 1 and "eval/accuracy" not in cut  # the cut-short one: counts, no accuracy
    assert rows[0]["eval/stopped"] == 0 and rows[0]["eval/missing"] == 0
    summary = summarize(rows, eval_before=None, wall_seconds=1.0)
    assert summary["eval_accuracy_before"] == rows[0]["eval/accuracy"]
    assert summary["eval_before_problems"] == EVAL_SIZE


def test_a_stop_in_the_final_evaluation_leaves_it_owed_and_the_restart_evaluates_again(
    tmp_path: Path, redis_url: str, rollout_for: Any
) -> None:
    """A final evaluation cut short counted as done: final/ written, its accuracy over the few groups that came.
    Now it reports no accuracy, final/ waits, and the restart evaluates the checkpoint and replaces the row."""
    rollout_for("final")
    s = settings(tmp_path, "final", redis_url, steps=2, checkpoint_every=10, eval_before_train=False)
    control, seen = RunControl(s.run_id, s.steps), []
    watcher = stop_in_first_evaluation(control, seen)
    start(s, control)
    watcher.join(timeout=5)
    # the status names the step and version being evaluated (it said step 1 and the version before the update)
    assert seen and seen[0].step == 2 and seen[0].policy_version == read_metrics(s.output_dir / "metrics.jsonl")[-1][
        "policy_version"]  # fmt: skip
    rows = read_metrics(s.output_dir / "metrics.jsonl")
    assert control.status().phase == "stopped" and not (s.output_dir / "final").exists()
    assert [r["step"] for r in rows] == [1, 2] and "eval/accuracy" not in rows[-1] and rows[-1]["eval/stopped"] == 1
    assert rows[-1]["eval/missing"] > 0 and final_evaluation_lost(s)

    assert start(s).status().phase == "done" and (s.output_dir / "final").is_dir()
    rows = read_metrics(s.output_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # one row for step 2: the training metrics and the new evaluation
    assert rows[-1]["eval/completed"] == EVAL_SIZE and 0.0 <= rows[-1]["eval/accuracy"] <= 1.0
    assert rows[-1]["eval/stopped"] == 0 and "tasks/published" in rows[-1]


def test_a_crash_in_a_periodic_evaluation_is_made_good_on_resume(
    tmp_path: Path, redis_url: str, rollout_for: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed in step 2's evaluation, after step 2's checkpoint (eval_every = checkpoint_every): the disk holds that
    checkpoint and no row for step 2. The resume started at step 3, and step 2 had no row for good."""
    rollout_for("crash")
    s = settings(tmp_path, "crash", redis_url, steps=4, checkpoint_every=2, eval_every=2, eval_before_train=False)
    start(s)
    out = s.output_dir
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the disk as the kill in step 2's evaluation left it
    shutil.rmtree(out / "final")
    shutil.rmtree(out / "checkpoints" / "step-00000004")
    (out / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")

    with caplog.at_level("WARNING", logger="grpo.trainer.run"):
        assert start(s).status().phase == "done"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[1]["eval/completed"] == EVAL_SIZE and 0.0 <= rows[1]["eval/accuracy"] <= 1.0
    assert "train/loss" not in rows[1] and "tasks/published" not in rows[1]  # lost with the trainer, and said so
    assert "step 2's metrics and evaluation were lost" in caplog.text
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [2, 4]
