"""The README's "Train your own task" example, run as written: its data files and stack file, extracted from the
README, through `cd mytask && grpo up -c stack.yaml` with real processes (Redis, reward, rollout, trainer). It must
train (both stages, every step, exit 0) and leave its outputs where the README says they go."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.readme_examples import README, own_task_example

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def where_things_go() -> str:
    """The README paragraph that says where a run's outputs go."""
    return README.read_text().split("**Where things go.**", 1)[1].split("\n\n", 1)[0]


def test_the_readme_example_trains_and_writes_where_the_readme_says(tmp_path: Path) -> None:
    files, command = own_task_example()
    assert set(files) == {"sft.jsonl", "train.jsonl", "eval.jsonl", "stack.yaml"}, files
    folder = tmp_path / "mytask"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    stack = yaml.safe_load(files["stack.yaml"])
    # `grpo` as a user has it on PATH: this interpreter's venv; its own cache, so the built-in model is built here.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "GRPO_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run = folder / "runs" / stack["run_id"]  # relative to the folder `grpo up` ran in, as the README says
    summary = json.loads((run / "summary.json").read_text())
    assert summary["grpo_steps"] == stack["trainer"]["steps"], summary
    assert [s["mode"] for s in summary["stages"]] == ["sft", "grpo"]
    assert summary["stages"][0]["steps"] == stack["trainer"]["stages"][0]["steps"]
    assert summary["eval_accuracy_before"] is not None and summary["eval_after_judged"] > 0, summary
    paragraph = where_things_go()
    plots = re.findall(r"`(\w+\.png)`", paragraph)
    assert len(plots) == 5 and "report.md" in paragraph
    for name in ("report.md", *plots):
        assert (run / name).stat().st_size > 0, name
    for stage in ("stage-1-sft", "stage-2-grpo"):
        for part in ("metrics.jsonl", "tensorboard", "checkpoints", "final/model.safetensors"):
            assert (run / stage / part).exists(), f"{stage}/{part}"
    for service in ("reward", "rollout-0", "trainer"):
        assert (run / "logs" / f"{service}.log").is_file() and (run / "config" / f"{service}.yaml").is_file()

    log = (run / "logs" / "trainer.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert "2 stages (1: sft; 2: grpo, preset grpo)" in log  # not "mode grpo, preset grpo" for the SFT stage
    pushes = re.findall(r"INFO grpo\.trainer\.pusher: pushed version (\d+) ", log)
    assert pushes and len(pushes) == len(set(pushes)), pushes  # one INFO line per pushed version
    assert seconds < 180, f"the README example took {seconds:.0f}s"
