"""`grpo-trainer` refuses, at start-up, data its model's tokenizer cannot encode: one line naming the file, the
line and the character (exit 2), before anything trains. A multiplication task once trained to the end (exit 0) on
`1234=` for `12×34=`: the demo model's tokenizer dropped the character without a word."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo.common.net import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo.demo.model import build_model_folder

    return build_model_folder(tmp_path_factory.mktemp("demo") / "model")


def start_trainer(config: dict[str, object], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The trainer on free ports and a Redis nobody listens on: the data check comes before it is used."""
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "grpo.trainer", "--config", str(path), "--grpc-port", str(free_port()),
           "--http-port", str(free_port()), "--host", "127.0.0.1", "--output-dir", str(tmp_path / "out"),
           "--torch-threads", "1", "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--redis-outage-s", "1"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**env, "OMP_NUM_THREADS": "1"})


def write_rows(path: Path, rows: list[dict[str, str]]) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("where", ["grpo prompt", "sft stage response"])
def test_a_character_the_model_cannot_see_stops_the_trainer_at_start_up(
    tmp_path: Path, demo_model: Path, where: str
) -> None:
    train = write_rows(tmp_path / "train.jsonl", [{"prompt": "12*34=", "gold": "408"},
                                                  {"prompt": "12×34=" if where == "grpo prompt" else "56*2=", "gold": "112"}])  # fmt: skip
    config: dict[str, object] = {"model": str(demo_model), "train_data": train, "steps": 2, "max_new_tokens": 16}
    if where == "sft stage response":
        sft = write_rows(tmp_path / "sft.jsonl", [{"prompt": "12*34=", "response": "<answer>408</answer>"},
                                                  {"prompt": "12*3=", "response": "<think>12×3</think><answer>36</answer>"}])  # fmt: skip
        config["stages"] = [{"mode": "sft", "train_data": sft, "steps": 2}, {"mode": "grpo"}]
    done = start_trainer(config, tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    line = next(line for line in done.stderr.splitlines() if "invalid data" in line)
    if where == "grpo prompt":
        assert f"{train} line 2: the prompt holds '×' (U+00D7, column 3)" in line, line
    else:
        assert f"stage 1 (sft): {tmp_path / 'sft.jsonl'} line 2: the response holds '×' (U+00D7, column 10)" in line
    assert not (tmp_path / "out" / "checkpoints").exists() and not (tmp_path / "out" / "stage-1-sft").exists()
