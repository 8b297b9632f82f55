"""The real trainer CLI on several torchrun ranks (CPU, gloo; SFT mode, so no Redis): ZeRO-3's final model, staged
runs, resuming on another number of ranks, and the torch backend refused on several ranks."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from grpo.common.net import free_port

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

BIN = Path(sys.executable).parent


def sft_config(tmp: Path, **extra: Any) -> Path:
    """A tiny SFT run's config file (8 rows) writing to tmp/out."""
    data = tmp / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
                                        "response": f"<think>{i} + 1 = {i + 1}</think><answer>{i + 1}</answer>"}) + "\n"
                            for i in range(8)))  # fmt: skip
    config = {"mode": "sft", "train_data": str(data), "output_dir": str(tmp / "out"), "prompts_per_step": 4,
              "lr": 3e-3, "checkpoint_every": 2, "backend": "deepspeed", "zero_stage": 2, "host": "127.0.0.1",
              "grpc_port": free_port(), "http_port": free_port(), "torch_threads": 1, **extra}  # fmt: skip
    path = tmp / "trainer.json"
    path.write_text(json.dumps(config))
    return path


def trainer(config: Path, *args: str, ranks: int = 2, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`python -m grpo.trainer` on `ranks` torchrun processes (ranks=0: one plain process, no torchrun).

    A hang fails in `timeout` seconds. torchrun starts each rank in a session of its own, so the ranks are
    killed one by one (they hold the output pipe open: left alive, reading it would wait for ever)."""
    launcher = [str(BIN / "torchrun"), f"--nproc-per-node={ranks}", f"--master-port={free_port()}"]
    cmd = [*(launcher if ranks else [sys.executable]), "-m", "grpo.trainer", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "GRPO_TRAINER_CONFIG": str(config)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for child in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} hung for {timeout} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def rows(out_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def test_zero3_on_two_ranks_writes_the_final_model(tmp_path: Path) -> None:
    """Gathering the ZeRO-3 weights for final/ is collective: every rank takes part (rank 0 gathering alone hung).
    Then the same from the last checkpoint, as a trainer stopped before final/ does on restart."""
    config = sft_config(tmp_path, zero_stage=3, steps=2)
    first = trainer(config)
    assert first.returncode == 0, first.stdout[-4000:]
    final = tmp_path / "out" / "final"
    assert (final / "model.safetensors").is_file()
    shutil.rmtree(final)
    again = trainer(config)
    assert again.returncode == 0, again.stdout[-4000:]
    assert "the final model was never written" in again.stdout
    assert (final / "model.safetensors").is_file()


def test_staged_run_on_two_ranks(tmp_path: Path) -> None:
    """Two SFT stages on ZeRO-2: every rank keeps the process group between the stages (a follower that destroyed
    it waited at stage 2's rendezvous for a rank 0 that never came)."""
    config = sft_config(tmp_path, stages=[{"mode": "sft", "steps": 1}, {"mode": "sft", "steps": 1}])
    run = trainer(config)
    assert run.returncode == 0, run.stdout[-4000:]
    for stage in ("stage-1-sft", "stage-2-sft"):
        assert (tmp_path / "out" / stage / "final" / "model.safetensors").is_file(), stage


def test_resume_on_another_number_of_ranks(tmp_path: Path) -> None:
    """A ZeRO-2 checkpoint of 2 ranks resumed by one process: the weights and LR schedule load (AdamW's moments
    start afresh, with a warning) where DeepSpeed raised ZeRORuntimeException. The resumed step 3 sees the weights
    the uninterrupted run had: the same loss (computed before the update) and learning rate."""
    config = sft_config(tmp_path, steps=3, lr_schedule="cosine", warmup_steps=1)
    full = trainer(config)
    assert full.returncode == 0, full.stdout[-4000:]
    out = tmp_path / "out"
    expected = rows(out)[2]
    resumed = trainer(config, "--resume", str(out / "checkpoints" / "step-00000002"), ranks=0)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "saved on 2 rank(s) and this run has 1" in resumed.stdout
    got = rows(out)[2]
    assert got["step"] == 3
    assert got["sft/sft_loss"] == pytest.approx(expected["sft/sft_loss"], rel=1e-4)
    assert got["sft/grad_norm"] == pytest.approx(expected["sft/grad_norm"], rel=1e-3)
    assert got["sft/lr"] == pytest.approx(expected["sft/lr"], rel=1e-6)


def test_torch_backend_refuses_several_ranks(tmp_path: Path) -> None:
    """The torch backend under torchrun: every rank exits at start-up (code 2, one line naming the fix) before
    loading a model, where rank 1 crashed and rank 0 trained alone."""
    run = trainer(sft_config(tmp_path, backend="torch", steps=2), timeout=120)
    assert run.returncode != 0
    assert run.stdout.count("use --backend deepspeed to train on several ranks") == 2, run.stdout[-4000:]
    assert run.stdout.count("exitcode  : 2") + run.stdout.count("exitcode: 2") >= 1, run.stdout[-4000:]
    assert "Default process group has not been initialized" not in run.stdout
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
