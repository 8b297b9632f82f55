"""Multi-turn episodes through `grpo up -c stack.yaml`, as a user runs them: Redis, the reward service, a rollout
replica and the trainer as real processes, the tool model (tests/support/tool_model.py: `<code>print(6*7)</code>`,
then `<answer>42</answer>` after the result) on a trainer config with `tools: [python]` and `python_session: true`.
Every episode's call runs in the reward service's sandbox, the books balance, and the greedy evaluation (the tool
model's two-call prompt: `x = 6*7`, then `print(x)`) answers from the second call's output, which only a session
can give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.compose_episode import GROUP_SIZE, PROMPTS_PER_STEP, STEPS, TRAINER, episode_files

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_grpo_up_runs_episodes_whose_tool_calls_run_in_the_sandbox(tmp_path: Path) -> None:
    model, folder = episode_files(tmp_path)
    trainer = {**TRAINER, "model": str(model), "train_data": "train.jsonl", "eval_data": "eval.jsonl"}
    stack = {"run_id": "episodes", "rollout": {"model": str(model), "torch_threads": 1}, "trainer": trainer}
    (folder / "stack.yaml").write_text(yaml.safe_dump(stack, sort_keys=False))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["grpo", "up", "-c", "stack.yaml"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run = folder / "runs" / "episodes"
    rows = [json.loads(line) for line in next(run.rglob("metrics.jsonl")).read_text().splitlines()]
    steps = [r for r in rows if "rollout/tool_calls_mean" in r]
    assert len(steps) == STEPS, rows
    for r in steps:  # sampled at T=1: most episodes call the tool; the calls ran (a broken program is a result)
        assert r["rollout/tool_calls_mean"] >= 0.5 and r["rollout/tool_timeouts"] == 0, r
        assert 0.0 < r["rollout/env_token_share"] < 1.0, r  # the result's tokens are in the episode, masked out
    # Most calls succeed, over both steps: T=1 samples a broken program now and then (0.71-1.0 of one step's ~7
    # calls here, and 3 of 7 once in CI), so one step's share alone is a coin.
    calls = [r["rollout/tool_calls_mean"] * PROMPTS_PER_STEP * GROUP_SIZE for r in steps]
    succeeded = sum(n * r["rollout/tool_success_rate"] for n, r in zip(calls, steps, strict=True))
    assert succeeded >= 0.5 * sum(calls), steps
    evals = [r for r in rows if "eval/tool_calls_mean" in r]
    assert evals, rows
    for r in evals:  # greedy: x = 6*7 ran, then print(x) printed 42, and the model answered from <output>42</output>
        assert (r["eval/tool_calls_mean"], r["eval/tool_success_rate"], r["eval/accuracy"]) == (2.0, 1.0, 1.0), r
    assert rows[-1]["tasks/balanced"] == 1.0, rows[-1]
