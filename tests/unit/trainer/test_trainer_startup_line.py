"""The trainer's start-up line says what will run: an SFT run (or stage) names no preset, and a staged run names
each stage's own mode instead of the top-level default (an SFT stage once logged `mode grpo, preset grpo`)."""

from __future__ import annotations

from pathlib import Path

from grpo.trainer.config import TrainerSettings
from grpo.trainer.service import run_description


def settings(tmp_path: Path, **values: object) -> TrainerSettings:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "gold": "2", "response": "2"}\n')
    return TrainerSettings(train_data=data, output_dir=tmp_path / "run", **values)  # type: ignore[arg-type]


def test_a_plain_run_names_its_mode_and_only_grpo_a_preset(tmp_path: Path) -> None:
    assert run_description(settings(tmp_path, mode="sft")) == "mode sft"
    assert run_description(settings(tmp_path, preset="dapo")) == "mode grpo, preset dapo"


def test_a_staged_run_names_each_stage(tmp_path: Path) -> None:
    staged = settings(tmp_path, stages=[{"mode": "sft", "steps": 3}, {"mode": "grpo", "preset": "dr_grpo"}])
    assert run_description(staged) == "2 stages (1: sft; 2: grpo, preset dr_grpo)"
    inherited = settings(tmp_path, preset="dapo", stages=[{"mode": "sft"}, {"mode": "grpo"}])
    assert run_description(inherited) == "2 stages (1: sft; 2: grpo, preset dapo)"
