"""An example trainer config, run as the README says (`grpo-trainer --config services/trainer/configs/...` from the
repository root, beside a reward service and a rollout replica as they start by default), trains on the shipped
addition task: its cold start makes answers right, every GRPO step trains on scored steps, and held-out accuracy
rises. Only the GRPO steps are cut short; the cold start runs as written (~3 minutes on 2 cores in all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.common.net import free_port
from grpo.local.procs import Supervisor
from grpo.local.stack import StackSpec, start_services

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
GRPO_STEPS = 8


def _run_example(tmp_path: Path, name: str) -> tuple[int, Path]:
    """The trainer on services/trainer/configs/<name>.yaml; the flags only give it the stack's addresses, a
    fresh output folder and fewer GRPO steps. Returns its exit code and output folder (its log is trainer.log)."""
    out = tmp_path / "run"
    with Supervisor(tmp_path / "logs") as sup:
        # The services' own defaults (the reward service has no prm_path), one torch thread each on a shared CI box.
        spec = StackSpec(run_id="example", run_dir=tmp_path / "stack", reward={"workers": 1},
                         rollout={"torch_threads": 1})  # fmt: skip
        state = start_services(sup, spec, with_trainer=False)
        cmd = [sys.executable, "-m", "grpo.trainer", "--config", f"services/trainer/configs/{name}.yaml",
               "--redis-url", state.redis_url, "--run-id", "example", "--output-dir", str(out),
               "--grpc-port", str(free_port()), "--http-port", str(free_port()), "--torch-threads", "1",
               "--resume", "never", "--steps", str(GRPO_STEPS)]  # fmt: skip
        with (tmp_path / "trainer.log").open("w") as log_file:
            done = subprocess.run(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, timeout=540, check=False,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    return done.returncode, out


def test_the_prm_example_config_learns_the_shipped_task(tmp_path: Path) -> None:
    """prm.yaml: the one whose failure was loudest (step scores from a PRM the reward service had no model for: every
    group failed, exit 1 after 3 steps), and the one that needs everything the others do plus a usable step check."""
    code, out = _run_example(tmp_path, "prm")
    log_tail = (tmp_path / "trainer.log").read_text()[-4000:]
    assert code == 0, log_tail
    summary = json.loads((out / "summary.json").read_text())
    assert [stage["mode"] for stage in summary["stages"]] == ["sft", "grpo"], summary["stages"]
    # After the cold start some answers are right (a random start gets none), so groups differ in reward ...
    assert summary["eval_accuracy_before"] >= 0.2, summary["eval_history"]
    # ... and GRPO improves on it.
    assert summary["eval_accuracy_after"] > summary["eval_accuracy_before"], summary["eval_history"]
    rows = [json.loads(line) for line in (out / "stage-2-grpo" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "train/loss" in r]
    assert len(trained) == GRPO_STEPS, log_tail  # no step without an update (all groups dropped or failed)
    assert all("train/step_score_mean" in r for r in trained)
    assert max(r["train/steps_per_completion"] for r in trained) > 3.0  # the scratchpad's columns and the answer
    assert rows[-1]["tasks/dropped/failed"] == 0 and rows[-1]["tasks/dropped/unscored"] == 0
