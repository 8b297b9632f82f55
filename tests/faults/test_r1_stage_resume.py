"""R1's whole recipe (`grpo up -c deploy/local/r1-quick.yaml`) with the trainer SIGKILLed once inside EACH of its five
stages, right after that stage's first checkpoint, and `grpo up` run again each time, as a user would: a killed
trainer stops the stack (exit 137), and the next `grpo up` (a fresh Redis, fresh replicas) resumes the stage from
its checkpoint. At the end every stage finished exactly once, every step of every stage is logged once, the books of
the stages that publish tasks (GRPO, rejection sampling) balance with each task resolved once, and the rejection-
sampling data holds no (prompt, sample) twice and nothing its filters refuse."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.support.polling import wait_until
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

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(3000)]
log = logging.getLogger(__name__)


def _checkpoints(folder: Path) -> list[str]:
    """The stage's checkpoints after step 0 (a rejection-sampling stage checkpoints its start too)."""
    root = folder / "checkpoints"
    return sorted(p.name for p in root.glob("step-*") if p.name != "step-00000000") if root.is_dir() else []


def _trainer(run: Path) -> psutil.Process | None:
    """The run's trainer process as `grpo up` recorded it (same PID and start time), once it is up."""
    state = run / "stack.json"
    if not state.is_file():
        return None
    for rec in json.loads(state.read_text())["processes"]:
        if rec["name"] == "trainer":
            try:
                proc = psutil.Process(int(rec["pid"]))
            except psutil.NoSuchProcess:
                return None
            return proc if abs(proc.create_time() - float(rec["create_time"])) < 0.01 else None
    return None


def _kill_in_stage(runs: Path, up_log: Path, index: int) -> int:
    """Start `grpo up`, SIGKILL its trainer as soon as stage `index` has written its first checkpoint, and wait for
    `grpo up` to stop the stack. Returns the step of the checkpoint the kill followed."""
    run, folder = runs / "r1-quick", stage_dir(runs / "r1-quick", index)
    up = grpo_up(runs, up_log)
    try:
        wait_until(lambda: _checkpoints(folder) and _trainer(run), 900, f"stage {index}'s first checkpoint",
                   every=0.02, stop=lambda: None if up.poll() is None else f"grpo up exited with {up.returncode}",
                   context=lambda: up_log.read_text()[-3000:])  # fmt: skip
        trainer = _trainer(run)
        assert trainer is not None
        trainer.send_signal(signal.SIGKILL)
        landed = int(_checkpoints(folder)[-1].removeprefix("step-"))
        assert up.wait(timeout=120) == 128 + signal.SIGKILL, up_log.read_text()[-3000:]
    finally:
        if up.poll() is None:
            up.kill()
    # Inside the stage: it had not finished (no outcome), so the next start must resume it, not skip it.
    assert not (folder / "stage.json").exists(), f"stage {index} finished before the kill (after step {landed})"
    return landed


def test_a_kill_in_each_stage_resumes_and_every_stage_finishes_once(tmp_path: Path) -> None:
    runs, up_log = tmp_path / "runs", tmp_path / "up.log"
    run = runs / "r1-quick"
    started = time.monotonic()
    landed: dict[int, int] = {}
    for index in range(1, 6):
        landed[index] = _kill_in_stage(runs, up_log, index)
        log.info("killed the trainer in stage %d (%s) after its checkpoint of step %d, %.0f s in", index,
                 MODES[index - 1], landed[index], time.monotonic() - started)  # fmt: skip
    up = grpo_up(runs, up_log)
    try:
        assert up.wait(timeout=1200) == 0, up_log.read_text()[-4000:]
    except subprocess.TimeoutExpired:
        up.kill()
        raise
    log.info("R1 quick recipe with 5 trainer kills: %.0f s in all", time.monotonic() - started)

    # Every stage finished once; each later start skipped the stages finished before it.
    trainer_log = (run / "logs" / "trainer.log").read_text()
    for i, mode in enumerate(MODES, 1):
        assert len(re.findall(rf"stage {i} \({mode}\) done: ", trainer_log)) == 1, mode
        assert len(re.findall(rf"stage {i} \({mode}\) finished earlier: ", trainer_log)) == 5 - i, mode
    summary = json.loads((run / "summary.json").read_text())
    assert [s["mode"] for s in summary["stages"]] == MODES, summary["stages"]

    # Each stage resumed from its checkpoint (not from scratch: "resumed at step") and logged each of its steps
    # once, in order. A kill right after a checkpoint can take that step's metrics row with it (a step's checkpoint
    # is written before its row, and the resumed run starts after it): that one step may be missing, no other.
    trainer = quick_trainer()
    assert len(re.findall(r"resumed at step [1-9]", trainer_log)) >= 5, trainer_log[-3000:]
    for i in range(1, 6):
        values = stage_values(trainer, i)
        steps = [r["step"] for r in read_jsonl(stage_dir(run, i) / "metrics.jsonl") if r["step"] > 0]
        expected = -(-values["rs_prompts"] // values["prompts_per_step"]) if i == 3 else values["steps"]
        assert steps == sorted(set(steps)) and steps[-1] == expected, (i, steps)
        assert set(range(1, expected + 1)) - set(steps) <= {landed[i]}, (i, landed[i], steps)

    # The books of each stage that publishes tasks balance, each task resolved once.
    for i in (2, 3, 5):
        last = check_books(stage_dir(run, i))
        log.info("stage %d books: %s", i, {k: v for k, v in last.items() if k.startswith("tasks/")})

    # The rejection-sampling data: no (prompt, sample) twice, nothing the filters refuse, counts as summarised.
    rows = check_rs_data(stage_dir(run, 3), stage_values(trainer, 3), rows_by_id(ROOT / trainer["train_data"]))
    assert rows
