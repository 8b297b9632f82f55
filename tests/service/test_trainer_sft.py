"""`grpo-trainer --mode sft` as a real process: the cold-start SFT lowers the response loss and exports a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from grpo.common.net import free_port


def test_sft_mode_learns_and_exports(tmp_path: Path) -> None:
    rows = [
        {"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "gold": str(i + 1),
         "response": f"<think>{i} + 1 = {i + 1}</think><answer>{i + 1}</answer>"}
        for i in range(8)
    ]  # fmt: skip
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "grpo.trainer", "--mode", "sft", "--train-data", str(data), "--output-dir", str(out),
           "--steps", "12", "--prompts-per-step", "4", "--lr", "3e-3", "--checkpoint-every", "5",
           "--grpc-port", str(free_port()), "--http-port", str(free_port()), "--host", "127.0.0.1",
           "--torch-threads", "1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    losses = [json.loads(line)["sft/sft_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 12 and losses[-1] < 0.7 * losses[0], losses
    assert (out / "final" / "model.safetensors").is_file() and (out / "final" / "tokenizer.json").is_file()
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == [
        "step-00000005",
        "step-00000010",
        "step-00000012",
    ]


def test_bad_settings_exit_2_naming_the_field(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "grpo.trainer", "--train-data", str(tmp_path / "x.jsonl"),
                           "--max-staleness", "-2"], capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert b"max_staleness" in done.stderr
