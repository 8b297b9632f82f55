"""A wrong --model is one line and exit code 2, before any server starts or data loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("prog", "model", "expected"),
    [
        ("grpo-rollout", "/nowhere/model", "no such model folder or hub id: '/nowhere/model'"),
        ("grpo-trainer", "/nowhere/model", "no such model folder or hub id: '/nowhere/model'"),
        ("grpo-trainer", "nobody/no-such-model", "'nobody/no-such-model' is not a local folder, and its config.json"),
    ],
)
def test_a_wrong_model_is_one_line_before_anything_starts(prog: str, model: str, expected: str, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1?", "task_type": "math", "gold": "2"}\n')
    # The trainer's data file exists and its redis is unreachable: the model must be the first thing checked.
    extra = ["--train-data", str(data), "--redis-url", "redis://127.0.0.1:1/0"] if prog == "grpo-trainer" else []
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}  # this machine has no hub; offline answers at once
    proc = subprocess.run(
        [str(BIN / prog), "--model", model, "--grpc-port", "0", "--http-port", "0", *extra],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{prog}: invalid settings: model: {expected}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "listening" not in proc.stderr  # no server was started
