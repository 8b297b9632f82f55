"""`grpo demo --task tool --quick` end to end on CPU: the tiny model calls the python tool (the reward service's
sandbox) in every episode, and GRPO over those episodes lifts held-out accuracy with the tool by a clear margin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A fresh cold start and 40 GRPO steps: 9 minutes on 2 cores (two at once), 25 under a load average of 6; past the
# 600 s default.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2200)]

# The quick profile's gain (the mean of its last three evaluations against step 0), measured: +18 points at 30 steps
# from a 36 % cold start (docs/demo.md, "Tool use"); from this machine's 30 % cold start 30 steps gave +3.8 to +7.8,
# 40 steps +15.7 and +16.8. The test asks for well under that.
MIN_GAIN = 0.10


def test_tool_demo_learns_to_use_the_tool_through_all_services(tmp_path: Path) -> None:
    env = {**os.environ, "GRPO_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "grpo.cli", "--runs-dir", str(tmp_path / "runs"), "demo", "--task", "tool",
           "--quick", "--no-live", "--run-id", "tool"]  # fmt: skip
    with (tmp_path / "demo.log").open("w") as out:
        done = subprocess.run(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=2100,
                              check=False)  # fmt: skip
    log_tail = (tmp_path / "demo.log").read_text()[-4000:]
    assert done.returncode == 0, log_tail
    run_dir = tmp_path / "runs" / "tool"
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "train/loss" in r]
    assert trained, log_tail
    # The episodes call the tool (sampled at T=1 a few skip it; greedy ones always call it), the sandbox runs the
    # calls (results come back, mostly without error) and their tokens are in the episodes, masked ...
    calls = [r["rollout/tool_calls_mean"] for r in trained]
    assert sum(calls) / len(calls) >= 0.8 and min(calls) >= 0.6, calls
    success = [r["rollout/tool_success_rate"] for r in trained]
    assert sum(success) / len(success) >= 0.8, success
    assert all(0.2 < r["rollout/env_token_share"] < 0.6 for r in trained)
    evals = [r for r in rows if "eval/accuracy" in r]
    assert all(r["eval/tool_calls_mean"] >= 0.95 and r["eval/tool_success_rate"] >= 0.9 for r in evals), evals
    # ... the cold start left room (the trainer's step-0 evaluation, through the services) ...
    assert 0.1 <= summary["eval_accuracy_before"] <= 0.7, summary["eval_history"]
    # ... and GRPO lifted held-out accuracy with the tool.
    assert summary["eval_accuracy_gain"] >= MIN_GAIN, summary["eval_history"]
    # Without the tool the same model cannot multiply (measured in-process on held-out problems).
    measures = summary["in_process"]
    assert measures["final"]["accuracy_without_tool"] <= 0.05, measures
    assert measures["final"]["accuracy_with_tool"] > measures["sft"]["accuracy_with_tool"], measures
